"""Aliases on a filesystem that makes no symlinks (vfat, exFAT, some SMB mounts): an alias
is a symlink a user opens paths through, so there is no file stand-in as for
``checkpoint_best``; the commit is refused before the caller's block runs, naming the
missing symlink support, and an alias added later fails saying the checkpoint itself was
committed. (``os.symlink`` refused the way those filesystems refuse it.)"""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import TMP_INFIX, CheckpointDir, CheckpointError, SymlinksUnsupportedError


def refuse_symlinks(monkeypatch: pytest.MonkeyPatch, refusal: int) -> list[str]:
    refused: list[str] = []

    def refuse(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        refused.append(os.fspath(dst))
        raise OSError(refusal, os.strerror(refusal), os.fspath(dst))

    monkeypatch.setattr(os, "symlink", refuse)
    return refused


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP])
def test_a_commit_with_aliases_is_refused_before_its_block_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    """``commit(step, aliases=[...])`` where symlinks are refused: SymlinksUnsupportedError
    (an OSError with the refusal's errno) before the block writes anything, naming the
    missing support and what to do; nothing is left in the root, earlier steps untouched."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with ckpts.commit(1) as d:
        (d / "w").write_text("1")
    refused = refuse_symlinks(monkeypatch, refusal)
    ran = []
    with pytest.raises(SymlinksUnsupportedError) as info, ckpts.commit(2, aliases=["final"]):
        ran.append(True)
    assert refused  # the fault was hit
    assert ran == []
    assert isinstance(info.value, OSError)
    assert info.value.errno == refusal
    assert "makes no symlinks" in str(info.value)
    assert "aliases=" in str(info.value)
    assert ckpts.steps() == [1]
    assert [n for n in os.listdir(ckpts.root) if TMP_INFIX in n and "lock" not in n] == []
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, SymlinksUnsupportedError)
    assert again.errno == refusal
    assert again.path == info.value.path


def test_an_alias_added_after_begin_fails_saying_the_checkpoint_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alias set on the handle after ``begin`` (which had none to probe for): the
    checkpoint is committed and durable, and the error says so and what to do."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    refused = refuse_symlinks(monkeypatch, errno.EPERM)
    handle = ckpts.begin(3)
    (handle.path / "w").write_text("3")
    handle.aliases = ["final"]
    with pytest.raises(SymlinksUnsupportedError, match="is committed") as info:
        handle.publish()
    assert refused  # the fault was hit
    assert isinstance(info.value, CheckpointError)
    assert ckpts.steps() == [3]
    assert [n for n in os.listdir(ckpts.root) if TMP_INFIX in n and "lock" not in n] == []


def test_a_commit_without_aliases_needs_no_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No aliases asked for: nothing is probed, the commit goes through as ever."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    refused = refuse_symlinks(monkeypatch, errno.EPERM)
    with ckpts.commit(1) as d:
        (d / "w").write_text("1")
    assert ckpts.steps() == [1]
    assert refused == []
