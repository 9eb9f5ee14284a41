"""The crash table's carry+dedup row, run once each without a crash (they cannot rot): the
atomic workload really carries and deduplicates, and both checks judge what is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "benchmarks" / "crash_table"
sys.path.insert(0, str(SCRIPTS))

import _common  # noqa: E402


def _run(script: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)])}
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{script}.py"), "save+check", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.slow  # the slow tier, like the other rows' run (test_crash_table.py)
@pytest.mark.parametrize("script", ["dedup_atomic", "dedup_plain"])
def test_the_dedup_row_saves_four_times_and_resumes_the_last(tmp_path: Path, script: str) -> None:
    proc = _run(script, tmp_path / script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "save 3 failed as intended" in proc.stdout
    journal = _common.Journal.read(tmp_path / script)
    assert sorted(journal.begun.values()) == [1, 2, 3, 4]
    assert journal.returned == {1, 2, 4}
    assert proc.stdout.strip().splitlines()[-1] == "loaded save 4 from ckpt/2/"
    if script == "dedup_atomic":
        linked = json.loads(proc.stdout.strip().splitlines()[-2])
        assert linked["carry 2"] in ("hardlink", "reflink", "copy")
        assert "frozen.pt" in linked["dedup 1"]  # the rewrite linked it to the older save
        left = [n for n in os.listdir(tmp_path / script / "ckpt") if not n.startswith(".")]
        assert left == ["2"]  # the source pruned
