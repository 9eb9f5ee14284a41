"""``atomic_ckpt.dcp`` and ``distributed.declare`` as a user calls them, checked by
`mypy --strict` against torch's own DCP types.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, assert_type

from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from atomic_ckpt import Checkpoint, CheckpointDir, RetentionPolicy
from atomic_ckpt.dcp import AtomicWriter, PendingSaveError, async_save, save
from atomic_ckpt.distributed import declare, distributed_commit


def train(ckpts: CheckpointDir, state: dict[str, Any], step: int) -> None:
    writer = AtomicWriter(
        ckpts, step, retain=RetentionPolicy(keep_last=2), thread_count=2, on_pending="raise"
    )
    dcp_save(state, storage_writer=writer)
    assert_type(writer.checkpoint, Checkpoint | None)
    assert_type(writer.error, BaseException | None)
    assert_type(save(state, ckpts, step, timeout=60.0), Path)
    pending = async_save(state, ckpts, step + 1)
    assert_type(pending, Future[None])
    try:
        pending.result()
    except PendingSaveError as exc:
        assert_type(exc.path, Path | None)
    last = ckpts.latest()
    if last is not None:
        dcp_load(state, checkpoint_id=last.path)
    with distributed_commit(ckpts, step + 2) as path:
        (path / "extra").mkdir()
        declare(path / "extra", path / "notes.txt")
