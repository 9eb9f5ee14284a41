"""The ``checkpoint_best`` pointer on a filesystem that makes no symlinks (vfat, exFAT, some
SMB mounts: ``symlink()`` fails with EPERM or EOPNOTSUPP): a small file naming the best
checkpoint instead, replaced atomically and durably, read by ``best()``, ``retain()`` and
``delete()`` as the link is. (vfat cannot be mounted here: ``os.symlink`` is refused the way
those filesystems refuse it.)"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import BEST_LINK, TMP_INFIX, CheckpointDir, StepConflictError
from atomic_ckpt._core.l2_syscalls import fs as _fs

LOGGER = "atomic_ckpt"


def refuse_symlinks(monkeypatch: pytest.MonkeyPatch, refusal: int) -> list[str]:
    """``os.symlink`` refused with ``refusal``; the list records each refusal."""
    refused: list[str] = []

    def refuse(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        refused.append(os.fspath(dst))
        raise OSError(refusal, os.strerror(refusal), os.fspath(dst))

    monkeypatch.setattr(os, "symlink", refuse)
    return refused


def root_with(path: Path, steps: dict[int, float]) -> CheckpointDir:
    ckpts = CheckpointDir(path)
    for step, loss in steps.items():
        with ckpts.commit(step, metadata={"loss": loss}) as d:
            (d / "w").write_bytes(str(step).encode())
    return ckpts


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP])
def test_set_best_writes_a_pointer_file_that_best_reads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refusal: int,
) -> None:
    """``set_best`` where symlinks are refused: ``checkpoint_best`` is a regular file naming
    the step's directory, ``best()`` returns that step, nothing temporary is left, and the
    fallback is said once per root."""
    ckpts = root_with(tmp_path / "ckpts", {1: 0.5, 2: 0.4, 3: 0.3})
    refused = refuse_symlinks(monkeypatch, refusal)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ckpts.set_best(2).step == 2
        assert ckpts.set_best(3).step == 3
    assert len(refused) == 2  # the fault was hit, each time
    pointer = ckpts.root / BEST_LINK
    assert pointer.is_file()
    assert not pointer.is_symlink()
    assert pointer.read_text() == "3\n"
    best = ckpts.best()
    assert best is not None
    assert best.step == 3
    assert [n for n in os.listdir(ckpts.root) if TMP_INFIX in n] == []
    assert caplog.text.count("makes no symlinks") == 1
    assert ckpts.steps() == [1, 2, 3]  # the pointer is never taken for a checkpoint
    ckpts.clean()  # nor for a leftover
    assert pointer.read_text() == "3\n"


def test_the_pointer_file_is_renamed_into_place_then_the_root_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durable before ``set_best`` returns: the file is written under a temporary name and
    fsynced, renamed over ``checkpoint_best``, and the root fsynced after the rename."""
    ckpts = root_with(tmp_path / "ckpts", {1: 0.5, 2: 0.4})
    refuse_symlinks(monkeypatch, errno.EPERM)
    events: list[str] = []
    real_fsync_fd, real_fsync_dir, real_replace = _fs.fsync_fd, _fs.fsync_dir, os.replace

    def fsync_fd(fd: int) -> None:
        events.append("fsync file")
        real_fsync_fd(fd)

    def fsync_dir(path: Any) -> None:
        events.append(f"fsync dir {Path(path).name}")
        real_fsync_dir(path)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append(f"rename to {Path(dst).name}")
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(_fs, "fsync_fd", fsync_fd)
    monkeypatch.setattr(_fs, "fsync_dir", fsync_dir)
    monkeypatch.setattr(os, "replace", replace)
    ckpts.set_best(2)
    at = events.index(f"rename to {BEST_LINK}")
    assert events[at - 1 : at + 2] == ["fsync file", events[at], "fsync dir ckpts"], events


