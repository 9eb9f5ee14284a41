"""Deleting a checkpoint whose directory the filesystem will not rename aside (EXDEV: an
overlay's lower layer) removes it in place: its marker first, made durable by an fsync of
the directory before anything else goes; nothing is left beside the checkpoints."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l4_protocol import in_place as _in_place


@pytest.mark.parametrize("how", ["delete", "prune", "delete_named"])
def test_a_refused_rename_aside_removes_in_place_marker_first(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """EXDEV from the rename aside: the checkpoint goes, the marker's removal synced first."""
    with ckpts.commit_named("base") as path:
        (path / "f.bin").write_bytes(b"b" * 100)
    for step in (1, 2):
        with ckpts.commit(step) as path:
            (path / "sub").mkdir()
            (path / "sub" / "f.bin").write_bytes(b"f" * 100)
    target = ckpts.root / ("base" if how == "delete_named" else "1")
    events: list[str] = []
    real_rename, real_remove = _fs.rename, _fs.remove_tree

    def rename(src: Path, dst: Path) -> None:
        if Path(src) == target and ".tmp-del-" in Path(dst).name:
            events.append("refused")
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src))
        real_rename(src, dst)

    def remove_tree(path: Path) -> None:
        events.append("marker gone" if not (Path(path) / "checkpoint_complete").exists() else "?")
        real_remove(path)

    monkeypatch.setattr(_fs, "rename", rename)
    monkeypatch.setattr(_in_place._fs, "remove_tree", remove_tree)
    synced: list[Path] = []
    sync = ckpts._root.sync
    real_subdir = sync.subdir
    monkeypatch.setattr(
        type(sync), "subdir", lambda self, p: (synced.append(Path(p)), real_subdir(p))[1]
    )
    if how == "delete":
        ckpts.delete(1)
    elif how == "prune":
        assert ckpts.prune(keep_last=1) == [target]
    else:
        ckpts.delete("base")
    assert events[:2] == ["refused", "marker gone"]
    assert target in synced
    assert not os.path.lexists(target)
    left = {"2"} if how == "delete_named" else {"2", "base"}
    assert set(os.listdir(ckpts.root)) == left | ({"1"} if how == "delete_named" else set())
