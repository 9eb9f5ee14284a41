"""``resume_verified(read=...)`` refuses a lone path with a message saying what it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir


def test_a_single_path_object_is_refused_clearly(tmp_path: Path) -> None:
    """A ``Path`` given as ``read`` is a TypeError that says to pass a list of paths."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(b"m")
    with pytest.raises(TypeError, match=r"collection of paths"):
        ckpts.resume_verified(Path("model.pt"))  # type: ignore[arg-type]
