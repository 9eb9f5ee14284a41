"""benchmarks/remote_upload_cloud.py runs end to end on a tiny payload against both emulators
and writes well-formed results (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _emulators import AZURITE, fake_gcs_binary, importable, missing

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "remote_upload_cloud.py"


def test_remote_upload_cloud_tiny_run_writes_a_row_per_store(tmp_path: Path) -> None:
    """--tiny times the plain upload and the commit on gs:// and az:// and writes the table
    and the JSON, one row per store."""
    for module, extra in (("google.cloud.storage", "gcs"), ("azure.storage.blob", "azure")):
        if not importable(module):
            missing(f"the {extra} extra is not installed: pip install 'atomic_ckpt[{extra}]'")
    if fake_gcs_binary() is None or not AZURITE.exists():
        missing("fake-gcs-server or Azurite is not installed (see tests/remote/emulators)")
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((out / "remote_upload_cloud.json").read_text())["rows"]
    assert [(r["store"], r["case"]) for r in rows] == [
        ("gs", "3 files of 64 KiB"),
        ("az", "3 files of 64 KiB"),
    ]
    for row in rows:
        assert set(row["median_s"]) == {"plain upload", "atomic_ckpt commit"}
        assert all(len(v) == 1 and v[0] > 0 for v in row["runs"].values())
        assert row["files"] == 3
    table = (out / "remote_upload_cloud.md").read_text()
    assert "| gs:// | 3 files of 64 KiB | 3 |" in table
    assert "| az:// | 3 files of 64 KiB | 3 |" in table
