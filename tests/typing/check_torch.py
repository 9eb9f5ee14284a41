"""``atomic_ckpt.torch`` and ``atomic_ckpt.distributed`` as a user calls them, checked by
`mypy --strict` against torch's own types (a real optimizer and scheduler must fit).

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, assert_type

import torch
import torch.distributed as dist

from atomic_ckpt import Checkpoint, CheckpointDir, RetentionPolicy, VerifiedCheckpoint
from atomic_ckpt.distributed import (
    DEFAULT_TIMEOUT,
    distributed_commit,
    load_dcp,
    rank_path,
    resume_verified,
)
from atomic_ckpt.distributed import resume as resume_all_ranks
from atomic_ckpt.torch import TrainingState, load_state, resume, save_state, write_state


def train(ckpts: CheckpointDir, steps: int) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    state = resume(ckpts, model=model, optimizer=optimizer, scheduler=scheduler, verify=True)
    assert_type(state, TrainingState | None)
    start = 0
    if state is not None:
        assert_type(state.step, int)
        assert_type(state.path, Path)
        assert_type(state.epoch, int | None)
        assert_type(state.metadata, Mapping[str, Any])
        start = state.step + 1
    for step in range(start, steps):
        ckpt = save_state(
            ckpts,
            step,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            epoch=step // 100,
            metadata={"loss": 0.5},
        )
        assert_type(ckpt, Checkpoint)
    save_state(ckpts, torch.tensor(steps), model=model)  # a 0-d tensor is a SupportsIndex
    frozen = save_state(ckpts, steps + 1, model=model, carry_frozen=True, constant_buffers=())
    assert_type(frozen, Checkpoint)


def load(ckpt: Checkpoint, path: str) -> TrainingState:
    model = torch.nn.Linear(4, 2)
    assert_type(load_state(ckpt, model=model, strict=False, device="cpu"), TrainingState)
    with CheckpointDir(path).commit(1) as staging:
        write_state(staging, step=1, model=model, epoch=None, metadata=None)
    return load_state(Path(path) / "1", model=model)


def distributed(ckpts: CheckpointDir, step: int, shard: dict[str, torch.Tensor]) -> None:
    """Every rank runs this (signatures only: never run)."""
    group = dist.new_group()
    with distributed_commit(
        ckpts,
        step,
        metadata={"world": dist.get_world_size()},
        group=group,
        timeout=DEFAULT_TIMEOUT,
        retain=RetentionPolicy(keep_last=2),
    ) as path:
        assert_type(path, Path)
        torch.save(shard, rank_path(path / "model.pt"))
        assert_type(rank_path(str(path / "model.pt"), 3), Path)
        assert_type(rank_path(path / "model.pt", group=group), Path)
    with distributed_commit(ckpts, step + 1) as path:
        assert_type(path, Path)
    ckpt = resume_all_ranks(ckpts, group=group, timeout=60.0, verify=True)
    assert_type(ckpt, Checkpoint | None)
    if ckpt is not None:
        state: dict[str, Any] = {"model": shard}
        load_dcp(state, ckpt, process_group=group)
        load_dcp(state, str(ckpt.path))
    assert_type(resume_all_ranks(ckpts), Checkpoint | None)
    mine = {rank_path("model.pt", group=group).as_posix(), "config.json"}
    found = resume_verified(ckpts, mine, group=group, timeout=60.0, fresh=True)
    assert_type(found, VerifiedCheckpoint | None)
    if found is not None:
        assert_type(found.files["config.json"], memoryview)
        load_state(found, model=torch.nn.Linear(4, 2))
    assert_type(resume_verified(ckpts, ["model.rank0.pt"]), VerifiedCheckpoint | None)
