"""Modification times in the crash states follow the workload's order (round 15): a
resume that picks the newest checkpoint by mtime (the common ``max(..., key=getmtime)``)
is judged on the order the workload made them in, never on the order the audit happened
to write each state's files in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _audit_scripts import needs_strace

from atomic_ckpt.testing import audit

pytestmark = needs_strace

TWO_STEPS = """\
# two steps, each's weights written without fsync, its DONE marker fsynced (the journal
# commit keeps the names; the weights' data may be lost)
import os, sys
root = sys.argv[1]
for step in (1, 2):
    os.mkdir(f"{root}/step-{step}")
    fd = os.open(f"{root}/step-{step}/w.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, bytes([48 + step]) * 4096)
    os.close(fd)
    m = os.open(f"{root}/step-{step}/DONE", os.O_WRONLY | os.O_CREAT, 0o644)
    os.fsync(m)
    os.close(m)
"""


def _resume(pick: str):  # type: ignore[no-untyped-def]
    def check(root: Path) -> None:
        done = [d for d in os.listdir(root) if os.path.exists(root / d / "DONE")]
        if not done:
            return
        if pick == "mtime":
            latest = max(done, key=lambda d: os.path.getmtime(root / d))
        else:
            latest = max(done, key=lambda d: int(d.split("-")[1]))
        data = (root / latest / "w.bin").read_bytes()
        assert data == bytes([48 + int(latest.split("-")[1])]) * 4096, latest

    return check


def test_the_newest_checkpoint_by_mtime_is_the_one_made_last(tmp_path: Path) -> None:
    """In every state, picking by mtime and picking by step number agree (the workload
    made step 2 after step 1), so both resumes fail in exactly the same states."""
    workload = tmp_path / "w.py"
    workload.write_text(TWO_STEPS)
    root = tmp_path / "ckpts"
    root.mkdir()
    failing = {}
    for pick in ("mtime", "number"):
        report = audit([sys.executable, str(workload), str(root)], _resume(pick), root=root,
                       models=("power",))  # fmt: skip
        failing[pick] = {v.listing for v in report.violations}
    assert failing["number"], "the workload's unsynced weights must break some state"
    assert failing["mtime"] == failing["number"]
