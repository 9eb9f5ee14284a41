"""``mark_complete`` adopts a directory written without atomic_ckpt; it never replaces, nor
reports as complete, a checkpoint atomic_ckpt wrote that this release cannot use. A marker
of a newer format version was taken for an unreadable one and replaced by a new manifest
(the newer checkpoint's metadata lost, silently), and a complete checkpoint moved by hand
to another step was "marked complete" (exit 0) while every scan still skipped it. Both are
a StepConflictError (a FileExistsError) now, saying what the directory is and what to do;
the marker is left as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from atomic_ckpt import MARKER, CheckpointDir, StepConflictError


def _newer(marker: Path) -> bytes:
    """Make ``marker`` a newer format version's (the header's version field)."""
    text = marker.read_bytes().replace(b'"version": 2', b'"version": 3', 1)
    assert b'"version": 3' in text
    os.chmod(marker, 0o644)
    marker.write_bytes(text)
    return text


def test_mark_complete_never_replaces_a_newer_format_marker(tmp_path: Path) -> None:
    """Step 1's marker is of format version 3: mark_complete raises StepConflictError
    naming the upgrade, and the marker (with its metadata) is untouched."""
    c = CheckpointDir(tmp_path / "ckpts")
    with c.commit(1, metadata={"loss": 0.25}) as path:
        (path / "model.bin").write_bytes(b"m")
    marker = tmp_path / "ckpts" / "1" / MARKER
    text = _newer(marker)
    with pytest.raises(StepConflictError, match="newer atomic_ckpt") as caught:
        c.mark_complete(1)
    assert isinstance(caught.value, FileExistsError)
    assert "upgrade" in str(caught.value)
    assert marker.read_bytes() == text


@pytest.mark.parametrize("moved_from", ["5", "interrupted"])
def test_mark_complete_refuses_a_checkpoint_moved_by_hand(tmp_path: Path, moved_from: str) -> None:
    """``mv 5 7`` (or ``mv interrupted 7``): ``mark_complete(7)`` used to return a
    Checkpoint (its manifest still recording the other step) and the CLI to print
    "marked ... complete", while the scan kept calling 7 invalid. It is refused now,
    naming the remedy, and the CLI exits non-zero; the directory is unchanged."""
    c = CheckpointDir(tmp_path / "ckpts")
    if moved_from == "5":
        with c.commit(5) as path:
            (path / "model.bin").write_bytes(b"m")
    else:
        with c.commit_named("interrupted") as path:
            (path / "model.bin").write_bytes(b"m")
    os.rename(tmp_path / "ckpts" / moved_from, tmp_path / "ckpts" / "7")
    marker = (tmp_path / "ckpts" / "7" / MARKER).read_bytes()
    remedy = "move it back" if moved_from == "5" else "atomic-ckpt promote"
    with pytest.raises(StepConflictError, match="moved or copied") as caught:
        c.mark_complete(7)
    assert remedy in str(caught.value)
    cli = subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "mark-complete", str(tmp_path / "ckpts" / "7")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode != 0, cli.stdout
    assert "moved or copied" in cli.stderr
    assert (tmp_path / "ckpts" / "7" / MARKER).read_bytes() == marker
    assert c.steps() == []  # still skipped: nothing was adopted
