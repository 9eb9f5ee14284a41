"""The benchmark script runs end to end and writes well-formed results (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fsync_overhead.py"
ROW_KEYS = {"case", "method", "median_s", "runs", "min_s", "max_s", "spread", "ratio_to_floor"}


def test_fsync_overhead_tiny_run_writes_valid_results(tmp_path: Path) -> None:
    """--tiny runs every method on every case and writes the table, the JSON rows and the chart."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--repeats",
            "2",
            "--no-drop-caches",
            "--out",
            str(out),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    rows = json.loads((out / "fsync_overhead.json").read_text())
    assert isinstance(rows, list)
    assert rows
    for row in rows:
        assert row.keys() >= ROW_KEYS, row
        assert len(row["runs"]) == 2
        assert row["median_s"] > 0
    cases = {r["case"] for r in rows}
    assert len(cases) == 3
    for case in cases:
        methods = {r["method"] for r in rows if r["case"] == case}
        assert {"unsafe", "floor", "atomic_ckpt", "dcp sync_files"} <= methods
        floor = next(r for r in rows if r["case"] == case and r["method"] == "floor")
        assert floor["ratio_to_floor"] == pytest.approx(1.0)
        assert floor["fsyncs_files"] >= 1

    meta = json.loads((out / "fsync_overhead_meta.json").read_text())
    assert meta["machine"]["cores"] >= 1
    assert meta["memory"]
    assert meta["memory"][0]["tracemalloc_peak_bytes"] > 0
    assert "| atomic_ckpt |" in (out / "fsync_overhead.md").read_text()
    assert (out / "fsync_overhead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    leftovers = list((tmp_path / "data").rglob("*")) if (tmp_path / "data").exists() else []
    assert leftovers == []  # every run's data is deleted
