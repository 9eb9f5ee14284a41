"""The commit handle, ``CheckpointDir.begin(step)``: what a user who cannot wrap a save in one
``with`` block (a storage writer, an asynchronous or multi-rank save) relies on."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from treeutil import contents, snapshot, write

from atomic_ckpt import (
    MARKER,
    Checkpoint,
    CheckpointDir,
    Commit,
    CommitStateError,
    InvalidStepError,
    RetentionPolicy,
    StagingLostError,
)
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l3_formats.marker import FLOAT_KEY

STAGING_RE = re.compile(r"\.tmp-(?P<name>.+)\.[0-9a-f]{32}")
OLD = {"model.bin": b"old model", "old_only.txt": b"only in the old save"}
NEW = {"model.bin": b"new model, longer", "opt/state.pt": b"adam" * 25}


class NumpyLikeInt:
    """An array library's integer (``numpy.int64``): an int only through ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def committed(ckpts: CheckpointDir, step: int, files: dict[str, bytes]) -> Checkpoint:
    """Commit ``files`` as ``step`` the ordinary way, with ``commit()``."""
    with ckpts.commit(step) as path:
        write(path, files)
    return ckpts.get(step)


def lock_file(commit: Commit) -> Path:
    """The staging lock a writer holds beside its staging dir."""
    return commit.path.with_name(commit.path.name + ".lock")


def leftovers(ckpts: CheckpointDir) -> set[str]:
    """What the root holds besides complete step directories and the root lock."""
    return set(os.listdir(ckpts.root)) - {ROOT_LOCK} - {str(s) for s in ckpts.steps()}


# ---------------------------------------------------------------- begin, write, publish


def test_begin_write_publish_makes_the_same_checkpoint_as_commit(tmp_path: Path) -> None:
    """begin() + writing into .path + publish() commits exactly what commit() commits."""
    by_handle = CheckpointDir(tmp_path / "handle", checksum="crc32")
    by_block = CheckpointDir(tmp_path / "block", checksum="crc32")
    commit = by_handle.begin(5, metadata={"epoch": 3})
    write(commit.path, NEW)
    (commit.path / "best").symlink_to("model.bin")
    ckpt = commit.publish()
    with by_block.commit(5, metadata={"epoch": 3}) as path:
        write(path, NEW)
        (path / "best").symlink_to("model.bin")
    reference = by_block.get(5)
    assert isinstance(ckpt, Checkpoint)
    assert ckpt == by_handle.get(5)
    assert (ckpt.step, ckpt.path) == (5, by_handle.path_of(5))
    assert ckpt.manifest.files == reference.manifest.files
    assert ckpt.manifest.metadata == reference.manifest.metadata == {"epoch": 3}
    assert ckpt.manifest.checksum == reference.manifest.checksum
    assert contents(ckpt.path) == contents(reference.path) == NEW
    assert sorted(os.listdir(ckpt.path)) == sorted(os.listdir(reference.path))
    assert by_handle.verify(5) == ckpt
    assert commit.state == "published"
    assert set(os.listdir(by_handle.root)) == {"5"}


def test_the_handle_is_a_staging_dir_that_becomes_path_of_step(tmp_path: Path) -> None:
    """.path is a fresh empty `.tmp-checkpoint-N.<uuid>` dir beside the checkpoints; .final is
    path_of(N)."""
    ckpts = CheckpointDir(tmp_path, prefix="checkpoint-")
    commit = ckpts.begin(7)
    assert commit.step == 7
    assert commit.state == "open"
    assert commit.final == ckpts.path_of(7) == tmp_path / "checkpoint-7"
    assert commit.path.parent == ckpts.root
    match = STAGING_RE.fullmatch(commit.path.name)
    assert match is not None
    assert match["name"] == "checkpoint-7"
    assert commit.path.is_dir()
    assert list(commit.path.iterdir()) == []
    assert lock_file(commit).is_file()
    assert not commit.final.exists()
    assert ckpts.steps() == []
    assert [(e.path, e.status) for e in ckpts.entries(include_staging=True)] == [
        (commit.path, "staging")
    ]
    commit.publish()
    assert not commit.path.exists()
    assert not lock_file(commit).exists()
    assert commit.final.is_dir()
    assert (commit.final / MARKER).is_file()


