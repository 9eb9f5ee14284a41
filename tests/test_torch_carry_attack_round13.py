"""Round 13 attack on issue 32, torch-side: the integrations' dedup option.

``AtomicCheckpointIO(dedup=True)`` links a save to the previous one when their bytes are
equal. When the path saved already *is* that previous file (the same path saved again
with the same state, or ``last.ckpt`` already a link of the top-k file), renaming the
link over it is a no-op (rename(2) of two links of one inode does nothing): the
temporary link must not be left behind, holding the checkpoint's data alive after it is
replaced or removed (the opposite of what dedup is for).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")

import torch


def test_saving_the_same_bytes_again_leaves_no_temporary_link(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="needs the [lightning] extra")
    from atomic_ckpt.integrations.lightning import AtomicCheckpointIO

    state = {"state_dict": {"w": torch.arange(64.0)}, "epoch": 1}
    io = AtomicCheckpointIO(dedup=True)
    top, last = tmp_path / "epoch=1.ckpt", tmp_path / "last.ckpt"
    io.save_checkpoint(state, str(last))
    io.save_checkpoint(state, str(last))  # the same path, the same bytes
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
    io.save_checkpoint(state, str(top))  # linked to last.ckpt
    io.save_checkpoint(state, str(last))  # its previous save is already this inode
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt", "last.ckpt"]
    io.remove_checkpoint(str(top))
    assert os.lstat(last).st_nlink == 1  # nothing else keeps its data alive
    assert torch.equal(io.load_checkpoint(str(last))["state_dict"]["w"], torch.arange(64.0))
