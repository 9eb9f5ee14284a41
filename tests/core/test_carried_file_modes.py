"""A carried or deduplicated file keeps the permission bits its writer gave it, whatever
link the filesystem makes: a carry by reflink or copy (a new inode) takes its source's
mode, as a hard link (the same inode) has it; a dedup never links a written file to a
previous one whose mode differs (a hard link would silently change the written mode)."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l2_syscalls import share as _share

SCRIPT = b"#!/bin/sh\necho hi\n" * 64


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _old(path: Path) -> None:
    """Date ``path`` a minute back (not racily clean: carried and deduplicated by identity)."""
    old = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(old, old))


def _only(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """Make the filesystem offer only ``method`` (``"copy"`` or ``"reflink"``, the latter
    simulated by a copy, as a new inode is all a reflink's mode depends on); the calls
    of the simulated methods are recorded, to show the fault was hit."""
    hits: list[str] = []

    def no_link(*args: object, **kwargs: object) -> None:
        hits.append("link refused")
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(_share.os, "link", no_link)
    if method == "reflink":
        real_copy = _share._copy

        def clone(fd_in: int, dst: Path, *rest: object) -> bool:
            hits.append("reflink")
            real_copy(fd_in, dst, *rest)  # type: ignore[arg-type]
            return True

        monkeypatch.setattr(_share, "_reflink", clone)
    else:
        monkeypatch.setattr(_share, "_reflink", lambda fd_in, dst, *rest: False)
    return hits


@pytest.mark.parametrize("method", ["reflink", "copy"])
@pytest.mark.parametrize("mode", [0o755, 0o600, 0o444])
def test_a_carry_by_a_new_inode_keeps_the_source_files_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, mode: int
) -> None:
    """A file of mode 0755 (0600, 0444) carried by reflink or copy has that mode in the
    new checkpoint, as a hard link would; the carrier verifies."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "run.sh").write_bytes(SCRIPT)
        os.chmod(path / "run.sh", mode)
    hits = _only(monkeypatch, method)
    with ckpts.begin(2) as commit:
        assert commit.carry("run.sh", from_=1) == method
    assert hits  # the simulated filesystem was used
    assert hits[-1] in ("reflink", "link refused")
    assert _mode(ckpts.path_of(2) / "run.sh") == mode
    monkeypatch.undo()
    ckpts.verify(2)


def test_a_hard_linked_carry_has_the_source_files_mode(tmp_path: Path) -> None:
    """The reference the other methods match: a hard link is the source inode, its mode."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "run.sh").write_bytes(SCRIPT)
        os.chmod(path / "run.sh", 0o755)
    with ckpts.begin(2) as commit:
        how = commit.carry("run.sh", from_=1)
    if how != "hardlink":
        pytest.skip(f"this filesystem carried by {how}, not a hard link")
    assert _mode(ckpts.path_of(2) / "run.sh") == 0o755


def test_a_carry_never_gives_a_copy_the_set_id_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the permission bits are taken: a setgid or sticky source is copied without
    them (a copy made by this process must not become a privilege it did not have)."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "tool").write_bytes(SCRIPT)
        os.chmod(path / "tool", 0o2755 | stat.S_ISVTX)
    if not _mode(ckpts.path_of(1) / "tool") & (stat.S_ISGID | stat.S_ISVTX):
        pytest.skip("this filesystem dropped the setgid and sticky bits of the source")
    _only(monkeypatch, "copy")
    with ckpts.begin(2) as commit:
        assert commit.carry("tool", from_=1) == "copy"
    assert _mode(ckpts.path_of(2) / "tool") == 0o755


@pytest.mark.parametrize("written", [0o755, 0o600])
def test_a_dedup_never_links_a_file_to_one_of_another_mode(tmp_path: Path, written: int) -> None:
    """A written file equal in bytes to the previous checkpoint's but given another mode
    (an executable script, a private key) is kept as written, not linked to it; equal
    modes are linked."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        for name in ("run.sh", "same.sh"):
            (path / name).write_bytes(SCRIPT)
            os.chmod(path / name, 0o644)
            _old(path / name)
    with ckpts.begin(2, dedup=True) as commit:
        for name in ("run.sh", "same.sh"):
            (commit.path / name).write_bytes(SCRIPT)
        os.chmod(commit.path / "run.sh", written)
        os.chmod(commit.path / "same.sh", 0o644)
    assert set(commit.deduped) == {"same.sh"}  # the fault is real: dedup ran and linked
    assert _mode(ckpts.path_of(2) / "run.sh") == written
    assert _mode(ckpts.path_of(1) / "run.sh") == 0o644
    ckpts.verify(1)
    ckpts.verify(2)
