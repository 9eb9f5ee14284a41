"""A handle of ``begin(step)`` held without a ``with`` block is open in the thread that
began it until it is published or aborted: a second commit of its step (or name) begun
in that thread meanwhile, without ``join=True``, is refused before it stages anything,
exactly as one nested in a ``with`` block of the step is, instead of publishing its part
alone and then being replaced by the handle's publish (the checkpoint published twice,
each time with only part of the save). ``join=True`` adds to the handle's commit; a
handle begun in another thread is another whole save (the last to promote wins)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from treeutil import contents, write

from atomic_ckpt import CheckpointDir, Commit, CommitStateError

Opener = Callable[[CheckpointDir, int], AbstractContextManager[Path]]


@contextlib.contextmanager
def _with_begin(c: CheckpointDir, s: int) -> Iterator[Path]:
    with c.begin(s) as handle:
        yield handle.path


@contextlib.contextmanager
def _bare_begin(c: CheckpointDir, s: int) -> Iterator[Path]:
    handle = c.begin(s)
    try:
        yield handle.path
    except BaseException as exc:
        handle.abort(exc)
        raise
    handle.publish()


INNER: dict[str, Opener] = {
    "commit": lambda c, s: c.commit(s),
    "with-begin": _with_begin,
    "bare-begin": _bare_begin,
    "amend": lambda c, s: c.amend(s),
}


def _leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if ".tmp-" in n)


def _promotions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the publishes that reach the promotion (one entry per promoted commit)."""
    seen: list[str] = []
    real = Commit._protocol

    def counted(self: Commit, *args: object, **kwargs: object) -> object:
        out = real(self, *args, **kwargs)  # type: ignore[arg-type]
        seen.append(self.name)
        return out

    monkeypatch.setattr(Commit, "_protocol", counted)
    return seen


@pytest.mark.parametrize("inner", INNER, ids=str)
def test_a_commit_of_the_step_inside_an_open_bare_handle_is_refused_naming_join(
    ckpts: CheckpointDir, inner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``h = begin(5)``; then ``commit(5)`` (or begin, amend) in the same thread without
    join=True: refused with CommitStateError naming join=True, nothing staged or
    published by it; ``h.publish()`` then publishes the step once, with all its files."""
    if inner == "amend":  # an amend needs a committed step
        with ckpts.commit(5) as path:
            write(path, {"old.bin": b"o"})
    promoted = _promotions(monkeypatch)
    handle = ckpts.begin(5)
    write(handle.path, {"a.bin": b"a"})
    before = _leftovers(ckpts.root)
    with (
        pytest.raises(CommitStateError, match="join=True") as refused,
        INNER[inner](ckpts, 5) as path,
    ):
        write(path, {"b.bin": b"b"})
    assert "begin(5)" in str(refused.value)  # it names the open handle
    assert _leftovers(ckpts.root) == before
    assert promoted == []  # the refused commit published nothing
    write(handle.path, {"c.bin": b"c"})
    handle.publish()
    assert promoted == ["5"]
    assert contents(ckpts.verify(5).path) == {"a.bin": b"a", "c.bin": b"c"}
    assert _leftovers(ckpts.root) == []


def test_a_named_commit_inside_an_open_bare_named_handle_is_refused(
    ckpts: CheckpointDir,
) -> None:
    """The same for ``begin_named`` and ``commit_named``: refused, the handle finishes whole."""
    handle = ckpts.begin_named("interrupted")
    write(handle.path, {"a.bin": b"a"})
    with (
        pytest.raises(CommitStateError, match="join=True"),
        ckpts.commit_named("interrupted") as path,
    ):
        write(path, {"b.bin": b"b"})
    assert ckpts.named() == []
    handle.finish()
    assert contents(ckpts.get_named("interrupted").path) == {"a.bin": b"a"}


def test_a_joined_commit_inside_an_open_bare_handle_is_part_of_it(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``commit(5, join=True)`` inside an open handle adds to it: one publish, both parts."""
    promoted = _promotions(monkeypatch)
    handle = ckpts.begin(5)
    write(handle.path, {"a.bin": b"a"})
    with ckpts.commit(5, join=True) as path:
        write(path, {"b.bin": b"b"})
    assert promoted == []
    handle.publish()
    assert promoted == ["5"]
    assert contents(ckpts.verify(5).path) == {"a.bin": b"a", "b.bin": b"b"}


def test_a_handle_begun_in_another_thread_is_another_whole_save(ckpts: CheckpointDir) -> None:
    """A handle open in another thread does not refuse this thread's commit of the step:
    two whole saves, each committed, the last to promote wins (as for two threads'
    ``with`` blocks)."""
    begun = threading.Event()
    go = threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            handle = ckpts.begin(5)
            write(handle.path, {"t.bin": b"t"})
            begun.set()
            assert go.wait(60), "the main thread never committed"
            handle.publish()
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)
            begun.set()

    thread = threading.Thread(target=other)
    thread.start()
    assert begun.wait(60)
    with ckpts.commit(5) as path:
        write(path, {"m.bin": b"m"})
    assert contents(ckpts.verify(5).path) == {"m.bin": b"m"}
    go.set()
    thread.join(60)
    assert errors == []
    assert contents(ckpts.verify(5).path) == {"t.bin": b"t"}


@pytest.mark.parametrize("end", ["publish", "abort"])
def test_once_the_handle_ended_the_step_commits_again(ckpts: CheckpointDir, end: str) -> None:
    """After ``publish()`` or ``abort()`` of the handle, a commit of its step in the same
    thread is an ordinary new save."""
    handle = ckpts.begin(5)
    write(handle.path, {"a.bin": b"a"})
    getattr(handle, end)()
    with ckpts.commit(5) as path:
        write(path, {"b.bin": b"b"})
    assert contents(ckpts.verify(5).path) == {"b.bin": b"b"}
