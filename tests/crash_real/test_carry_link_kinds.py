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


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_carrier_is_carried_on_unhashed_and_a_racy_source_is_hashed(
    mounter: Mounter, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first carry of a file written just before its commit hashes it (racily clean);
    the carrier (a reflink keeps its source's mtime, a hard link shares it) is carried on
    from the next checkpoint without being read."""
    from atomic_ckpt._core.l4_protocol import carry as _carry

    fs = mount_or_skip(mounter, kind)
    ckpts = CheckpointDir(fs.path / "ckpts")
    with ckpts.commit(1) as path:
        (path / "frozen.bin").write_bytes(os.urandom(1 << 20))
    hashed: list[object] = []
    real = _carry.checksum_file
    monkeypatch.setattr(_carry, "checksum_file", lambda *a: hashed.append(a) or real(*a))
    with ckpts.begin(2) as commit:
        commit.carry("frozen.bin", from_=1)
    assert len(hashed) == 1  # racily clean: written in the commit's last moments
    marker = ckpts.path_of(2) / "checkpoint_complete"
    later = os.stat(marker).st_mtime_ns + 10 * 10**9  # the next save, 10 s later
    os.utime(marker, ns=(later, later))
    src, dst = (os.lstat(ckpts.path_of(s) / "frozen.bin") for s in (1, 2))
    assert src.st_mtime_ns == dst.st_mtime_ns
    with ckpts.begin(3) as commit:
        commit.carry("frozen.bin", from_=2)
    assert len(hashed) == 1
    ckpts.delete(1)
    ckpts.delete(2)
    ckpts.verify(3)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_carried_file_keeps_its_mode_on_every_filesystem(mounter: Mounter, kind: str) -> None:
    """An executable file carried by a real reflink (xfs, btrfs) or hard link (ext4, tmpfs)
    is executable in the new checkpoint too; a subtree's symlinks are carried as links."""
    import stat

    fs = mount_or_skip(mounter, kind)
    ckpts = CheckpointDir(fs.path / "ckpts")
    with ckpts.commit(1) as path:
        (path / "tools").mkdir()
        (path / "tools" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
        os.chmod(path / "tools" / "run.sh", 0o750)
        os.symlink("/etc/passwd", path / "tools" / "outside")
    with ckpts.begin(2) as commit:
        assert commit.carry("tools/", from_=1) == EXPECTED[kind]
    carried = ckpts.path_of(2) / "tools"
    assert stat.S_IMODE(os.lstat(carried / "run.sh").st_mode) == 0o750
    assert os.readlink(carried / "outside") == "/etc/passwd"  # a link, never followed
    ckpts.delete(1)
    ckpts.verify(2)


def test_a_source_on_another_filesystem_is_copied_and_verified(mounter: Mounter) -> None:
    """Step 1 bind-mounted from a tmpfs over the root on ext4 (a link across it is EXDEV):
    the carry copies, after hashing the source (its inode is not the committed one), and
    the carrier verifies once the source is gone."""
    import shutil
    import subprocess

    fs = mount_or_skip(mounter, "ext4")
    other = mount_or_skip(mounter, "tmpfs")
    ckpts = CheckpointDir(fs.path / "ckpts")
    with ckpts.commit(1) as path:
        (path / "frozen.bin").write_bytes(os.urandom(1 << 20))
    shutil.copytree(ckpts.path_of(1), other.path / "1", symlinks=True)
    subprocess.run(["mount", "--bind", str(other.path / "1"), str(ckpts.path_of(1))], check=True)
    try:
        assert os.stat(ckpts.path_of(1)).st_dev != os.stat(ckpts.root).st_dev
        with ckpts.begin(2) as commit:
            assert commit.carry("frozen.bin", from_=1) == "copy"
    finally:
        subprocess.run(["umount", str(ckpts.path_of(1))], check=True)
    ckpts.delete(1)
    ckpts.verify(2)
