"""The commit handle (``CheckpointDir.begin``) as a user calls it, checked by `mypy --strict`.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, assert_type

from atomic_ckpt import (
    Checkpoint,
    CheckpointDir,
    Commit,
    CommitStateError,
    RetentionPolicy,
    StagingLostError,
)


def begin_write_publish(ckpts: CheckpointDir, step: int) -> Checkpoint:
    commit = ckpts.begin(step, metadata={"epoch": 2})
    assert_type(commit, Commit)
    assert_type(commit.path, Path)
    assert_type(commit.final, Path)
    assert_type(commit.step, int)
    assert_type(commit.state, Literal["open", "published", "aborted"])
    assert_type(commit.metadata, dict[str, Any])
    assert_type(commit.retain, RetentionPolicy | None)
    (commit.path / "model.bin").write_bytes(b"weights")
    commit.metadata["val_loss"] = 0.25  # known only once the save is written
    checkpoint = commit.publish()
    assert_type(checkpoint, Checkpoint)
    assert_type(commit.publish(), Checkpoint)  # again: the same checkpoint
    commit.abort()  # a no-op once published
    return checkpoint


def as_a_context_manager(ckpts: CheckpointDir, step: int) -> Checkpoint:
    with ckpts.begin(step, retain=RetentionPolicy(keep_last=3)) as commit:
        assert_type(commit, Commit)
        (commit.path / "model.bin").write_bytes(b"weights")
    return commit.publish()  # published on leaving the block: returns its checkpoint


class StorageWriter:
    """The storage-writer pattern: begin in one method, publish in another, abort in finally."""

    def __init__(self, ckpts: CheckpointDir) -> None:
        self.ckpts = ckpts
        self.commit: Commit | None = None

    def prepare(self, step: int) -> Path:
        self.commit = self.ckpts.begin(step, metadata=None, retain=None)
        return self.commit.path

    def finish(self) -> Checkpoint:
        assert self.commit is not None
        try:
            return self.commit.publish(files=None)
        except (CommitStateError, StagingLostError) as exc:
            wrapped: RuntimeError | FileNotFoundError = exc  # also the builtins
            raise wrapped from None
        finally:
            self.commit.abort()

    def fail(self, exc: BaseException) -> None:
        if self.commit is not None:
            self.commit.abort(exc)