def test_a_step_may_be_any_integer_with_index(ckpts: CheckpointDir) -> None:
    """A numpy-like integer step (SupportsIndex) is accepted and stored as a plain int."""
    commit = ckpts.begin(NumpyLikeInt(4))
    assert commit.step == 4
    assert type(commit.step) is int
    ckpt = commit.publish()
    assert ckpt.step == 4
    assert ckpts.steps() == [4]
    assert json.loads((ckpt.path / MARKER).read_bytes())["step"] == 4


def test_begin_refuses_a_bad_step_or_metadata_before_creating_anything(
    ckpts: CheckpointDir,
) -> None:
    """An invalid step or metadata fails begin() itself; no root, staging dir or lock is made."""
    with pytest.raises(InvalidStepError):
        ckpts.begin(-1)
    with pytest.raises(ValueError, match="JSON"):
        ckpts.begin(1, metadata={"tags": {"a set"}})
    assert not ckpts.root.exists()


# ---------------------------------------------------------------- metadata


def test_metadata_changed_after_begin_lands_in_the_manifest(ckpts: CheckpointDir) -> None:
    """A metric known only after the save (a validation loss) set on .metadata is recorded."""
    given = {"epoch": 1}
    commit = ckpts.begin(3, metadata=given)
    assert commit.metadata == {"epoch": 1}
    write(commit.path, NEW)
    commit.metadata["val_loss"] = 0.25
    commit.metadata["epoch"] = 2
    ckpt = commit.publish()
    assert ckpt.manifest.metadata == {"epoch": 2, "val_loss": 0.25}
    assert ckpts.get(3).manifest.metadata == {"epoch": 2, "val_loss": 0.25}
    assert json.loads((ckpt.path / MARKER).read_bytes())["metadata"] == {
        "epoch": 2,
        "val_loss": 0.25,
    }
    assert given == {"epoch": 1}  # the handle holds a copy: the caller's dict is left alone


def _set_a_set(metadata: dict[str, Any]) -> None:
    metadata["tags"] = {"best"}


def _set_the_reserved_key(metadata: dict[str, Any]) -> None:
    metadata["val"] = {FLOAT_KEY: "NaN"}


def _set_an_int_key(metadata: dict[str, Any]) -> None:
    cast(dict[Any, Any], metadata)[1] = "one"


@pytest.mark.parametrize("spoil", [_set_a_set, _set_the_reserved_key, _set_an_int_key])
def test_invalid_metadata_set_after_begin_fails_publish_and_leaves_nothing(
    ckpts: CheckpointDir, spoil: Any
) -> None:
    """Metadata made invalid after begin() fails publish() (ValueError/TypeError), cleanly."""
    old = committed(ckpts, 1, OLD)
    before = snapshot(ckpts.root)
    commit = ckpts.begin(2, metadata={"epoch": 1})
    write(commit.path, NEW)
    spoil(commit.metadata)
    with pytest.raises((ValueError, TypeError)):
        commit.publish()
    assert commit.state == "aborted"
    assert not commit.path.exists()
    assert not lock_file(commit).exists()
    assert ckpts.steps() == [1]
    assert ckpts.verify(1) == old
    assert snapshot(ckpts.root) == before
    with pytest.raises(CommitStateError):
        commit.publish()


def test_nan_and_infinities_in_metadata_round_trip_as_standard_json(ckpts: CheckpointDir) -> None:
    """A diverged run's NaN loss (and infinities, nested too) are recorded losslessly: the
    marker stays standard JSON, and the manifest gives the floats back."""
    metadata = {"val_loss": math.nan, "range": [-math.inf, 1.5, math.inf], "ok": {"x": 2}}
    with ckpts.commit(1, metadata=metadata) as path:
        write(path, NEW)
    marker = (ckpts.path_of(1) / MARKER).read_text()

    def no_constants(name: str) -> object:
        raise AssertionError(f"the marker holds {name}, which is not standard JSON")

    doc = json.loads(marker, parse_constant=no_constants)
    assert doc["metadata"]["val_loss"] == {FLOAT_KEY: "NaN"}
    got = ckpts.get(1).manifest.metadata
    assert math.isnan(got["val_loss"])
    assert got["range"] == [-math.inf, 1.5, math.inf]
    assert got["ok"] == {"x": 2}
    assert ckpts.verify(1).step == 1


