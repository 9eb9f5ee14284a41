"""A ``join=True`` block in a process that did not begin the commit it means to join (a
DataLoader-like worker forked before the trainer opened the commit, another rank's
process): it is refused while that commit is open, never committed alone over it (which
published a one-part checkpoint the scanner called complete); and a child forked while
another thread held one of the library's own locks can still commit (it used to hang)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from treeutil import contents

from atomic_ckpt import TMP_INFIX, CheckpointDir
from atomic_ckpt.distributed import rank0_commit

Opener = Callable[[CheckpointDir, bool], AbstractContextManager[Path]]

OPENERS: dict[str, Opener] = {
    "commit": lambda c, join: c.commit(5, join=join),
    "commit_named": lambda c, join: c.commit_named("interrupted", join=join),
    "rank0_commit": lambda c, join: rank0_commit(c, 5, join=join),
}


def _in_child(work: Callable[[], bytes]) -> tuple[int, int, int]:
    """Fork a child that waits for a byte on a pipe, runs ``work`` and writes back what it
    returns (or the repr of its error); returns (pid, go, result) descriptors."""
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.alarm(30)  # a hung child dies (and reports nothing)
        os.read(go_r, 1)
        try:
            out = work()
        except BaseException as exc:
            out = f"{type(exc).__name__}: {exc}".encode()
        os.write(res_w, out[:4000])
        os._exit(0)
    os.close(go_r)
    os.close(res_w)
    return pid, go_w, res_r


def _result(pid: int, go: int, res: int) -> str:
    """Let the child run; wait for it and return what it reported."""
    os.write(go, b"x")
    out = os.read(res, 4000).decode()
    os.waitpid(pid, 0)
    os.close(go)
    os.close(res)
    return out


@pytest.mark.parametrize("opener", OPENERS, ids=list(OPENERS))
def test_a_worker_forked_before_the_commit_cannot_publish_its_part_alone(
    tmp_path: Path, opener: str
) -> None:
    """The worker's ``join=True`` block runs while the parent's commit is open: it is
    refused with CommitStateError naming the other process, nothing is published while
    the parent writes, and the parent's checkpoint is whole."""
    root = tmp_path / "ckpts"
    c = CheckpointDir(root)
    open_ = OPENERS[opener]

    def worker() -> bytes:
        with open_(c, True) as path:
            (path / "worker.bin").write_bytes(b"w" * 10)
        return b"committed alone"

    child = _in_child(worker)
    with open_(c, False) as path:
        (path / "main.bin").write_bytes(b"m" * 10)
        outcome = _result(*child)
        assert [p.name for p in root.iterdir() if TMP_INFIX not in p.name] == []
    assert outcome.startswith("CommitStateError"), outcome
    assert "another process" in outcome
    final = root / ("interrupted" if opener == "commit_named" else "5")
    assert contents(final) == {"main.bin": b"m" * 10}


def _library_locks() -> list[Any]:
    """Every module-level lock of the library's core."""
    from atomic_ckpt._core.l2_syscalls import fs as _fs
    from atomic_ckpt._core.l4_protocol import carry as _carry
    from atomic_ckpt._core.l4_protocol import joining as _joining
    from atomic_ckpt._core.l5_facade import closing as _closing

    return [_joining._LOCK, _fs._DURABLE_ENTRIES_LOCK, _carry._RESERVE, _closing._UNOBSERVED_LOCK]


def test_a_child_forked_while_a_library_lock_is_held_can_still_commit(tmp_path: Path) -> None:
    """Another thread (an async commit ending) holds the registry lock at the instant a
    DataLoader worker is forked: the worker's own commit used to wait forever on the copy
    of that lock, which no thread of the child would ever release."""
    c = CheckpointDir(tmp_path / "ckpts")

    def worker() -> bytes:
        with c.commit(7) as path:
            (path / "w.bin").write_bytes(b"w")
        return b"committed"

    taken, release = threading.Event(), threading.Event()
    held_locks = _library_locks()

    def holder() -> None:
        for lock in held_locks:
            assert lock.acquire(timeout=60)
        taken.set()
        release.wait(60)
        for lock in held_locks:
            lock.release()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert taken.wait(60)
        child = _in_child(worker)
    finally:
        release.set()
        thread.join(60)
    assert _result(*child) == "committed"
    assert contents(tmp_path / "ckpts" / "7") == {"w.bin": b"w"}
