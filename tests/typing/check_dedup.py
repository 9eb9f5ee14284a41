"""Deduplicating at commit time (``dedup=``, ``Commit.deduped``) as a user calls it,
checked by `mypy --strict`.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, assert_type

from atomic_ckpt import CheckpointDir


def dedup_options(ckpts: CheckpointDir, step: int) -> None:
    with ckpts.begin(step, dedup=True) as commit:
        (commit.path / "model.safetensors").write_bytes(b"weights")
    assert_type(commit.deduped, dict[str, Literal["reflink", "hardlink"]])
    with ckpts.commit(step + 1, dedup=step) as path:
        assert_type(path, Path)
    with ckpts.commit_named("interrupted", dedup="best") as path:
        (path / "model.bin").write_bytes(b"weights")
    ckpts.begin_named("final", dedup=True).abort()
