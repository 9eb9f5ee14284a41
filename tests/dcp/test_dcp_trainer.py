"""examples/dcp_trainer.py end to end: async DCP saves every k steps on 2 gloo ranks, every
rank SIGKILLed in the middle of a background save, then a restart that resumes from
latest() and ends bit-identical to a run that was never stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint")

from atomic_ckpt import TMP_INFIX, CheckpointDir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dcp_trainer.py"
ARGS = ["--steps", "9", "--every", "3"]


def train(run_dir: Path, *extra: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(run_dir), *ARGS, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr[-3000:]


def final(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("final "))


@pytest.mark.slow
def test_killed_mid_async_save_resumes_and_ends_bit_identical(tmp_path: Path) -> None:
    """Killed right after the async save of step 6 started: the restart resumes from step 3
    or 6 (whichever is complete), and the final weights equal an uninterrupted run's."""
    code, reference = train(tmp_path / "reference")
    assert code == 0, reference
    assert "fresh start" in reference

    run = tmp_path / "run"
    code, killed = train(run, "--kill-at", "6")
    assert code == 3, killed  # every rank died by SIGKILL: the fault fired
    assert "killed at step 6" in killed
    assert set(CheckpointDir(run).steps()) <= {3, 6}
    assert 3 in CheckpointDir(run).steps()

    code, resumed = train(run)
    assert code == 0, resumed
    line = next(ln for ln in resumed.splitlines() if ln.startswith("resumed from step"))
    assert line in ("resumed from step 3", "resumed from step 6")
    assert final(resumed) == final(reference)
    ckpts = CheckpointDir(run)
    assert ckpts.steps() == [6, 9]  # keep_last=2
    assert not [n for n in os.listdir(run) if TMP_INFIX in n and "root.lock" not in n]
    dcp_files = {e.path for e in ckpts.verify(9).manifest.files}
    assert ".metadata" in dcp_files
