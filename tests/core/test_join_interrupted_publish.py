"""A publish interrupted while it waits for blocks joined from other threads (Ctrl-C, a
signal handler's exception) aborts the commit, as an exception leaving its block does: no
staging directory, lock or open commit is left behind, so the handler that catches the
interrupt can save the step again at once."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from types import FrameType

import pytest
from treeutil import contents

from atomic_ckpt import TMP_INFIX, CheckpointDir, Commit, CommitStateError


class Interrupted(BaseException):
    """What this test's SIGINT handler raises (a KeyboardInterrupt of its own)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def test_an_interrupt_while_publish_waits_for_a_joined_thread_aborts_the_commit(
    tmp_path: Path,
) -> None:
    """The main thread's ``with c.begin(5)`` ends while a thread's joined block is still
    open, so its publish waits; a SIGINT arrives there. The commit used to stay open (its
    staging dir, lock and registration kept): ``commit(5)`` in the interrupt handler was
    refused as nested in it. Now the interrupt propagates, the commit is aborted (nothing
    published), the joined block ends with CommitStateError, and step 5 commits again."""
    c = CheckpointDir(tmp_path / "ckpts")
    opened: list[Commit] = []
    entered, release = threading.Event(), threading.Event()
    joiner_errors: list[BaseException] = []
    main = threading.main_thread().ident
    assert main is not None
    assert threading.get_ident() == main

    def joiner() -> None:
        try:
            with c.commit(5, join=True) as path:
                (path / "shard1.bin").write_bytes(b"1" * 10)
                entered.set()
                deadline = time.monotonic() + 60
                while not opened[0]._cond._waiters:  # type: ignore[attr-defined]
                    assert time.monotonic() < deadline, "the publish never waited"
                    time.sleep(0.005)
                signal.pthread_kill(main, signal.SIGINT)  # the main thread is waiting
                release.wait(60)
        except BaseException as exc:  # reported below
            joiner_errors.append(exc)

    previous = signal.signal(signal.SIGINT, _interrupt)
    thread = threading.Thread(target=joiner)
    try:
        with pytest.raises(Interrupted), c.begin(5) as handle:  # noqa: PT012
            opened.append(handle)
            (handle.path / "shard0.bin").write_bytes(b"0" * 10)
            thread.start()
            assert entered.wait(60)
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
        thread.join(60)
    assert handle.state == "aborted"
    assert c.staging(5) is None
    assert [p.name for p in (tmp_path / "ckpts").iterdir() if TMP_INFIX in p.name] == []
    assert len(joiner_errors) == 1
    assert isinstance(joiner_errors[0], CommitStateError)
    assert c.steps() == []
    with c.commit(5) as path:  # the interrupt handler's save
        (path / "whole.bin").write_bytes(b"w")
    assert contents(tmp_path / "ckpts" / "5") == {"whole.bin": b"w"}
