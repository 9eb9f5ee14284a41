"""``--json FILE`` that cannot be written (attack of main, item 4): refused up front, with
exit 2 and one line naming it, before the workload is recorded; never a traceback or the
exit status of a verdict (1) after all the work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

pytestmark = needs_strace

WORKLOAD = """\
import os
open("ran", "w").close()
os.makedirs("ckpts", exist_ok=True)
open("ckpts/w", "wb").write(b"w")
"""


def audit_json(tmp_path: Path, out: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "w.py").write_text(WORKLOAD)
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", "ckpts",
         "--check", "false", "--json", out, "--", sys.executable, "w.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "where",
    ["no-such-dir", "a-directory", "under-a-file", "unwritable", "inside-the-root"],
)
def test_an_unwritable_json_path_exits_2_before_recording(tmp_path: Path, where: str) -> None:
    """A --json path in a missing directory, naming a directory, below a regular file, in
    a place that refuses writes, or inside the audited directory: exit 2, one line, the
    workload never run, nothing left behind."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    out = {
        "no-such-dir": "/nonexistent/dir/out.json",
        "a-directory": str(tmp_path / "a-dir"),
        "under-a-file": str(tmp_path / "a-file" / "out.json"),
        "unwritable": "/sys/kernel/out.json",  # EACCES even for root
        "inside-the-root": "ckpts/out.json",
    }[where]
    run = audit_json(tmp_path, out)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("atomic-ckpt audit: error: --json "), lines
    assert not (tmp_path / "ran").exists(), "the workload was recorded"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file", "w.py"]


def test_a_writable_json_path_gets_the_report(tmp_path: Path) -> None:
    """The up-front check leaves a good path alone: the verdict is written there (exit 1
    for the violations of a check that rejects every state)."""
    run = audit_json(tmp_path, "out.json")
    assert run.returncode == 1, run.stderr
    assert '"violations"' in (tmp_path / "out.json").read_text()
