"""Ctrl-C (SIGINT) while ``AsyncCommitter.close()`` (or ``wait()``) waits for the commit in
flight: the KeyboardInterrupt propagates, and the process still finishes that commit
before it exits, as it does at any interpreter exit. (CPython before 3.13 marks a thread
whose ``join()`` was interrupted as stopped, so exit no longer waited for it: the commit
was cut off mid-way, and a failure of it was never reported.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from procutil import wait_until_blocked

from atomic_ckpt import CheckpointDir

_SCRIPT = """
import sys, time
from pathlib import Path
from atomic_ckpt import AsyncCommitter, CheckpointDir

root, holding, go, how, fail = sys.argv[1:6]

def save(directory):
    Path(holding).touch()
    while not Path(go).exists():
        time.sleep(0.01)
    if fail == "fail":
        raise OSError("the disk went away")
    (directory / "state.bin").write_bytes(b"state")

saver = AsyncCommitter(CheckpointDir(root))
saver.save(1, save)
while not Path(holding).exists():
    time.sleep(0.01)
print("waiting", flush=True)
saver.close() if how == "close" else saver.wait()
"""


@pytest.mark.parametrize("fail", ["ok", "fail"])
@pytest.mark.parametrize("how", ["close", "wait"])
def test_an_interrupted_close_still_finishes_the_commit_in_flight(
    tmp_path: Path, how: str, fail: str
) -> None:
    """The commit completes after the interrupt (step 1 is there), or, if it fails, the
    process reports it (exit status non-zero, the failed step named)."""
    holding, go = tmp_path / "holding", tmp_path / "go"
    argv = [str(holding), str(go), how, fail]
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), str(tmp_path / "root"), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "waiting\n", proc.communicate()
        wait_until_blocked(proc.pid)
        proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):  # held: it cannot end before "go"
            proc.wait(timeout=1.0)
        go.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in err, err
    assert proc.returncode != 0
    steps = CheckpointDir(tmp_path / "root").steps()
    if fail == "ok":
        assert steps == [1], err
    else:
        assert steps == []
        assert "background commit of step 1 failed" in err, err
