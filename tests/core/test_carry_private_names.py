"""The private names at which carried files wait for the publish can never be a name of
the checkpoint's own: a committed file that happens to be named like one (a checkpoint
copied from a staging directory, a file of another tool) is carried whole, not dropped
while the carry reports success, and a file the block writes at such a name is the
block's, committed beside the carried one."""

from __future__ import annotations

import os

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l4_protocol.carry import CARRYING

LOOKALIKES = [f"{CARRYING}.0.0", f"{CARRYING}.0.1", f"{CARRYING}.1.0"]


def _files(ckpts: CheckpointDir, step: int) -> dict[str, bytes]:
    path = ckpts.path_of(step)
    return {e.path: (path / e.path).read_bytes() for e in ckpts.get(step).manifest.files}


@pytest.mark.parametrize("name", LOOKALIKES)
def test_a_committed_file_named_like_a_waiting_name_is_carried(
    ckpts: CheckpointDir, name: str
) -> None:
    """Carried alone, in a subtree's company, or by a second carry: in the manifest and
    on disk with its bytes, and the new checkpoint verifies."""
    with ckpts.commit(1) as path:
        (path / name).write_bytes(b"A" * 1000)
        (path / "b.bin").write_bytes(b"B" * 1000)
    with ckpts.begin(2) as commit:
        commit.carry("b.bin", from_=1)
        commit.carry(name, from_=1)
    assert _files(ckpts, 2) == {name: b"A" * 1000, "b.bin": b"B" * 1000}
    ckpts.verify(2)


@pytest.mark.parametrize("name", LOOKALIKES)
def test_a_block_file_named_like_a_waiting_name_is_committed_beside_the_carry(
    ckpts: CheckpointDir, name: str
) -> None:
    """The block writes a file at such a name before carrying: both are committed."""
    with ckpts.commit(1) as path:
        (path / "b.bin").write_bytes(b"B" * 1000)
    with ckpts.begin(2) as commit:
        (commit.path / name).write_bytes(b"user")
        commit.carry("b.bin", from_=1)
    assert _files(ckpts, 2) == {name: b"user", "b.bin": b"B" * 1000}
    ckpts.verify(2)
    assert sorted(n for n in os.listdir(ckpts.root) if ".tmp-" in n) == []


def test_waiting_names_differ_from_commit_to_commit(ckpts: CheckpointDir) -> None:
    """Two commits' first carried files wait at different names (a random part): no name
    a checkpoint was committed with can be the one a later carry picks."""
    with ckpts.commit(1) as path:
        (path / "b.bin").write_bytes(b"B" * 1000)
    seen: list[str] = []
    for step in (2, 3):
        with ckpts.begin(step) as commit:
            commit.carry("b.bin", from_=1)
            seen.extend(n for n in os.listdir(commit.path) if n.startswith(CARRYING))
    assert len(seen) == 2
    assert seen[0] != seen[1]