def test_a_nan_metric_never_ranks_as_best(ckpts: CheckpointDir) -> None:
    """Retention by a metric treats a NaN (a diverged run) as no value, not as the best."""
    for step, loss in ((1, 0.5), (2, math.nan), (3, 0.9)):
        with ckpts.commit(step, metadata={"loss": loss}) as path:
            write(path, NEW)
    ckpts.retain(keep_last=1, keep_best=1, metric="loss")
    assert ckpts.steps() == [1, 3]


def test_metadata_may_not_use_the_key_that_encodes_non_finite_floats(
    ckpts: CheckpointDir,
) -> None:
    """The reserved key is refused up front with a message naming it."""
    with pytest.raises(ValueError, match="reserved"):
        ckpts.begin(1, metadata={"nested": {FLOAT_KEY: "NaN"}})
    assert not ckpts.root.exists()


# ---------------------------------------------------------------- abort


def test_abort_removes_the_staging_dir_and_its_lock_and_nothing_else(
    ckpts: CheckpointDir,
) -> None:
    """abort() of a rewrite removes its staging dir and lock file; the old step is untouched."""
    old = committed(ckpts, 1, OLD)
    committed(ckpts, 2, OLD)
    before = snapshot(ckpts.root)
    for step in (1, 3):  # a rewrite of an existing step, and a new step
        commit = ckpts.begin(step)
        write(commit.path, NEW)
        assert lock_file(commit).exists()
        commit.abort()
        assert commit.state == "aborted"
        assert not commit.path.exists()
        assert not lock_file(commit).exists()
    assert snapshot(ckpts.root) == before
    assert ckpts.steps() == [1, 2]
    assert ckpts.verify(1) == old
    assert contents(ckpts.path_of(1)) == OLD


def test_abort_is_idempotent(ckpts: CheckpointDir) -> None:
    """A second (and third) abort() does nothing and raises nothing."""
    commit = ckpts.begin(1)
    commit.abort()
    commit.abort()
    commit.abort(RuntimeError("from a finally block"))
    assert commit.state == "aborted"
    assert leftovers(ckpts) == set()


def test_abort_after_publish_is_a_no_op(ckpts: CheckpointDir) -> None:
    """abort() after publish() leaves the new checkpoint in place, complete and verified."""
    commit = ckpts.begin(1)
    write(commit.path, NEW)
    ckpt = commit.publish()
    marker = (ckpt.path / MARKER).read_bytes()
    commit.abort()
    commit.abort(RuntimeError("late"))
    assert commit.state == "published"
    assert ckpts.steps() == [1]
    assert ckpts.verify(1) == ckpt
    assert contents(ckpt.path) == NEW
    assert (ckpt.path / MARKER).read_bytes() == marker


def test_publish_after_abort_is_a_commit_state_error(ckpts: CheckpointDir) -> None:
    """publish() of an aborted commit raises CommitStateError (a RuntimeError); nothing appears."""
    commit = ckpts.begin(4)
    write(commit.path, NEW)
    commit.abort()
    with pytest.raises(CommitStateError, match="aborted") as info:
        commit.publish()
    assert isinstance(info.value, RuntimeError)
    assert info.value.step == 4
    assert commit.state == "aborted"
    assert ckpts.steps() == []
    assert not commit.final.exists()
    assert leftovers(ckpts) == set()


