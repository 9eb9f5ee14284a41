"""The core API as a user calls it; `mypy --strict` on this file keeps the public types honest.

Type-checked (never run) by tests/typing/test_typing.py, with the other check_*.py files.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Literal, assert_type

import atomic_ckpt
from atomic_ckpt import (
    BEST_LINK,
    MARKER,
    TMP_INFIX,
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    CheckpointNotFoundError,
    Entry,
    FileEntry,
    InvalidStepError,
    Manifest,
    NoSync,
    StepConflictError,
    SyncPolicy,
    VerificationError,
    parse_step,
)


class NumpyLikeInt:
    """A step from an array library (``numpy.int64``, a 0-d tensor): an int by ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def train_and_checkpoint(root: str | os.PathLike[str], step: int) -> None:
    ckpts = CheckpointDir(root, prefix="checkpoint-", durable=True)
    assert_type(ckpts.root, Path)
    assert_type(ckpts.prefix, str)
    assert_type(ckpts.durable, bool)
    assert_type(ckpts.checksum, str | None)
    with ckpts.commit(step, metadata={"epoch": 1, "loss": 0.5}) as path:
        assert_type(path, Path)
        (path / "model.bin").write_bytes(b"weights")

    with atomic_ckpt.commit(Path(root), step + 1) as path:
        assert_type(path, Path)
    with atomic_ckpt.commit(root, step + 2, prefix="ckpt-", durable=False, metadata={}) as path:
        assert_type(path, Path)

    assert_type(ckpts.steps(), list[int])
    assert_type(ckpts.checkpoints(), list[Checkpoint])
    assert_type(ckpts.path_of(step), Path)


def steps_that_are_not_plain_ints(ckpts: CheckpointDir, step: NumpyLikeInt) -> None:
    """Every ``step`` parameter is ``SupportsIndex``: an array library's integer type-checks."""
    with ckpts.commit(step) as path:
        assert_type(path, Path)
    with atomic_ckpt.commit(ckpts.root, step) as path:
        assert_type(path, Path)
    assert_type(ckpts.path_of(step), Path)
    assert_type(ckpts.dir_of(step), Path)
    assert_type(ckpts.dir_of("interrupted"), Path)
    assert_type(ckpts.delete(step), Path)
    assert_type(ckpts.delete("interrupted", missing_ok=True), Path | None)
    assert_type(ckpts.mark_complete(step, require=["model.pt"]), Checkpoint)
    assert_type(ckpts.resume_plan().resume(fresh=True), Checkpoint | None)
    with ckpts.commit(step, replace_unusable=True) as replaced:
        assert_type(replaced, Path)
    assert_type(ckpts.get(step), Checkpoint)
    assert_type(ckpts.verify(step), Checkpoint)
    assert_type(ckpts.mark_complete(step), Checkpoint)
    assert_type(ckpts.begin(step).publish(), Checkpoint)


def choose_durability(root: Path) -> None:
    """``sync=`` takes a SyncPolicy (a subclass switches one step off); ``workers=`` an int."""
    default = CheckpointDir(root, workers=4)
    assert_type(default.sync, SyncPolicy)
    assert_type(default.workers, int)
    CheckpointDir(root, sync=NoSync(), workers=None)
    CheckpointDir(root, sync=SyncPolicy(), durable=True, checksum=None, lock_timeout=-1)

    class NoRootSync(SyncPolicy):
        """A user's policy: every step but the root fsync (e.g. a filesystem that has none)."""

        def root(self, path: Path) -> None:
            assert_type(path, Path)

    ckpts = CheckpointDir(root, sync=NoRootSync())
    assert_type(ckpts.sync.durable, bool)
    policy: SyncPolicy = NoSync()
    policy.start_file(root / "model.bin")
    policy.file(root / "model.bin")
    policy.subdir(root)
    policy.marker(root, b"{}", tmp=None)
    policy.staging(root)
    policy.root(root)


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
    assert_type(manifest.step, int | None)
    assert_type(manifest.files, tuple[FileEntry, ...])
    assert_type(manifest.total_size, int)
    assert_type(manifest.legacy, bool)
    assert_type(manifest.checksum, str | None)
    assert_type(manifest.created, float | None)
    loss = manifest.metadata.get("loss")
    del loss  # metadata is a Mapping[str, Any]: any JSON value
    for entry in manifest.files:
        assert_type(entry.path, str)
        assert_type(entry.type, Literal["file", "dir", "symlink"])
        assert_type(entry.size, int)
        assert_type(entry.checksum, str | None)
        assert_type(entry.target, str | None)
    other = atomic_ckpt.latest(root, prefix="")
    assert_type(other, Checkpoint | None)
    verified = ckpts.latest(verify=True)
    assert_type(verified, Checkpoint | None)
    return last.step + 1


def inspect(root: str) -> list[str]:
    """What ``atomic-ckpt ls`` shows, from Python."""
    ckpts = CheckpointDir(root)
    entries = ckpts.entries(include_staging=True)
    assert_type(entries, list[Entry])
    assert_type(ckpts.entries(), list[Entry])
    out: list[str] = []
    for e in entries:
        assert_type(e.name, str)
        assert_type(e.path, Path)
        assert_type(e.step, int | None)
        assert_type(e.status, Literal["complete", "unmarked", "invalid", "staging"])
        assert_type(e.manifest, Manifest | None)
        assert_type(e.problem, str | None)
        out.append(f"{e.name}: {e.status}")
    step = parse_step("checkpoint-12", "checkpoint-")
    assert_type(step, int | None)
    assert_type(parse_step("12"), int | None)
    assert_type(MARKER, str)
    assert_type(TMP_INFIX, str)
    assert_type(BEST_LINK, str)
    return out


def maintain(root: str) -> None:
    ckpts = CheckpointDir(root, durable=False, checksum="sha256", lock_timeout=10.0)
    assert_type(ckpts.clean(dry_run=True), list[Path])
    assert_type(ckpts.clean(), list[Path])
    assert_type(ckpts.prune(keep_last=3), list[Path])
    assert_type(ckpts.get(3), Checkpoint)
    assert_type(ckpts.verify(3), Checkpoint)
    assert_type(ckpts.mark_complete(3), Checkpoint)
    assert_type(ckpts.best(), Checkpoint | None)


def assemble_a_commit_by_hand(ckpts: CheckpointDir, directory: Path) -> list[FileEntry]:
    """Step 3 for code that fsyncs its own tree (a multi-rank commit)."""
    assert_type(ckpts.checksum_file(directory / "model.bin"), str | None)
    assert_type(ckpts.sync_tree(str(directory), hash=False), list[FileEntry])
    return ckpts.sync_tree(directory)


def handle_errors(ckpts: CheckpointDir, step: int) -> str:
    try:
        ckpts.verify(step)
    except VerificationError as exc:
        assert_type(exc.path, Path | None)
        assert_type(exc.step, int | None)
        assert_type(exc.problems, tuple[str, ...])
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
