"""The command line against a live run, and its exit statuses: 0 ok, 1 nothing/failed, 2 error."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli import main

CTX = mp.get_context("fork")
SHARDS = 8
RACE_RUNS = 30


# ---------------------------------------------------------------- a live run beside `ls`


def _live_run(root: str, started: Event, stop: Event) -> None:
    """Child: commit a step with several files, prune to the latest, again and again."""
    ckpts = CheckpointDir(root, durable=False)
    deadline = time.monotonic() + 300  # never outlive the test by much
    step = 0
    while not stop.is_set() and time.monotonic() < deadline:
        step += 1
        with ckpts.commit(step) as path:
            for i in range(SHARDS):
                (path / f"shard{i}.bin").write_bytes(bytes([i]) * 4096)
        ckpts.prune(keep_last=1)
        started.set()


@pytest.fixture
def live_root(tmp_path: Path) -> Iterator[Path]:
    """A root that a writer process commits to and prunes in a loop while the test runs."""
    root = tmp_path / "ckpts"
    started, stop = CTX.Event(), CTX.Event()
    writer = CTX.Process(target=_live_run, args=(str(root), started, stop))
    writer.start()
    still_writing = False
    try:
        assert started.wait(10), "the writer never committed"
        yield root
    finally:
        still_writing = writer.is_alive()
        stop.set()
        writer.join(10)
        if writer.is_alive():
            writer.kill()
            writer.join()
    assert writer.exitcode == 0
    assert still_writing, "the writer had stopped before the CLI runs ended: nothing raced"


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def _race(argv: list[str]) -> tuple[int, list[tuple[int, str, str]]]:
    """Run the CLI with ``argv`` RACE_RUNS times against the live writer (a count, not a
    time: a loaded machine runs fewer in a given time); return the runs and the failures."""
    failures: list[tuple[int, str, str]] = []
    for _ in range(RACE_RUNS):
        status, out, err = _run_cli(argv)
        if status != 0 or "FAILED" in out:
            failures.append((status, out, err))
    return RACE_RUNS, failures


def test_ls_of_a_live_run_always_exits_0(live_root: Path) -> None:
    """`ls` against a run that commits and prunes in a loop skips entries that vanish meanwhile."""
    runs, failures = _race(["ls", str(live_root)])
    assert failures == [], f"{len(failures)} of {runs} runs failed, e.g. {failures[0]}"


def test_verify_of_a_live_run_never_reports_a_pruned_step_as_failed(live_root: Path) -> None:
    """`verify` reports a step pruned while it runs as gone, not FAILED, and exits 0."""
    runs, failures = _race(["verify", str(live_root)])
    assert failures == [], f"{len(failures)} of {runs} runs failed, e.g. {failures[0]}"


# ---------------------------------------------------------------- `demo` exit statuses

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the demo needs torch"
)


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "demo", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=120,
    )


def _assert_usage_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr


@needs_torch
def test_demo_pointed_at_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """`atomic-ckpt demo FILE` says in one line that FILE is no directory, and exits 2."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    _assert_usage_error(_demo(str(not_a_dir)))


@needs_torch
@pytest.mark.parametrize("steps", ["1", "-3"])
def test_demo_with_too_few_steps_is_a_usage_error(tmp_path: Path, steps: str) -> None:
    """`atomic-ckpt demo --steps N` with N < 3 is a usage error: one line, exit 2."""
    _assert_usage_error(_demo(str(tmp_path / "demo"), "--steps", steps))


@needs_torch
def test_demo_in_a_non_empty_directory_is_a_usage_error(tmp_path: Path) -> None:
    """`atomic-ckpt demo DIR` whose checkpoints/ already holds something: one line, exit 2."""
    (tmp_path / "demo" / "checkpoints").mkdir(parents=True)
    (tmp_path / "demo" / "checkpoints" / "mine.txt").write_text("keep me")
    _assert_usage_error(_demo(str(tmp_path / "demo")))
    assert (tmp_path / "demo" / "checkpoints" / "mine.txt").read_text() == "keep me"
