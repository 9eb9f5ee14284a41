"""Paths past PATH_MAX (round 15): a directory the user already has that holds one is
refused with a one-line reason before anything is copied; the walks that read a tree go
by descriptor, so none stops on ENAMETOOLONG or skips a subtree unseen."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

from atomic_ckpt.testing import audit
from atomic_ckpt.testing.audit._errors import AuditError
from atomic_ckpt.testing.audit._materialize import PATH_MAX, hard_linked, walk_tree


def _deep(root: Path, levels: int = 22) -> int:
    """``levels`` nested 202-character directories below ``root``; the bottom's descriptor."""
    fd = os.open(root, os.O_RDONLY)
    for i in range(levels):
        name = f"{i:02d}" + "d" * 200
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    return fd


def test_the_walk_reaches_below_path_max_and_sees_hard_links_there(tmp_path: Path) -> None:
    """walk_tree lists every entry of a tree deeper than PATH_MAX (os.walk skipped the
    subtree silently, so a hard link down there went unseen)."""
    root = tmp_path / "tree"
    root.mkdir()
    fd = _deep(root)
    os.close(os.open("a", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    os.link("a", "b", src_dir_fd=fd, dst_dir_fd=fd)
    os.close(fd)
    seen = [rel for rel, _, _, _ in walk_tree(root)]
    assert len(seen) == 24
    assert len(os.fsencode(seen[-1])) > PATH_MAX
    assert [p.rsplit("/", 1)[1] for p in hard_linked(root)] == ["a", "b"]


@needs_strace
def test_a_users_directory_past_path_max_is_refused_with_a_reason(tmp_path: Path) -> None:
    """The audit copies the user's directory by path: one holding a path past PATH_MAX is
    refused (AuditError, exit 2) naming the limit, and the directory is left as it was."""
    root = tmp_path / "ckpts"
    root.mkdir()
    fd = _deep(root)
    os.close(os.open("w.bin", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    os.close(fd)
    with pytest.raises(AuditError, match="PATH_MAX") as raised:
        audit([sys.executable, "-c", "pass"], "true", root=root, models=("kill",))
    assert "\n" not in str(raised.value)
    left = [rel.rsplit("/", 1)[-1] for rel, st, _, _ in walk_tree(root) if stat.S_ISREG(st.st_mode)]
    assert left == ["w.bin"]
