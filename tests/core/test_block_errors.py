"""An error raised by the caller's own code inside a block (reading a dataset shard it may
not read, a read-only mount of its own) propagates unchanged, the very exception, from
every API that runs such code: never turned into the library's RootNotWritableError
naming the checkpoint's directory. The staging (or temporary) entry is removed."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from treeutil import write

from atomic_ckpt import (
    TMP_INFIX,
    AsyncCommitter,
    CheckpointDir,
    RootNotWritableError,
    atomic_write,
)

ERRORS = {
    "EACCES": lambda: PermissionError(errno.EACCES, "Permission denied", "/data/shard-3.bin"),
    "EPERM": lambda: PermissionError(errno.EPERM, "Operation not permitted", "/data/x"),
    "EROFS": lambda: OSError(errno.EROFS, "Read-only file system", "/mnt/ro/out.bin"),
}


def leftovers(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if TMP_INFIX in n)


def _blocks(ckpts: CheckpointDir) -> dict[str, Callable[[], AbstractContextManager[Path]]]:
    """Every API that runs a block of the caller's code, on a root holding step 1."""
    return {
        "atomic_write": lambda: atomic_write(ckpts.root / "last.ckpt"),
        "commit": lambda: ckpts.commit(2),
        "begin": lambda: _handle(ckpts),
        "commit_named": lambda: ckpts.commit_named("interrupted"),
        "amend": lambda: ckpts.amend(1),
    }


def _handle(ckpts: CheckpointDir) -> AbstractContextManager[Path]:
    @contextlib.contextmanager
    def cm() -> Iterator[Path]:
        with ckpts.begin(2) as commit:
            yield commit.path

    return cm()


@pytest.mark.parametrize("make", ERRORS.values(), ids=ERRORS.keys())
@pytest.mark.parametrize("api", ["atomic_write", "commit", "begin", "commit_named", "amend"])
def test_the_blocks_own_error_propagates_unchanged(
    ckpts: CheckpointDir, api: str, make: Callable[[], OSError]
) -> None:
    """The same exception object comes out, not a RootNotWritableError; nothing is left."""
    with ckpts.commit(1) as path:
        write(path, {"model.bin": b"old"})
    (ckpts.root / "last.ckpt").write_bytes(b"old file")
    raised = make()

    def run() -> None:
        with _blocks(ckpts)[api]() as where:
            (where / "part.bin" if where.is_dir() else where).write_bytes(b"half")
            raise raised

    with pytest.raises(OSError, match=raised.strerror or "") as info:
        run()
    assert info.value is raised
    assert not isinstance(info.value, RootNotWritableError)
    assert leftovers(ckpts.root) == []
    assert ckpts.steps() == [1]
    assert (ckpts.root / "last.ckpt").read_bytes() == b"old file"


@pytest.mark.parametrize("make", ERRORS.values(), ids=ERRORS.keys())
def test_an_async_commits_own_error_is_raised_unchanged(
    ckpts: CheckpointDir, make: Callable[[], OSError]
) -> None:
    """A save function that raises PermissionError/EROFS in the background thread: wait()
    raises that exception, not a RootNotWritableError."""
    raised = make()

    def save(directory: Path) -> None:
        raise raised

    committer = AsyncCommitter(ckpts)
    committer.save(3, save)
    with pytest.raises(OSError, match=raised.strerror or "") as info:
        committer.wait()
    committer.close()
    assert info.value is raised
    assert ckpts.steps() == []


def test_atomic_write_names_the_directory_when_its_own_rename_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permission error of the library's own step (the rename into place) is still
    RootNotWritableError naming the directory (the fault is asserted hit)."""
    from atomic_ckpt._core.l2_syscalls import fs as _fs

    hits: list[Path] = []

    def rename(src: Path, dst: Path) -> None:
        hits.append(Path(dst))
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    monkeypatch.setattr(_fs, "rename", rename)
    with (
        pytest.raises(RootNotWritableError, match=str(tmp_path)),
        atomic_write(tmp_path / "x.bin") as tmp,
    ):
        tmp.write_bytes(b"x")
    assert hits == [tmp_path / "x.bin"]
    assert leftovers(tmp_path) == []
