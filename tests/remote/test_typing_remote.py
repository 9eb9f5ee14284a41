"""The public types of atomic_ckpt.remote stay honest: check_remote_api.py, written the way a
user calls the API, passes `mypy --strict`, and a canary with deliberate mistakes fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed"
)

HERE = Path(__file__).resolve().parent
CANARY = """\
from typing import assert_type

from atomic_ckpt.remote import RemoteCheckpoint, RemoteCheckpointDir

ckpts = RemoteCheckpointDir("s3://bucket/run")
assert_type(ckpts.latest(), RemoteCheckpoint)
ckpts.commit("7")
"""


def test_remote_api_types(tmp_path: Path, mypy_cache_dir: Path) -> None:
    """mypy --strict passes the user-style check file and reports both canary mistakes."""
    canary = tmp_path / "canary_remote.py"
    canary.write_text(CANARY)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(mypy_cache_dir),
            str(HERE / "check_remote_api.py"),
            str(canary),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=HERE.parents[1],
    )
    lines = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert not [line for line in lines if "check_remote_api.py" in line], result.stdout
    canary_errors = [line for line in lines if "canary_remote.py" in line]
    assert any(":6: error:" in e and "RemoteCheckpoint | None" in e for e in canary_errors)
    assert any(":7: error:" in e and "SupportsIndex" in e for e in canary_errors)
