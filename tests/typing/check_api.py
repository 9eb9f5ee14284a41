"""The public API as a user calls it; `mypy --strict` on this file keeps the public types honest.

It is type-checked (never run) by tests/test_commit.py.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import assert_type

import atomic_ckpt
from atomic_ckpt import (
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    CheckpointNotFoundError,
    FileEntry,
    InvalidStepError,
    Manifest,
    StepConflictError,
    VerificationError,
)


def train_and_checkpoint(root: str | os.PathLike[str], step: int) -> None:
    ckpts = CheckpointDir(root, prefix="checkpoint-", durable=True)
    assert_type(ckpts.root, Path)
    with ckpts.commit(step, metadata={"epoch": 1, "loss": 0.5}) as path:
        assert_type(path, Path)
        (path / "model.bin").write_bytes(b"weights")

    with atomic_ckpt.commit(Path(root), step + 1) as path:
        assert_type(path, Path)

    assert_type(ckpts.steps(), list[int])
    assert_type(ckpts.checkpoints(), list[Checkpoint])
    assert_type(ckpts.path_of(step), Path)


def resume(root: Path) -> int:
    ckpts = CheckpointDir(root)
    last = ckpts.latest()
    assert_type(last, Checkpoint | None)
    if last is None:
        return 0
    assert_type(last.step, int)
    assert_type(last.path, Path)
    manifest = last.manifest
    assert_type(manifest, Manifest)
    assert_type(manifest.files, tuple[FileEntry, ...])
    assert_type(manifest.total_size, int)
    assert_type(manifest.legacy, bool)
    for entry in manifest.files:
        assert_type(entry.path, str)
        assert_type(entry.size, int)
        assert_type(entry.checksum, str | None)
    other = atomic_ckpt.latest(root, prefix="")
    assert_type(other, Checkpoint | None)
    return last.step + 1


def maintain(root: str) -> None:
    ckpts = CheckpointDir(root, durable=False, checksum="sha256", lock_timeout=10.0)
    assert_type(ckpts.clean(dry_run=True), list[Path])
    assert_type(ckpts.clean(), list[Path])
    assert_type(ckpts.prune(keep_last=3), list[Path])
    assert_type(ckpts.get(3), Checkpoint)
    assert_type(ckpts.verify(3), Checkpoint)
    assert_type(ckpts.mark_complete(3), Checkpoint)


def handle_errors(ckpts: CheckpointDir, step: int) -> str:
    try:
        ckpts.verify(step)
    except VerificationError as exc:
        assert_type(exc.path, Path | None)
        assert_type(exc.step, int | None)
        return str(exc)
    except CheckpointNotFoundError as exc:
        # Also a FileNotFoundError: callers may catch the builtin.
        missing: FileNotFoundError = exc
        return str(missing)
    try:
        with ckpts.commit(step):
            pass
    except (InvalidStepError, StepConflictError) as exc:
        err: CheckpointError = exc
        copy = pickle.loads(pickle.dumps(err))
        return repr(copy)
    except ValueError:
        return "bad input"
    return atomic_ckpt.__version__
