"""benchmarks/scan_scale.py runs end to end and writes well-formed results (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scan_scale.py"
GRID_KEYS = {"checkpoints", "files", "latest_s", "steps_s", "get_s", "ls_s", "verify_s"}


def test_scan_scale_tiny_run_writes_valid_results(tmp_path: Path) -> None:
    """--tiny times every call on every grid cell and writes the table and the JSON."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--repeats",
            "1",
            "--no-drop-caches",
            "--out",
            str(out),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((out / "scan_scale.json").read_text())
    assert report["machine_line"]
    assert report["machine"]["cores"] >= 1
    cells = {(r["checkpoints"], r["files"]) for r in report["grid"]}
    assert cells == {(1, 1), (3, 1), (1, 10), (3, 10)}
    for row in report["grid"]:
        assert row.keys() >= GRID_KEYS, row
        assert all(row[k] > 0 for k in GRID_KEYS - {"checkpoints", "files"})
    assert [r["markers"] for r in report["before_after"]] == ["version 1", "version 2"]
    assert {v["cache"] for v in report["verify"]} == {"warm"}
    assert all(v["verify_s"] > 0 and v["plain_s"] > 0 for v in report["verify"])
    assert report["manifest"]["v2_bytes_per_file"] < report["manifest"]["v1_bytes_per_file"]
    text = (out / "scan_scale.md").read_text()
    assert "## The grid" in text
    assert report["machine_line"] in text
    assert not (tmp_path / "data").exists()  # every root is deleted
