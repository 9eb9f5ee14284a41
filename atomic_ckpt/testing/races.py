"""Actions of the model check for the threads and nestings later reviews found: a carry
still in flight in another thread when the block ends, a joined block left open in a
suspended generator, a commit of the same step nested without ``join=True`` (in
``ckpts.commit`` and in ``distributed_commit``), two threads saving one step with
``rank0_commit`` at once, a block joining from another thread after the commit it names
was aborted, and a publish interrupted (Ctrl-C) while it waits for a joined block.

Each is a pair (``run`` on a :class:`~atomic_ckpt.CheckpointDir`, ``apply`` to a
:class:`~atomic_ckpt.testing.model.RootModel`) like those of
:mod:`atomic_ckpt.testing.actions`; :mod:`atomic_ckpt.testing.alphabet` names them.
``distributed_nested`` and ``rank0_threads`` import torch.distributed when they run, so
importing this module does not. Where a race has to be made to happen (a carry in flight
as the block ends, two blocks open at once), the action holds its threads on events,
never on a sleep.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Mapping
from typing import Any

from atomic_ckpt import CheckpointDir, CommitStateError
from atomic_ckpt._core.l2_syscalls import share as _share
from atomic_ckpt.testing.actions import PART, A, B, Boom, _commit, _write
from atomic_ckpt.testing.defects import patched
from atomic_ckpt.testing.model import Refused, RootModel, Saved
from atomic_ckpt.testing.parts import CARRY_SOURCE, Apply, Run, _rank0

__all__ = ["RACES", "Interrupted"]


class _Watched(threading.Condition):
    """A commit's condition that sets ``blocked`` when a thread waits on it (a publish
    waiting for the blocks joined to it: for the carry in flight)."""

    def __init__(self, blocked: threading.Event) -> None:
        super().__init__()
        self.blocked = blocked

    def wait(self, timeout: float | None = None) -> bool:
        self.blocked.set()
        return super().wait(timeout)


def carry_thread(c: CheckpointDir) -> None:
    """A loader thread carries step 1's model.bin into the open commit of step 3 and is
    still in the carry (its file shared at its private waiting name) when the main
    thread's block ends: the publish waits for the carry and puts the file at its name,
    never the waiting name. Where step 1 has no model.bin nothing is carried (the loader
    looks first) and step 3 holds the block's part alone.

    The carry is held (on an event, after its file is shared) until the publish waits for
    it, or, where the publish does not wait, until the publish has ended: the race the
    review found, made to happen every time."""
    wanted = 1 in c.steps() and (c.path_of(1) / CARRY_SOURCE).is_file()
    in_flight, release = threading.Event(), threading.Event()
    got: list[object] = []
    real = _share.share_file

    def held(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        in_flight.set()
        if not release.wait(60):
            raise AssertionError("neither waited for nor published in 60 s")
        return made

    def load(commit: Any) -> None:
        try:
            got.append(commit.carry(CARRY_SOURCE, from_=1))
        except BaseException as exc:  # raised by the action below, after the publish
            got.append(exc)
            in_flight.set()

    worker = None
    try:
        with patched(_share, "share_file", held), c.begin(3) as commit:
            commit._cond = _Watched(release)  # nothing waits on it yet
            _write(commit.path, PART)
            if wanted:
                worker = threading.Thread(target=load, args=(commit,))
                worker.start()
                if not in_flight.wait(60):
                    raise AssertionError("the carry never reached its file")
    finally:
        release.set()
        if worker is not None:
            worker.join()
    if got and isinstance(got[0], BaseException):
        raise got[0]


def apply_carry_thread(m: RootModel) -> None:
    source = m.steps.get(1)
    carried = {k: v for k, v in source.files if k == CARRY_SOURCE} if source else {}
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of({**carried, **PART})


def join_generator(c: CheckpointDir) -> None:
    """A generator's joined block is suspended (it wrote its part and yielded) when the
    commit's block ends: the commit is refused, CommitStateError naming the generator,
    nothing published (the part is not finished); the generator is closed after."""

    def part() -> Generator[None, None, None]:
        with c.commit(3, join=True) as q:
            _write(q, PART)
            yield
            _write(q, {"part2.bin": b"Q" * 8})

    gen = part()
    try:
        with c.commit(3) as p:
            _write(p, A)
            next(gen)
    finally:
        gen.close()


def commit_nested(c: CheckpointDir) -> None:
    """A commit of step 3 inside the block of a commit of step 3 (no ``join=True``) is
    refused before it stages anything; the caller swallows the refusal and the outer
    commit publishes its own save. Never is the inner part published, even for a moment."""
    with c.commit(3) as p:
        _write(p, A)
        try:
            with c.commit(3) as q:
                _write(q, PART)
        except CommitStateError:
            pass


def late_join(c: CheckpointDir) -> None:
    """A loader thread joins the commit of step 3 after it was aborted (its block raised):
    the join is refused (CommitStateError; the action lets the block's error through),
    never committed alone holding its one part."""
    ended = threading.Event()
    got: list[BaseException | None] = []

    def loader() -> None:
        ended.wait()
        try:
            with c.commit(3, join=True) as q:
                _write(q, PART)
        except BaseException as exc:  # judged below
            got.append(exc)
        else:
            got.append(None)

    worker = threading.Thread(target=loader)
    worker.start()
    try:
        with c.commit(3) as p:
            _write(p, A)
            raise Boom("the save failed while a loader thread was about to join it")
    finally:
        ended.set()
        worker.join()
        if got and got[0] is not None and not isinstance(got[0], CommitStateError):
            raise got[0]


class Interrupted(RuntimeError):
    """What ``publish_interrupted`` raises for the KeyboardInterrupt it injected (an
    action's errors are ``Exception``: a KeyboardInterrupt would end the whole check)."""


class _CtrlC(threading.Condition):
    """A commit's condition on which a wait is interrupted at once (Ctrl-C arriving while
    the publish waits for a joined block), after setting ``waited``."""

    def __init__(self, waited: threading.Event) -> None:
        super().__init__()
        self.waited = waited

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.set()
        raise KeyboardInterrupt


def publish_interrupted(c: CheckpointDir) -> None:
    """Ctrl-C while the publish of step 3 waits for a block joined from another thread:
    the commit is aborted (nothing published, no staging dir or lock left, so the
    interrupt handler can save again) and the interrupt propagates; the joined block then
    ends with CommitStateError (its commit is gone)."""
    entered, waited = threading.Event(), threading.Event()
    got: list[BaseException] = []

    def part() -> None:
        try:
            with c.commit(3, join=True) as q:
                _write(q, PART)
                entered.set()
                waited.wait(60)
        except BaseException as exc:  # judged below
            got.append(exc)
            entered.set()

    worker = threading.Thread(target=part)
    try:
        with c.begin(3) as commit:
            commit._cond = _CtrlC(waited)  # nothing waits on it yet
            _write(commit.path, A)
            worker.start()
            if not entered.wait(60):
                raise AssertionError("the joined block never started")
    except KeyboardInterrupt:
        waited.set()
        worker.join()
        if got and not isinstance(got[0], CommitStateError):
            raise got[0] from None
        raise Interrupted("Ctrl-C while the publish waited for a joined block") from None
    finally:
        waited.set()
        if worker.ident is not None:  # started
            worker.join()


def distributed_nested(c: CheckpointDir) -> None:
    """As ``commit_nested``, inside ``distributed_commit`` of step 3 on a one-rank gloo
    process group (the nested ``commit(3)`` is refused as inside ``ckpts.commit``)."""
    import tempfile

    import torch.distributed as dist

    from atomic_ckpt.distributed import distributed_commit

    if dist.is_initialized():
        raise RuntimeError("distributed_nested makes its own process group: one is open")
    with tempfile.TemporaryDirectory(prefix="atomic_ckpt-store-") as where:
        store = "file://" + os.path.join(where, "store")
        dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
        try:
            with distributed_commit(c, 3) as p:
                _write(p, A)
                try:
                    with c.commit(3) as q:
                        _write(q, PART)
                except CommitStateError:
                    pass
        finally:
            dist.destroy_process_group()


def rank0_threads(c: CheckpointDir) -> None:
    """Two threads each save step 3 with ``rank0_commit`` (no ``join``), their blocks open
    at once: each is a whole save of its own, the first to end promotes ``A``, the second
    then replaces it with ``B`` (the last to promote wins, as for ``ckpts.commit``)."""
    first_open, second_open, first_done = (threading.Event() for _ in range(3))
    errors: list[BaseException] = []

    def save(files: Mapping[str, bytes], opened: threading.Event, after: threading.Event) -> None:
        try:
            with _rank0(c, 3) as p:
                _write(p, files)
                opened.set()
                if not after.wait(60):
                    raise AssertionError("the other thread's block never opened")
        except BaseException as exc:  # raised below, in the action's thread
            errors.append(exc)
        finally:
            opened.set()

    def second() -> None:
        first_open.wait(60)
        save(B, second_open, first_done)

    worker = threading.Thread(target=second)
    worker.start()
    try:
        save(A, first_open, second_open)
    finally:
        first_done.set()
        worker.join()
    if errors:
        raise errors[0]


def apply_rank0_threads(m: RootModel) -> None:
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of(B)


def refuse(exc: type[BaseException], why: str, says: str | None = None) -> Apply:
    def apply(m: RootModel) -> None:
        raise Refused(exc, why, says=says)

    return apply


RACES: Mapping[str, tuple[Run, Apply, Apply | None]] = {
    "carry_thread": (carry_thread, apply_carry_thread, None),
    "join_generator": (
        join_generator,
        refuse(CommitStateError, "a joined block is suspended", says="generator"),
        None,
    ),
    "commit_nested": (commit_nested, _commit(3, A)[1], None),
    "late_join": (late_join, refuse(Boom, "the block raised; the late join is refused"), None),
    "publish_interrupted": (
        publish_interrupted,
        refuse(Interrupted, "Ctrl-C in the publish"),
        None,
    ),
    "distributed_nested": (distributed_nested, _commit(3, A)[1], None),
    "rank0_threads": (rank0_threads, apply_rank0_threads, _commit(3, A)[1]),
}
"""The actions of this module by name: (run, apply, midway), ``midway`` the first phase
a crash may show on its own (``rank0_threads``: the first thread's save, before the
second replaces it)."""
