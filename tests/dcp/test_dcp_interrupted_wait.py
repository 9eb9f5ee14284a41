"""Ctrl-C (SIGINT) while a new :class:`AtomicWriter` waits for this process's previous
async DCP save of the root (``on_pending="wait"``): the KeyboardInterrupt propagates, and
the process still finishes that save before it exits. (CPython before 3.13 marks a thread
whose ``join()`` was interrupted as stopped, so exit no longer waited for torch's save
thread: the save was cut off mid-way, its step never committed.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from procutil import wait_until_blocked

pytest.importorskip("torch.distributed.checkpoint")

from atomic_ckpt import CheckpointDir

_SCRIPT = """
import sys, time, warnings
from pathlib import Path
import torch
import torch.distributed.checkpoint as dcp
from atomic_ckpt import CheckpointDir
from atomic_ckpt.dcp import AtomicWriter

warnings.filterwarnings("ignore")
root, holding, go = sys.argv[1:4]

class Held(AtomicWriter):
    def write_data(self, plan, planner):
        Path(holding).touch()
        while not Path(go).exists():
            time.sleep(0.01)
        return super().write_data(plan, planner)

ckpts = CheckpointDir(root)
dcp.async_save({"w": torch.ones(4)}, storage_writer=Held(ckpts, 1), no_dist=True)
while not Path(holding).exists():
    time.sleep(0.01)
print("waiting", flush=True)
AtomicWriter(ckpts, 2, timeout=120)  # waits for the save of step 1
"""


def test_an_interrupted_wait_for_the_previous_save_still_finishes_it(tmp_path: Path) -> None:
    """The save in flight completes after the interrupt (step 1 is there), and the
    KeyboardInterrupt is what ends the process."""
    holding, go = tmp_path / "holding", tmp_path / "go"
    argv = [str(tmp_path / "root"), str(holding), str(go)]
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), *argv],
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
            proc.wait(timeout=2.0)
        go.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in err, err
    assert proc.returncode != 0
    assert CheckpointDir(tmp_path / "root").steps() == [1], err
