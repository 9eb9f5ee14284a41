"""Issue 29 attack fixes: a cwd inside the root, the lock by spelling, a symlink root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from atomic_ckpt.testing.audit import AuditError, audit
from atomic_ckpt.testing.audit._private import _name

WORKLOAD = [sys.executable, "-c", "open('model.pt', 'w').write('x')"]


def _tree(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


@pytest.mark.parametrize("inner", ["", "sub"])
def test_cwd_inside_root_is_refused_and_leaves_data(tmp_path: Path, inner: str) -> None:
    root = tmp_path / "ckpts"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("my notes\n")
    before = _tree(root)
    with pytest.raises(AuditError, match="inside the audited directory"):
        audit(WORKLOAD, "true", root=root, cwd=root / inner if inner else root)
    assert _tree(root) == before
    assert not (root / "model.pt").exists()


def test_cwd_inside_root_refused_from_process_cwd(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    root.mkdir()
    old = os.getcwd()
    os.chdir(root)
    try:
        with pytest.raises(AuditError, match="run it from outside"):
            audit(WORKLOAD, "true", root=root)
    finally:
        os.chdir(old)


def test_two_spellings_take_one_lock_name(tmp_path: Path) -> None:
    (tmp_path / "real" / "ckpts").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert _name(tmp_path / "alias" / "ckpts") == _name(tmp_path / "real" / "ckpts")


def test_symlink_root_names_its_target(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(AuditError, match="is a symlink"):
        audit(WORKLOAD, "true", root=tmp_path / "link", cwd=tmp_path)
    assert (tmp_path / "link").is_symlink()
