"""benchmarks/remote_upload.py runs end to end on tiny payloads and writes well-formed
results (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "remote_upload.py"


def test_remote_upload_tiny_run_writes_valid_results(tmp_path: Path) -> None:
    """--tiny times every method on both cases and writes the table and the JSON."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "remote_upload.json").read_text())
    rows = doc["rows"]
    assert [r["case"] for r in rows] == ["3 files of 64 KiB", "20 files of 4 KiB"]
    for row in rows:
        assert set(row["median_s"]) == {
            "s3fs.put",
            "atomic_ckpt commit",
            "same uploads, no protocol",
        }
        assert all(len(v) == 1 and v[0] > 0 for v in row["runs"].values())
        assert row["ratio"] > 0
        assert row["files"] == (3 if row["case"].startswith("3 ") else 20)
    assert set(doc["meta"]["versions"]) == {"moto", "s3fs", "boto3", "botocore", "aiobotocore"}
    table = (out / "remote_upload.md").read_text()
    assert table.startswith("# Object-store commit vs plain upload")
    assert "Machine: " in table
    assert "| 3 files of 64 KiB | 3 |" in table