def test_retain_and_delete_honour_the_pointer_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retain(metric=...)`` moves the pointer file and never deletes what it names;
    ``delete`` refuses the step it names unless ``force``, which removes the file too."""
    ckpts = root_with(tmp_path / "ckpts", {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.7, 5: 0.8})
    refuse_symlinks(monkeypatch, errno.EOPNOTSUPP)
    ckpts.retain(keep_last=1, metric="loss", mode="min")
    assert ckpts.steps() == [2, 5]
    best = ckpts.best()
    assert best is not None
    assert best.step == 2
    with pytest.raises(StepConflictError, match="best checkpoint"):
        ckpts.delete(2)
    ckpts.delete(2, force=True)
    assert not os.path.lexists(ckpts.root / BEST_LINK)
    assert ckpts.best() is None


def test_a_link_replaces_the_file_once_symlinks_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root copied from vfat to ext4 (a pointer file there): the next ``set_best`` makes
    the usual symlink over it."""
    ckpts = root_with(tmp_path / "ckpts", {1: 0.5, 2: 0.4})
    with monkeypatch.context() as m:
        refuse_symlinks(m, errno.EPERM)
        ckpts.set_best(1)
    assert (ckpts.root / BEST_LINK).is_file()
    ckpts.set_best(2)
    assert os.readlink(ckpts.root / BEST_LINK) == "2"
    best = ckpts.best()
    assert best is not None
    assert best.step == 2


@pytest.mark.parametrize(
    "content",
    [b"../elsewhere/3\n", b"/etc/3\n", b"3/w\n", b"\xff\xfe\n", b"3" * 5000, b"", b"7\n"],
)
def test_a_pointer_file_naming_nothing_valid_is_no_best(tmp_path: Path, content: bytes) -> None:
    """A checkpoint root is untrusted input: a pointer file naming a path out of the root,
    something inside a checkpoint, undecodable or oversized bytes, nothing, or a step that
    is not there, is no best (``best()`` is None), and nothing is followed."""
    ckpts = root_with(tmp_path / "ckpts", {3: 0.5})
    (ckpts.root / BEST_LINK).write_bytes(content)
    assert ckpts.best() is None
    ckpts.delete(3)  # not protected by a pointer that names nothing valid


def test_a_fifo_planted_as_the_pointer_is_no_best_and_never_blocks(tmp_path: Path) -> None:
    """A FIFO at ``checkpoint_best`` is not read (an open for reading would wait for a
    writer forever): no best."""
    ckpts = root_with(tmp_path / "ckpts", {3: 0.5})
    os.mkfifo(ckpts.root / BEST_LINK)
    assert ckpts.best() is None


def test_a_refusal_on_a_root_that_cannot_be_written_is_not_taken_for_missing_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EPERM from a root the process may not write (not a filesystem without symlinks):
    ``set_best`` raises it as before, writing nothing."""
    ckpts = root_with(tmp_path / "ckpts", {1: 0.5})
    refuse_symlinks(monkeypatch, errno.EPERM)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)
    with pytest.raises(PermissionError):
        ckpts.set_best(1)
    assert not os.path.lexists(ckpts.root / BEST_LINK)


@pytest.mark.parametrize("prefix", ["", "checkpoint-"])
def test_clean_removes_the_pointer_file_a_killed_set_best_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    """A ``set_best`` killed between writing the pointer file under its ``.tmp-`` name and
    the rename leaves that file (a regular file, where the link form leaves a link):
    ``clean()`` removes it, and the old pointer still names the old best."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    for step in (1, 2):
        with ckpts.commit(step) as d:
            (d / "w").write_text(str(step))
    refuse_symlinks(monkeypatch, errno.EPERM)
    ckpts.set_best(1)

    def killed(src: Any, dst: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed before the rename")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", killed)
        m.setattr(os, "unlink", lambda *a, **k: None)  # a kill removes nothing
        with pytest.raises(KeyboardInterrupt):
            ckpts.set_best(2)
    left = [n for n in os.listdir(ckpts.root) if TMP_INFIX in n and BEST_LINK in n]
    assert len(left) == 1  # the fault was hit: the temporary is there
    assert (ckpts.root / left[0]).is_file()
    assert [p.name for p in ckpts.clean()] == left
    assert [n for n in os.listdir(ckpts.root) if BEST_LINK in n] == [BEST_LINK]
    best = ckpts.best()
    assert best is not None
    assert best.step == 1
