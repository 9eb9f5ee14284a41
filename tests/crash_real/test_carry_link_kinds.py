"""Which link kind a carry makes on each real filesystem: a reflink on xfs and btrfs (shared
extents, separate inodes), a hard link on ext4 and tmpfs; each checkpoint verifies alone."""

from __future__ import annotations

import os

import pytest
from _real_mounts import Mounter, mount_or_skip

from atomic_ckpt import CheckpointDir

pytestmark = pytest.mark.root

EXPECTED = {"xfs": "reflink", "btrfs": "reflink", "ext4": "hardlink", "tmpfs": "hardlink"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_carry_uses_the_best_link_the_filesystem_has(mounter: Mounter, kind: str) -> None:
    """The carry reports the kind it made, the inodes match it, and removing the source
    leaves the carrier verifying."""
    fs = mount_or_skip(mounter, kind)
    ckpts = CheckpointDir(fs.path / "ckpts")
    with ckpts.commit(1) as path:
        (path / "frozen.bin").write_bytes(os.urandom(1 << 20))
    with ckpts.begin(2) as commit:
        how = commit.carry("frozen.bin", from_=1)
    assert how == EXPECTED[kind]
    src, dst = (os.lstat(ckpts.path_of(s) / "frozen.bin") for s in (1, 2))
    assert (src.st_ino == dst.st_ino) == (how == "hardlink")
    ckpts.delete(1)
    ckpts.verify(2)
