"""The benchmark script runs end to end and writes well-formed results (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _script() -> Any:
    """benchmarks/fsync_overhead.py as a module (its tables of cases and methods)."""
    import importlib.util

    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("fsync_overhead_under_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_the_default_runs_and_the_only_one() -> None:
    """benchmarks/results holds one fsync_overhead table (no older copies beside it), made
    by the documented default command with the current code's cases, methods and
    repetitions: rerunning that one command refreshes what the README shows."""
    script = _script()
    results = SCRIPT.parent / "results"
    copies = sorted(p.relative_to(results).as_posix() for p in results.rglob("fsync_overhead*"))
    assert copies == [
        "fsync_overhead.json",
        "fsync_overhead.md",
        "fsync_overhead.png",
        "fsync_overhead_meta.json",
    ]
    meta = json.loads((results / "fsync_overhead_meta.json").read_text())
    assert meta["command"] == script.DEFAULT_COMMAND == "python benchmarks/fsync_overhead.py"
    assert "uncommitted" not in meta["code"]
    rows = json.loads((results / "fsync_overhead.json").read_text())
    cases = script._cases(False, None)
    methods = [m.name for m in script.methods()]
    assert sorted({(r["case"], r["method"]) for r in rows}) == sorted(
        (c.name, m) for c in cases for m in methods
    )
    repeats = {c.name: c.repeats for c in cases}
    assert all(len(r["runs"]) == repeats[r["case"]] for r in rows)
    assert (
        f"`{script.DEFAULT_COMMAND}`, code {meta['code']}"
        in (results / "fsync_overhead.md").read_text()
    )


def test_a_narrowed_run_cannot_overwrite_the_committed_table(tmp_path: Path) -> None:
    """--quick, --cases and friends without --out are refused (exit 2, naming the flag),
    leaving the committed table untouched."""
    results = SCRIPT.parent / "results" / "fsync_overhead.json"
    before = results.read_bytes()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cases", "1 MiB"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--quick, --cases change what is measured: pass --out DIR" in proc.stderr
    assert results.read_bytes() == before
