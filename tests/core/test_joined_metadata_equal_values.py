"""A joined block's metadata merges by JSON value: equal is equal, different is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir


def test_join_repeating_a_nan_metric_commits(tmp_path: Path) -> None:
    """A joined block that repeats the commit's NaN ``val_loss`` (a diverged run) commits."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with ckpts.commit(5, metadata={"val_loss": math.nan}) as path:
        (path / "model.pt").write_bytes(b"m")
        with ckpts.commit(5, join=True, metadata={"val_loss": math.nan}) as joined:
            (joined / "optimizer.pt").write_bytes(b"o")
    assert ckpts.steps() == [5]


def test_join_with_another_json_value_is_refused(tmp_path: Path) -> None:
    """Joined ``{"epoch": True}`` against the commit's ``{"epoch": 1}`` is a ValueError."""
    ckpts = CheckpointDir(tmp_path / "ckpts")

    def save() -> None:
        with ckpts.commit(5, metadata={"epoch": 1}) as path:
            (path / "model.pt").write_bytes(b"m")
            with ckpts.commit(5, join=True, metadata={"epoch": True}):
                pass

    with pytest.raises(ValueError, match="epoch"):
        save()
    assert ckpts.steps() == []
