"""The defects reviews found after the first mutants were written (carries in flight,
joined blocks left open, nested and late commits, interrupted publishes, the order of a
delete), each a context manager that patches the library for a with block;
:data:`~atomic_ckpt.testing.mutants.API_MUTANTS` names them."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import CommitStateError
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import joining as _joining
from atomic_ckpt.testing.defects import patched

__all__ = ["LATER_DEFECTS"]


@contextlib.contextmanager
def _carry_not_counted() -> Iterator[None]:
    """A carry in flight does not count as a joined block: a publish begun while another
    thread's carry runs does not wait, and commits its file under the private waiting
    name (or without it)."""

    @contextlib.contextmanager
    def adding(self: Any, what: str) -> Iterator[None]:
        self._require_open(what)
        yield

    with patched(_joining.JoinedBlocks, "_adding", adding):
        yield


@contextlib.contextmanager
def _open_join_in_own_thread_ignored() -> Iterator[None]:
    """The publish waits only for blocks joined from other threads: a joined block of its
    own thread still open (a suspended generator) is not counted, and the commit
    publishes without the part that block has yet to finish."""

    def seal(self: Any) -> None:
        self._require_open("publish")
        me = threading.get_ident()
        with self._cond:
            if self._sealed:
                return
            self._cond.wait_for(
                lambda: not any(t != me for t in self._joiners) or self._state != "open",
                self.join_timeout,
            )
            if self._state == "open":
                self._sealed = True
                return
        self._require_open("publish")

    with patched(_joining.JoinedBlocks, "seal", seal):
        yield


@contextlib.contextmanager
def _interrupted_publish_left_open() -> Iterator[None]:
    """An exception interrupting the publish's wait for a joined block (Ctrl-C) propagates
    without aborting the commit: its staging dir, lock and registration stay (the
    interrupt handler's save of the step is then refused as nested in it)."""
    real = _joining.JoinedBlocks.seal

    def seal(self: Any) -> None:
        self._require_open("publish")
        with self._cond:
            if self._sealed:
                return
            if not self._joiners.get(threading.get_ident()):
                self._cond.wait_for(
                    lambda: not self._joiners or self._state != "open", self.join_timeout
                )
            if self._state == "open" and not self._joiners:
                self._sealed = True
                return
        real(self)  # the refusals, as the library words them

    with patched(_joining.JoinedBlocks, "seal", seal):
        yield


@contextlib.contextmanager
def _open_join_blames_publish() -> Iterator[None]:
    """A commit whose block ends inside a joined block of its thread (a suspended
    generator) is refused with the old message, blaming a publish made from inside the
    block: it names neither the generator nor what to do about it."""
    real = _joining.JoinedBlocks.seal

    def seal(self: Any) -> None:
        try:
            real(self)
        except CommitStateError as exc:
            if "in this thread is still open" not in str(exc):
                raise
            raise CommitStateError(
                f"cannot publish the commit of {self.name}: it is published from inside a "
                "block that joined it (that block would wait for itself): publish it after "
                "that block ends. Nothing was published",
                path=self.path,
                step=self._step,
            ) from None

    with patched(_joining.JoinedBlocks, "seal", seal):
        yield


@contextlib.contextmanager
def _nested_commit_not_refused() -> Iterator[None]:
    """A commit of a step inside the block of an open commit of that step, without
    ``join=True``, is not refused: it publishes its part alone, which the outer commit
    then replaces (a crash between leaves the part as the checkpoint)."""
    with patched(_begin, "refuse_nested", lambda root, name, step: None):
        yield


@contextlib.contextmanager
def _distributed_block_not_marked() -> Iterator[None]:
    """``distributed_commit``'s rank-0 commit is not marked the commit of this thread: a
    ``commit()`` of the step nested in it (no ``join=True``) is not refused, publishes its
    part, and the distributed commit then replaces it. (Since a bare handle counts as its
    opener's, clearing the block is not enough: the opener is forgotten too, as if the
    handle were another thread's save.)"""
    from atomic_ckpt.distributed import _commit as _dcommit

    real = _dcommit._begin

    def begin(*args: Any, **kwargs: Any) -> Any:
        commit, path = real(*args, **kwargs)
        if commit is not None:
            commit._block = None
            commit._opener = -1  # no thread's ident: refuse_nested finds no commit of its own
        return commit, path

    with patched(_dcommit, "_begin", begin):
        yield


@contextlib.contextmanager
def _rank0_one_block_per_step() -> Iterator[None]:
    """The open ``rank0_commit`` blocks are recorded one per step: a second thread's block
    of the step overwrites the first's record, and the block that ends second finds none
    (KeyError: its save aborted)."""
    from atomic_ckpt.distributed import _commit as _dcommit

    @contextlib.contextmanager
    def open_rank0(key: tuple[str, int | str], path: Path | None) -> Iterator[Any]:
        opened = _dcommit._Opened(path)
        with _dcommit._RANK0_LOCK:
            _dcommit._OPEN_RANK0[key] = [opened]
        try:
            yield opened
        finally:
            with _dcommit._RANK0_LOCK:
                del _dcommit._OPEN_RANK0[key]

    with patched(_dcommit, "_open_rank0", open_rank0):
        yield


@contextlib.contextmanager
def _late_join_commits_alone() -> Iterator[None]:
    """A join from another thread after the commit it names ended (aborted, or published
    and pruned) finds nothing open and commits its one part alone as the checkpoint."""

    def find_join(root: Any, name: str, step: int | None) -> Any:
        for commit in _joining._live(root.path, name):
            if commit._pid == os.getpid() and commit.state == "open":
                return commit
        return None

    with patched(_joining, "find_join", find_join):
        yield


@contextlib.contextmanager
def _delete_unlinks_not_durable() -> Iterator[None]:
    """A delete unlinks the aliases and the best pointer naming a step, then renames the
    step aside, with no root fsync between: a filesystem that does not keep a directory's
    changes in order may keep the rename and lose the unlinks (a dangling pointer)."""
    real_move, real_remove = _delete.move_aside, _delete.remove_aliases

    def remove_aliases(root: Any, names: set[str]) -> list[Path]:
        real_remove(root, names)
        return []  # so move_aside does not fsync the root for them

    def move_aside(root: Any, paths: list[Path], *, unlinked: bool = False) -> Any:
        return real_move(root, paths, unlinked=False)

    with (
        patched(_delete, "remove_aliases", remove_aliases),
        patched(_delete, "move_aside", move_aside),
    ):
        yield


LATER_DEFECTS = {
    "carry_in_flight_not_waited": _carry_not_counted,
    "open_join_in_own_thread_ignored": _open_join_in_own_thread_ignored,
    "open_join_blames_publish": _open_join_blames_publish,
    "interrupted_publish_left_open": _interrupted_publish_left_open,
    "nested_commit_not_refused": _nested_commit_not_refused,
    "distributed_nested_not_refused": _distributed_block_not_marked,
    "rank0_one_block_per_step": _rank0_one_block_per_step,
    "late_join_commits_alone": _late_join_commits_alone,
    "delete_unlinks_not_durable": _delete_unlinks_not_durable,
}
