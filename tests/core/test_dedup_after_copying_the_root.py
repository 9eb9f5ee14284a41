"""A root copied whole (``cp -a``, as the incremental guide says to copy one) has new
inodes: its checkpoints verify, and dedup against them must not warn that their files
were "written or touched since its commit" (it compares the bytes anyway), nor refuse to
link files it has just found equal byte for byte."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir


def test_dedup_against_a_copied_root_links_without_a_false_alarm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The copy's step 1 verifies; the identical save of step 2 is linked to it, quietly."""
    if shutil.which("cp") is None:
        pytest.skip("no cp")
    original = CheckpointDir(tmp_path / "run")
    with original.commit(1) as path:
        (path / "shard.bin").write_bytes(b"frozen" * 10_000)
    subprocess.run(["cp", "-a", str(original.root), str(tmp_path / "copy")], check=True)
    copy = CheckpointDir(tmp_path / "copy")
    copy.verify(1)
    caplog.set_level(logging.INFO)
    with copy.begin(2, dedup=True) as commit:
        (commit.path / "shard.bin").write_bytes(b"frozen" * 10_000)
    alarms = [r.getMessage() for r in caplog.records if "written or touched" in r.getMessage()]
    assert alarms == []
    assert commit.deduped.get("shard.bin") in ("hardlink", "reflink")
    copy.verify(2)
