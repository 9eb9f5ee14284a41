"""Round 13b attack on issue 32 (carry), torch side: a carry into a commit whose publish
is given its file list by the caller (``distributed_commit``'s ranks, the DCP writer) is
refused when it is made, with a clear error, not at the end of the whole save."""

from __future__ import annotations

from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed")

from atomic_ckpt import CheckpointDir, CommitStateError  # noqa: E402


def test_a_carry_joined_into_a_distributed_commit_is_refused_at_once(tmp_path: Path) -> None:
    from atomic_ckpt.distributed import distributed_commit

    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "a").write_bytes(b"x" * 100)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    reached: list[str] = []

    def save() -> None:
        with distributed_commit(ckpts, 2) as path:
            (path / "b").write_bytes(b"y")
            with ckpts.commit(2, join=True, carry={"a": 1}):
                reached.append("the block")  # refused before the block runs

    try:
        with pytest.raises(CommitStateError, match="distributed"):
            save()
    finally:
        dist.destroy_process_group()
    assert reached == []
    assert [c.step for c in ckpts.checkpoints()] == [1]


def test_a_commit_nested_in_a_distributed_commit_of_its_step_is_refused(tmp_path: Path) -> None:
    """As inside ``ckpts.commit(2)``: a ``ckpts.commit(2, carry=...)`` (no ``join=True``)
    inside ``distributed_commit(ckpts, 2)`` would publish its part alone, then the outer
    commit would replace it (the carried file silently gone): refused, nothing staged."""
    from atomic_ckpt.distributed import distributed_commit

    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "a").write_bytes(b"x" * 100)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)

    def save() -> None:
        with distributed_commit(ckpts, 2) as path:
            (path / "b").write_bytes(b"y")
            with ckpts.commit(2, carry={"a": 1}):
                pass

    try:
        with pytest.raises(CommitStateError, match="already open in this thread"):
            save()
    finally:
        dist.destroy_process_group()
    assert [c.step for c in ckpts.checkpoints()] == [1]
