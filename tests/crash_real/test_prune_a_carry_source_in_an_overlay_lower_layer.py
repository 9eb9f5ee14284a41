"""A checkpoint root inside a container image (overlayfs: the image's checkpoints in the
lower layer, new ones written to the upper): the base checkpoint is carried from, then
``delete``/``prune`` removes it. overlayfs refuses to rename a directory of the lower
layer (EXDEV, without ``redirect_dir``), so removing it must not end in a bare
``OSError: [Errno 18] Invalid cross-device link`` out of the library's rename aside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _real_mounts import Mounter, why_not

from atomic_ckpt import CheckpointDir

pytestmark = pytest.mark.root


@pytest.mark.parametrize("how", ["delete", "prune"])
def test_removing_a_lower_layer_carry_source_works(
    mounter: Mounter, tmp_path: Path, how: str
) -> None:
    """The source goes (or a clear error says why it cannot); the carrier verifies."""
    reason = why_not("overlay")
    if reason is not None:
        pytest.skip(reason)
    image = tmp_path / "image"
    with CheckpointDir(image / "ckpts").commit(1) as path:
        (path / "frozen.bin").write_bytes(b"\0" * 100_000)
    fs = mounter.overlay(lower=image)
    ckpts = CheckpointDir(fs.path / "ckpts")
    with ckpts.begin(2) as commit:
        commit.carry("frozen.bin", from_=1)
    if how == "delete":
        ckpts.delete(1)
    else:
        ckpts.prune(keep_last=1)
    assert ckpts.steps() == [2]
    assert sorted(os.listdir(ckpts.root)) == ["2"]  # no lock file, nothing aside
    ckpts.verify(2)