def test_a_failed_cleanup_is_a_note_on_the_error_given_to_abort(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """abort(exc) never raises instead of exc: a cleanup failure becomes a note on it."""
    calls: list[Path] = []

    def remove_tree(path: Path) -> None:
        calls.append(Path(path))
        raise OSError(5, "Input/output error (injected)", str(path))

    commit = ckpts.begin(1)
    monkeypatch.setattr(_fs, "remove_tree", remove_tree)
    error = RuntimeError("the save failed")
    commit.abort(error)
    assert calls == [commit.path]
    assert any("also failed" in note for note in getattr(error, "__notes__", []))
    assert commit.state == "aborted"
    monkeypatch.undo()
    assert commit.path.is_dir()  # left for clean(), which finishes the job
    removed = {p.name for p in ckpts.clean()}
    assert removed == {commit.path.name, lock_file(commit).name}
    assert leftovers(ckpts) == set()


# ---------------------------------------------------------------- publish


def test_publish_twice_returns_the_same_checkpoint(ckpts: CheckpointDir) -> None:
    """A second publish() returns the checkpoint of the first and commits nothing again."""
    commit = ckpts.begin(2)
    write(commit.path, NEW)
    first = commit.publish()
    before = snapshot(ckpts.root)
    second = commit.publish()
    assert second is first
    assert snapshot(ckpts.root) == before
    assert ckpts.get(2) == first


def test_publish_of_a_staging_dir_deleted_and_recreated_is_staging_lost(
    ckpts: CheckpointDir,
) -> None:
    """A staging dir replaced by a new one of the same name is StagingLostError; nothing commits."""
    old = committed(ckpts, 1, OLD)
    commit = ckpts.begin(1)
    write(commit.path, NEW)
    shutil.rmtree(commit.path)
    commit.path.mkdir()
    write(commit.path, NEW)
    with pytest.raises(StagingLostError) as info:
        commit.publish()
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.path == commit.path
    assert info.value.step == 1
    assert commit.state == "aborted"
    assert ckpts.verify(1) == old
    assert contents(ckpts.path_of(1)) == OLD
    assert not commit.path.exists()
    assert not lock_file(commit).exists()
    assert leftovers(ckpts) == set()


def test_retain_given_to_begin_prunes_once_published(ckpts: CheckpointDir) -> None:
    """begin(retain=RetentionPolicy(keep_last=1)) deletes the older steps after publish only."""
    committed(ckpts, 1, OLD)
    committed(ckpts, 2, OLD)
    commit = ckpts.begin(3, retain=RetentionPolicy(keep_last=1))
    assert commit.retain == RetentionPolicy(keep_last=1)
    write(commit.path, NEW)
    assert ckpts.steps() == [1, 2]  # nothing is deleted before the new step is durable
    ckpt = commit.publish()
    assert ckpts.steps() == [3]
    assert ckpts.verify(3) == ckpt
    assert leftovers(ckpts) == set()


def test_two_handles_of_one_step_from_two_threads_each_commit_whole_and_the_last_wins(
    ckpts: CheckpointDir,
) -> None:
    """Two open commits of the same step, begun in two threads: each publish is complete;
    the last published stays. (In one thread the second is refused while the first is
    open: tests/core/test_nested_in_a_begin_handle.py.)"""
    first = ckpts.begin(1)
    made: list[Commit] = []
    thread = threading.Thread(target=lambda: made.append(ckpts.begin(1)))
    thread.start()
    thread.join(60)
    (second,) = made
    assert first.path != second.path
    write(first.path, OLD)
    write(second.path, NEW)
    second.publish()
    assert contents(ckpts.path_of(1)) == NEW
    first.publish()
    assert contents(ckpts.path_of(1)) == OLD
    ckpts.verify(1)
    assert leftovers(ckpts) == set()


# ---------------------------------------------------------------- as a context manager


def test_as_a_context_manager_it_publishes_on_a_normal_exit(ckpts: CheckpointDir) -> None:
    """`with ckpts.begin(N) as commit:` publishes when the block ends normally."""
    with ckpts.begin(6, metadata={"epoch": 1}) as commit:
        assert ckpts.steps() == []
        write(commit.path, NEW)
        commit.metadata["val_loss"] = 0.5
    assert commit.state == "published"
    ckpt = commit.publish()  # already published: returns its checkpoint
    assert ckpt == ckpts.verify(6)
    assert ckpt.manifest.metadata == {"epoch": 1, "val_loss": 0.5}
    assert contents(ckpt.path) == NEW


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_as_a_context_manager_it_aborts_on_an_exception_and_reraises_it(
    ckpts: CheckpointDir, exc_type: type[BaseException]
) -> None:
    """An exception in the block aborts the commit and propagates as is; the old step stays."""
    old = committed(ckpts, 6, OLD)
    boom = exc_type("the save failed halfway")
    handles: list[Commit] = []

    def save() -> None:
        with ckpts.begin(6) as handle:
            handles.append(handle)
            write(handle.path, {"model.bin": b"half"})
            raise boom

    with pytest.raises(exc_type) as info:
        save()
    assert info.value is boom
    (commit,) = handles
    assert commit.state == "aborted"
    assert not commit.path.exists()
    assert not lock_file(commit).exists()
    assert ckpts.verify(6) == old
    assert leftovers(ckpts) == set()


# ---------------------------------------------------------------- the storage-writer pattern


class StorageWriter:
    """A writer that begins a checkpoint in one call and finishes it in another."""

    def __init__(self, ckpts: CheckpointDir) -> None:
        self.ckpts = ckpts
        self.commit: Commit | None = None

    def prepare(self, step: int) -> Path:
        self.commit = self.ckpts.begin(step, metadata={"writer": "storage"})
        return self.commit.path

    def write(self, files: dict[str, bytes]) -> None:
        assert self.commit is not None
        write(self.commit.path, files)

    def finish(self) -> Checkpoint:
        assert self.commit is not None
        return self.commit.publish()


def save_with(writer: StorageWriter, step: int, files: dict[str, bytes], *, fail: bool) -> Any:
    """The caller's side: prepare, write, finish; abort in ``finally`` whatever happened."""
    writer.prepare(step)
    try:
        writer.write(files)
        if fail:
            raise OSError(28, "No space left on device (simulated)")
        return writer.finish()
    finally:
        assert writer.commit is not None
        writer.commit.abort()


def test_a_handle_begun_in_one_call_and_ended_in_another_with_abort_in_finally(
    ckpts: CheckpointDir,
) -> None:
    """The abort in ``finally`` keeps a published checkpoint and cleans up a failed one."""
    writer = StorageWriter(ckpts)
    ckpt = save_with(writer, 1, OLD, fail=False)
    assert isinstance(ckpt, Checkpoint)
    assert ckpts.verify(1) == ckpt
    assert ckpt.manifest.metadata == {"writer": "storage"}
    assert contents(ckpt.path) == OLD
    with pytest.raises(OSError, match="simulated"):
        save_with(writer, 2, NEW, fail=True)
    assert writer.commit is not None
    assert writer.commit.state == "aborted"
    with pytest.raises(OSError, match="simulated"):
        save_with(writer, 1, NEW, fail=True)  # a failed rewrite of step 1
    assert ckpts.steps() == [1]
    assert ckpts.verify(1) == ckpt
    assert contents(ckpt.path) == OLD
    assert leftovers(ckpts) == set()


# ---------------------------------------------------------------- fork


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_a_forked_child_cannot_publish_and_the_parent_then_publishes_all_it_wrote(
    ckpts: CheckpointDir,
) -> None:
    """In a child forked mid-save publish() is CommitStateError and abort() does nothing."""
    commit = ckpts.begin(1)
    write(commit.path, {"before_fork.bin": b"written before the fork"})
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 99
        try:
            try:
                commit.publish()
                status = 1  # published the parent's commit
            except CommitStateError as exc:
                status = 0 if isinstance(exc, RuntimeError) and "process" in str(exc) else 2
            commit.abort()
            if status == 0 and not (commit.path.is_dir() and lock_file(commit).exists()):
                status = 3  # abort removed the parent's staging dir or lock
            if status == 0 and (ckpts.steps() != [] or commit.state != "open"):
                status = 4
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    assert code == 0, {
        1: "the child published the parent's commit",
        2: "the child's publish raised something other than CommitStateError",
        3: "the child's abort removed the parent's staging dir or its lock",
        4: "the child changed the commit's state or the root",
    }.get(code, f"the child failed with status {code}")
    assert ckpts.steps() == []
    assert commit.state == "open"
    write(commit.path, {"after_fork.bin": b"written after the child exited"})
    ckpt = commit.publish()
    assert ckpts.verify(1) == ckpt
    assert contents(ckpt.path) == {
        "before_fork.bin": b"written before the fork",
        "after_fork.bin": b"written after the child exited",
    }
    assert leftovers(ckpts) == set()
