"""Several processes on one root: each commit is whole, the last promotion wins, clean() is safe."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path

import pytest
from treeutil import contents

from atomic_ckpt import TMP_INFIX, CheckpointDir
from atomic_ckpt._core.l1_names.names import ROOT_LOCK

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs fork")

CTX = mp.get_context("fork")
WRITERS = ("alpha", "beta")
FILES_PER_WRITER = 5
JOIN_TIMEOUT = 120  # a safety net against a hung child, not a performance assertion


def expected_files(writer: str) -> dict[str, bytes]:
    """What ``writer`` saves: some files only it writes, and a file both write."""
    files = {
        f"{writer}-{i}.bin": f"{writer} part {i}".encode() * 100 for i in range(FILES_PER_WRITER)
    }
    files["shared/model.bin"] = writer.encode() * 4096
    return files


def _commit_with_barrier(root: str, step: int, writer: str, barrier: Barrier) -> None:
    """Child: start the commit with the other writer, stage, then race it to promotion."""
    ckpts = CheckpointDir(root)
    barrier.wait()
    with ckpts.commit(step) as path:
        for rel, data in expected_files(writer).items():
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        barrier.wait()


def run_all(procs: list[mp.process.BaseProcess]) -> list[int | None]:
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_TIMEOUT)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


@pytest.mark.parametrize("existing", [False, True], ids=["new-step", "rewrite"])
@pytest.mark.parametrize("round_", range(4))
def test_two_processes_committing_the_same_step_both_succeed(
    tmp_path: Path, existing: bool, round_: int
) -> None:
    """Two writers racing on one step both succeed; `N/` then holds exactly one writer's files."""
    ckpts = CheckpointDir(tmp_path / f"round{round_}")
    if existing:
        with ckpts.commit(7) as path:
            (path / "old.bin").write_bytes(b"the save being replaced")
    barrier = CTX.Barrier(len(WRITERS), timeout=JOIN_TIMEOUT)
    procs = [
        CTX.Process(target=_commit_with_barrier, args=(str(ckpts.root), 7, w, barrier))
        for w in WRITERS
    ]
    assert run_all(procs) == [0, 0]
    found = contents(ckpts.path_of(7))
    assert found in [expected_files(w) for w in WRITERS]
    ckpts.verify(7)
    assert set(os.listdir(ckpts.root)) == {"7"}


def test_two_processes_committing_different_steps_both_land(tmp_path: Path) -> None:
    """Writers of different steps at the same time both end up complete."""
    ckpts = CheckpointDir(tmp_path / "root")
    barrier = CTX.Barrier(len(WRITERS), timeout=JOIN_TIMEOUT)
    procs = [
        CTX.Process(target=_commit_with_barrier, args=(str(ckpts.root), step, w, barrier))
        for step, w in enumerate(WRITERS, start=1)
    ]
    assert run_all(procs) == [0, 0]
    assert ckpts.steps() == [1, 2]
    for step, w in enumerate(WRITERS, start=1):
        assert contents(ckpts.path_of(step)) == expected_files(w)
        ckpts.verify(step)


def _commit_many(root: str, writer: str, steps: int, start: Barrier) -> None:
    """Child: commit steps 0..steps-1 in turn (overlapping with the other writer)."""
    ckpts = CheckpointDir(root)
    start.wait()
    for step in range(steps):
        with ckpts.commit(step) as path:
            for rel, data in expected_files(writer).items():
                target = path / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)


def _clean_until(root: str, stop: Event, start: Barrier, rounds: Synchronized[int]) -> None:
    """Child: run clean() in a loop until told to stop; it must never disturb a live save."""
    ckpts = CheckpointDir(root)
    start.wait()
    while True:
        ckpts.clean()
        with rounds.get_lock():
            rounds.value += 1
        if stop.is_set():
            break


def test_clean_in_a_loop_never_disturbs_live_writers(tmp_path: Path) -> None:
    """clean() running beside two busy writers breaks no commit (no StagingLostError, no loss)."""
    root = tmp_path / "root"
    CheckpointDir(root).steps()
    steps = 12
    start = CTX.Barrier(len(WRITERS) + 1, timeout=JOIN_TIMEOUT)
    stop = CTX.Event()
    rounds = CTX.Value("i", 0)
    cleaner = CTX.Process(target=_clean_until, args=(str(root), stop, start, rounds))
    writers = [CTX.Process(target=_commit_many, args=(str(root), w, steps, start)) for w in WRITERS]
    cleaner.start()
    try:
        assert run_all(list(writers)) == [0, 0]
    finally:
        stop.set()
        cleaner.join(JOIN_TIMEOUT)
    assert cleaner.exitcode == 0
    assert rounds.value > 1
    ckpts = CheckpointDir(root)
    assert ckpts.steps() == list(range(steps))
    for step in range(steps):
        assert contents(ckpts.path_of(step)) in [expected_files(w) for w in WRITERS]
        ckpts.verify(step)
    assert not [n for n in os.listdir(root) if TMP_INFIX in n and n != ROOT_LOCK]


def test_two_threads_committing_the_same_step_both_succeed(tmp_path: Path) -> None:
    """Threads of one process exclude each other like processes: both commit, one wins whole."""
    ckpts = CheckpointDir(tmp_path / "root")
    barrier = threading.Barrier(len(WRITERS), timeout=JOIN_TIMEOUT)
    errors: list[BaseException] = []

    def run(writer: str) -> None:
        try:
            barrier.wait()
            with ckpts.commit(3) as path:
                for rel, data in expected_files(writer).items():
                    target = path / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                barrier.wait()
        except BaseException as exc:
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(w,)) for w in WRITERS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT)
        assert errors == []
        assert contents(ckpts.path_of(3)) in [expected_files(w) for w in WRITERS]
        ckpts.verify(3)
        assert set(os.listdir(ckpts.root)) == {"3"}
