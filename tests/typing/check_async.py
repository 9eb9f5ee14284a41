"""Asynchronous commits and retention as a user calls them, checked by `mypy --strict`.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Literal, assert_type

from atomic_ckpt import AsyncCommitter, Checkpoint, CheckpointDir, RetentionPolicy


class NumpyLikeInt:
    def __index__(self) -> int:
        return 7


def write_json(state: dict[str, Any], directory: Path) -> None:
    (directory / "state.json").write_text(json.dumps(state))


def train_with_a_background_saver(ckpts: CheckpointDir, state: dict[str, Any]) -> None:
    keep = RetentionPolicy(keep_last=2, keep_every=1000)
    with AsyncCommitter(ckpts, writer=write_json, retain=keep) as saver:
        assert_type(saver, AsyncCommitter)
        saver.save(1, state)  # a state: copied now, written in the background
        saver.save(2, functools.partial(write_json, dict(state)))  # a save function
        saver.save(NumpyLikeInt(), lambda directory: None, metadata={"loss": 0.5})
        assert_type(saver.pending, int | None)
        saver.wait()
    saver.close()


def default_writer(ckpts: CheckpointDir, state: dict[str, Any]) -> None:
    saver = AsyncCommitter(ckpts)  # torch.save of the state to state.pt
    try:
        saver.save(3, state, metadata=None)
    finally:
        saver.close()


def keep_some(ckpts: CheckpointDir) -> list[Path]:
    policy = RetentionPolicy(keep_best=2, metric="val_loss", mode="min")
    assert_type(policy.keep_last, int | None)
    assert_type(policy.keep_every, int | None)
    assert_type(policy.keep_best, int | None)
    assert_type(policy.metric, str | None)
    assert_type(policy.mode, Literal["min", "max"])
    last = ckpts.latest()
    if last is not None:
        assert_type(policy.value(last), float | None)
    plan = policy.plan(ckpts.checkpoints())
    assert_type(plan.delete, list[Checkpoint])
    assert_type(plan.best, Checkpoint | None)
    deleted = ckpts.retain(policy)
    assert_type(deleted, list[Path])
    assert_type(ckpts.retain(keep_last=5, metric="acc", mode="max"), list[Path])
    with ckpts.commit(9, retain=RetentionPolicy(keep_last=1)) as path:
        assert_type(path, Path)
    return deleted
