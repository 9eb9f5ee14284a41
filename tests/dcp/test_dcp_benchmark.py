"""benchmarks/dcp_save.py runs end to end on a tiny state and writes well-formed results
(no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("safetensors")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dcp_save.py"
TIMES = {"atomic", "dcp_sync", "torch_save", "async", "async_cached"}


@pytest.mark.slow
def test_dcp_save_benchmark_tiny_run_writes_valid_results(tmp_path: Path) -> None:
    """--tiny on 1 and 2 ranks: every method timed on each, the table and the JSON written,
    the scratch data removed."""
    out, data = tmp_path / "results", tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--repeats",
            "1",
            "--ranks",
            "1,2",
            "--out",
            str(out),
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "dcp_save.json").read_text())
    assert result["machine"]["cores"] >= 1
    rows = result["rows"]
    assert [r["ranks"] for r in rows] == [1, 2]
    for row in rows:
        assert row.keys() >= TIMES
        assert all(row[k] > 0 for k in TIMES)
        assert all(len(row["runs"][k]) == 1 for k in TIMES)
    table = (out / "dcp_save.md").read_text()
    assert "Machine:" in table
    assert table.count("\n| 1 |") == 1
    assert table.count("\n| 2 |") == 1
    assert not data.exists() or not any(data.iterdir())
