"""Carrying committed files (``Commit.carry``, ``commit(carry=...)``) as a user calls it,
checked by `mypy --strict`.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, assert_type

from atomic_ckpt import Checkpoint, CheckpointDir


def carry_then_write(ckpts: CheckpointDir, step: int) -> Checkpoint:
    with ckpts.begin(step) as commit:
        how = commit.carry("frozen.safetensors", from_=step - 1)
        assert_type(how, Literal["reflink", "hardlink", "copy"])
        commit.carry("tokenizer/", from_="best")
        commit.carry(Path("data") / "stats.json", from_=str(step - 1))
        (commit.path / "trainable.safetensors").write_bytes(b"weights")
    return commit.publish()


def carry_through_commit(ckpts: CheckpointDir, step: int) -> None:
    with ckpts.commit(step, carry={"tokenizer/": step - 1, "frozen.bin": "base"}) as path:
        assert_type(path, Path)
    with ckpts.commit_named("interrupted", carry={"tokenizer/": step}) as path:
        (path / "model.bin").write_bytes(b"weights")
