"""Committing a checkpoint: staging, the marker and its manifest, promotion, rollback."""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import os
import re
import stat
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from treeutil import contents, write

import atomic_ckpt
from atomic_ckpt import MARKER, CheckpointDir, SyncPolicy, __version__
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls.checksums import AHEAD
from atomic_ckpt._core.l3_formats import tree as _tree

STAGING_RE = re.compile(r"(?P<step>[0-9]+)\.tmp-[0-9a-f]{32}")


def commit_files(ckpts: CheckpointDir, step: int, files: Mapping[str, bytes]) -> Path:
    with ckpts.commit(step) as path:
        write(path, files)
    return ckpts.path_of(step)


def commit_with(ckpts: CheckpointDir, step: int, save: Callable[[Path], None]) -> None:
    """Commit ``step`` with ``save`` as the save function (so pytest.raises wraps one call)."""
    with ckpts.commit(step) as path:
        save(path)


OLD = {"model.bin": b"old model", "old_only.txt": b"only in the old save"}
NEW = {"model.bin": b"new model, longer", "new_only/shard.bin": b"\x00" * 100}


# ---------------------------------------------------------------- staging and promotion


def test_commit_yields_a_fresh_staging_dir_beside_the_final_name(ckpts: CheckpointDir) -> None:
    """Inside the block the path is an empty `N.tmp-<uuid4 hex>` dir in the root, not `N/`."""
    with ckpts.commit(5) as path:
        assert isinstance(path, Path)
        assert path.parent == ckpts.root
        match = STAGING_RE.fullmatch(path.name)
        assert match is not None
        assert match["step"] == "5"
        assert path.is_dir()
        assert list(path.iterdir()) == []
        assert not ckpts.path_of(5).exists()
        assert ckpts.steps() == []


def test_commit_promotes_the_staging_dir_to_the_step(ckpts: CheckpointDir) -> None:
    """A normal exit moves the staged files to `root/N`, which is then the latest step."""
    with ckpts.commit(5) as path:
        write(path, NEW)
        staging = path
    assert not staging.exists()
    assert contents(ckpts.path_of(5)) == NEW
    assert ckpts.steps() == [5]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 5
    assert latest.path == ckpts.path_of(5)


def test_commit_creates_a_missing_root_and_its_parents(tmp_path: Path) -> None:
    """The root (and missing parents) are created at the first commit."""
    ckpts = CheckpointDir(tmp_path / "a" / "b" / "ckpts")
    assert not (tmp_path / "a").exists()
    commit_files(ckpts, 0, {"x": b"x"})
    assert ckpts.steps() == [0]


def test_root_that_is_a_symlink_to_a_directory(tmp_path: Path) -> None:
    """A root reached through a symlink commits durably (its real directory is fsynced)."""
    real = tmp_path / "scratch" / "ckpts"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    synced: list[Path] = []
    real_fsync_dir = _fs.fsync_dir

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        real_fsync_dir(path)
        synced.append(Path(os.path.realpath(path)))

    ckpts = CheckpointDir(tmp_path / "link")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "fsync_dir", fsync_dir)
        commit_files(ckpts, 1, {"x": b"x"})
        commit_files(ckpts, 1, {"x": b"y"})
    assert real in synced
    assert (real / "1" / "x").read_bytes() == b"y"
    assert CheckpointDir(tmp_path / "link").steps() == [1]
    assert ckpts.path_of(1).resolve() == real / "1"
    assert (tmp_path / "link").is_symlink()  # the link itself is left alone


def test_root_is_returned_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative root is resolved against the working directory at construction."""
    monkeypatch.chdir(tmp_path)
    ckpts = CheckpointDir("ckpts")
    assert ckpts.root == tmp_path / "ckpts"
    commit_files(ckpts, 1, {"x": b"x"})
    assert (tmp_path / "ckpts" / "1" / "x").read_bytes() == b"x"


def test_nothing_but_the_checkpoint_is_left_after_commit(ckpts: CheckpointDir) -> None:
    """After a commit returns, the root holds the checkpoint only: no staging dir, no
    staging lock, not even the root lock's file (tools that list a root see checkpoints)."""
    commit_files(ckpts, 3, OLD)
    assert set(os.listdir(ckpts.root)) == {"3"}
    commit_files(ckpts, 3, NEW)  # a rewrite: the old copy is removed too
    assert set(os.listdir(ckpts.root)) == {"3"}
    assert set(os.listdir(ckpts.path_of(3))) == {MARKER, "model.bin", "new_only"}


def test_empty_commit_is_a_complete_checkpoint(ckpts: CheckpointDir) -> None:
    """A save that writes nothing still commits a complete checkpoint with an empty file list."""
    with ckpts.commit(0):
        pass
    ckpt = ckpts.get(0)
    assert ckpt.manifest.files == ()
    assert not ckpt.manifest.legacy


def test_prefix_names_the_step_directories(tmp_path: Path) -> None:
    """With prefix="checkpoint-" a commit of step 5 creates `checkpoint-5`."""
    ckpts = CheckpointDir(tmp_path, prefix="checkpoint-")
    with ckpts.commit(5) as path:
        assert path.name.startswith(".tmp-checkpoint-5.")
        write(path, {"x": b"x"})
    assert (tmp_path / "checkpoint-5" / MARKER).is_file()
    assert ckpts.path_of(5) == tmp_path / "checkpoint-5"
    assert ckpts.steps() == [5]


@pytest.mark.parametrize("prefix", ["a/b", "x.tmp-"])
def test_prefix_must_be_a_plain_name_fragment(tmp_path: Path, prefix: str) -> None:
    """A prefix with a path separator or the staging infix is a ValueError."""
    with pytest.raises(ValueError, match="prefix"):
        CheckpointDir(tmp_path, prefix=prefix)


def test_module_level_commit_and_latest(tmp_path: Path) -> None:
    """`atomic_ckpt.commit(root, step)` commits and `atomic_ckpt.latest(root)` finds it."""
    assert atomic_ckpt.latest(tmp_path / "r") is None
    with atomic_ckpt.commit(tmp_path / "r", 2) as path:
        write(path, {"f": b"1"})
    with atomic_ckpt.commit(str(tmp_path / "r"), 7, prefix="ckpt-") as path:
        write(path, {"f": b"2"})
    latest = atomic_ckpt.latest(tmp_path / "r")
    assert latest is not None
    assert latest.step == 2
    with_prefix = atomic_ckpt.latest(tmp_path / "r", prefix="ckpt-")
    assert with_prefix is not None
    assert with_prefix.path == tmp_path / "r" / "ckpt-7"


def test_checkpoint_is_a_frozen_dataclass(ckpts: CheckpointDir) -> None:
    """`Checkpoint` exposes step, path and manifest and cannot be mutated."""
    commit_files(ckpts, 4, {"x": b"x"})
    ckpt = ckpts.get(4)
    assert (ckpt.step, ckpt.path) == (4, ckpts.path_of(4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ckpt.step = 5  # type: ignore[misc]


# ---------------------------------------------------------------- the marker and manifest


def _identity(path: Path) -> dict[str, int]:
    """What a file's entry records of it for a later carry (inode, mtime)."""
    st = os.lstat(path)
    return {"ino": st.st_ino, "mtime_ns": st.st_mtime_ns}


def test_commit_writes_the_marker_with_its_manifest(tmp_path: Path) -> None:
    """The marker is JSON listing every file (size, crc32, identity), directory and symlink."""
    ckpts = CheckpointDir(tmp_path / "ckpts", checksum="crc32")
    model = bytes(range(256)) * 4
    state = b"optimizer state"
    with ckpts.commit(5, metadata={"epoch": 3}) as path:
        write(path, {"model.bin": model, "opt/state.pt": state})
        (path / "empty").mkdir()
        (path / "best").symlink_to("model.bin")
        (path / "gone").symlink_to("does/not/exist")
    marker = ckpts.path_of(5) / MARKER
    doc = json.loads(marker.read_bytes())
    assert doc["format"] == "atomic_ckpt"
    assert doc["version"] == 2
    assert doc["step"] == 5
    assert doc["library_version"] == __version__
    assert isinstance(doc["created"], float)
    assert doc["checksum"] == "crc32"
    assert doc["metadata"] == {"epoch": 3}
    assert doc["files"] == [
        {"path": "best", "type": "symlink", "target": "model.bin"},
        {"path": "empty", "type": "dir"},
        {"path": "gone", "type": "symlink", "target": "does/not/exist"},
        {
            "path": "model.bin",
            "size": len(model),
            "checksum": f"{zlib.crc32(model):08x}",
            **_identity(ckpts.path_of(5) / "model.bin"),
        },
        {"path": "opt", "type": "dir"},
        {
            "path": "opt/state.pt",
            "size": len(state),
            "checksum": f"{zlib.crc32(state):08x}",
            **_identity(ckpts.path_of(5) / "opt/state.pt"),
        },
    ]
    # Nothing but the caller's files and the marker: no temporary marker left behind.
    assert sorted(os.listdir(ckpts.path_of(5))) == sorted(
        [MARKER, "best", "empty", "gone", "model.bin", "opt"]
    )
    manifest = ckpts.get(5).manifest
    assert manifest.step == 5
    assert manifest.metadata == {"epoch": 3}
    assert manifest.total_size == len(model) + len(state)
    assert [(e.path, e.type) for e in manifest.files] == [
        (f["path"], f.get("type", "file")) for f in doc["files"]
    ]


def test_default_checksum_is_recorded_for_every_file(ckpts: CheckpointDir) -> None:
    """By default the manifest names a checksum algorithm and records each file's digest."""
    with ckpts.commit(1) as path:
        write(path, {"a.bin": b"a" * 100, "d/b.bin": b"b"})
    manifest = ckpts.get(1).manifest
    assert manifest.checksum is not None
    for entry in manifest.files:
        if entry.type == "file":
            digest = _tree.checksum_file(ckpts.path_of(1) / entry.path, manifest.checksum)
            assert entry.checksum == digest


def test_checksum_none_records_sizes_only(tmp_path: Path) -> None:
    """With checksum=None the manifest records sizes but no checksums."""
    ckpts = CheckpointDir(tmp_path, checksum=None)
    commit_files(ckpts, 1, {"a": b"abc"})
    doc = json.loads((tmp_path / "1" / MARKER).read_bytes())
    assert doc["checksum"] is None
    # A file's type is implied; its identity (for a later carry) is recorded all the same.
    assert doc["files"] == [{"path": "a", "size": 3, **_identity(tmp_path / "1" / "a")}]


def test_unknown_checksum_is_a_value_error(tmp_path: Path) -> None:
    """An unknown checksum algorithm is refused at construction."""
    with pytest.raises(ValueError, match="checksum"):
        CheckpointDir(tmp_path, checksum="md4")


def test_commit_stores_metadata_and_rejects_non_json(ckpts: CheckpointDir) -> None:
    """Metadata that is not JSON-serializable is a ValueError before anything is created."""
    with pytest.raises(ValueError, match="JSON"), ckpts.commit(1, metadata={"f": object()}):
        pytest.fail("the block must not run")
    assert not ckpts.root.exists()


def test_commit_never_follows_a_symlink(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """Links in the save are recorded as links; nothing they point to is fsynced or hashed."""
    outside = tmp_path / "outside"
    write(outside, {"secret.bin": b"s" * 10, "sub/deep.bin": b"d"})
    touched: list[Path] = []
    real_fsync_file, real_fsync_dir = _fs.fsync_file, _fs.fsync_dir
    real_checksum = _tree.checksum_file

    def fsync_file(path: str | os.PathLike[str]) -> None:
        touched.append(Path(path))
        real_fsync_file(path)

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        touched.append(Path(path))
        real_fsync_dir(path)

    def checksum_file(path: Path, algorithm: str, **options: Any) -> str:
        touched.append(Path(path))
        return real_checksum(path, algorithm, **options)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "fsync_file", fsync_file)
        m.setattr(_fs, "fsync_dir", fsync_dir)
        m.setattr(_tree, "checksum_file", checksum_file)
        with ckpts.commit(1) as path:
            write(path, {"real.bin": b"r"})
            (path / "dirlink").symlink_to(outside)
            (path / "filelink").symlink_to(outside / "secret.bin")
            staging = path
    assert staging / "real.bin" in touched  # the wrappers were hit
    for p in touched:
        assert not p.is_relative_to(outside)
        assert p.name not in {"dirlink", "filelink"}
        assert "dirlink" not in p.parts
    entries = {e.path: e for e in ckpts.get(1).manifest.files}
    assert set(entries) == {"dirlink", "filelink", "real.bin"}
    assert entries["dirlink"].type == "symlink"
    assert entries["dirlink"].target == str(outside)
    assert entries["filelink"].type == "symlink"


def test_the_largest_file_is_hashed_and_flushed_by_the_committing_thread(
    ckpts: CheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread is started or handed work for the largest file: the committing thread
    hashes it with its writeback started a range ahead (from 1 MiB on) and fsyncs it, so
    a one-file commit starts no thread at all; the other files are hashed and fsynced on
    the workers. Without checksums the whole file's writeback starts at once."""
    import threading

    real_checksum = _tree.checksum_file
    hashed_by: dict[str, int] = {}
    flushed_by: dict[str, int] = {}
    started: list[tuple[str, int, int]] = []
    submitted: list[object] = []
    real_submit = _tree.Workers.submit

    def checksum_file(path: Path, algorithm: str, **options: Any) -> str:
        hashed_by[Path(path).name] = threading.get_ident()
        return real_checksum(path, algorithm, **options)

    def submit(self: _tree.Workers, job: Callable[[], object]) -> object:
        submitted.append(job)
        return real_submit(self, job)

    class Watching(SyncPolicy):
        def start_file(self, path: Path, offset: int = 0, length: int = 0) -> None:
            assert Path(path).name not in flushed_by  # the hint comes before the fsync
            started.append((Path(path).name, offset, length))
            super().start_file(path, offset, length)

        def file(self, path: Path) -> None:
            flushed_by[Path(path).name] = threading.get_ident()
            super().file(path)

    monkeypatch.setattr(_tree, "checksum_file", checksum_file)
    monkeypatch.setattr(_tree.Workers, "submit", submit)
    watched = CheckpointDir(tmp_path / "watched", sync=Watching())
    big = _tree.WRITEBACK_AT_LEAST
    with watched.commit(1) as path:
        write(path, {"big.bin": b"b" * big, "small.bin": b"s", "other.bin": b"o" * 10})
    me = threading.get_ident()
    assert hashed_by["big.bin"] == flushed_by["big.bin"] == me
    assert started == [("big.bin", 0, AHEAD)]  # one range ahead of the hash (1 MiB < AHEAD)
    for name in ("small.bin", "other.bin"):
        assert hashed_by[name] != me
        assert flushed_by[name] != me
    watched.verify(1)

    # One file: no job for any thread; below the threshold, no writeback hint.
    submitted.clear()
    started.clear()
    with watched.commit(2) as path:
        write(path, {"only.bin": b"x" * (big - 1)})
    assert submitted == []
    assert started == []
    assert flushed_by["only.bin"] == me
    watched.verify(2)

    started.clear()
    unhashed = CheckpointDir(tmp_path / "unhashed", sync=Watching(), checksum=None)
    with unhashed.commit(1) as path:
        write(path, {"unhashed.bin": b"x" * big})
    assert started == [("unhashed.bin", 0, 0)]
    assert flushed_by["unhashed.bin"] == me

    submitted.clear()
    fast = CheckpointDir(tmp_path / "fast", durable=False)
    with fast.commit(1) as path:
        write(path, {"only.bin": b"x" * big})
    assert submitted == []
    assert fast.verify(1).manifest.files[0].checksum == real_checksum(
        fast.path_of(1) / "only.bin", fast.checksum or ""
    )


def test_starting_a_files_writeback_is_a_hint_that_never_raises(tmp_path: Path) -> None:
    """By path: a regular file's writeback is handed to the kernel (True on Linux); a
    missing file, a symlink (never followed) or a directory is not (False, no error)."""
    import sys

    (tmp_path / "f").write_bytes(b"x" * 8192)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert _fs.start_file_writeback(tmp_path / "f") is sys.platform.startswith("linux")
    assert _fs.start_file_writeback(tmp_path / "missing") is False
    assert _fs.start_file_writeback(tmp_path / "link") is False
    assert _fs.start_file_writeback(tmp_path) is False


def test_a_failed_hash_in_the_committing_thread_promotes_nothing(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error while the committing thread hashes (say EIO reading the file back) fails the
    commit once the workers' fsyncs have ended: nothing promoted, no staging dir left."""
    failed: list[str] = []

    def checksum_file(path: Path, algorithm: str, **options: Any) -> str:
        failed.append(Path(path).name)
        raise OSError(errno.EIO, "injected read error", str(path))

    monkeypatch.setattr(_tree, "checksum_file", checksum_file)
    with pytest.raises(OSError, match="injected read error"), ckpts.commit(1) as path:
        write(path, {"model.bin": b"m" * 100})
    assert failed == ["model.bin"]
    assert ckpts.steps() == []
    assert [p.name for p in ckpts.root.iterdir()] == []


@pytest.mark.parametrize("failing", ["file", "start_file"])
def test_a_failure_on_the_largest_file_promotes_nothing(tmp_path: Path, failing: str) -> None:
    """The committing thread's own file: a failed fsync of it, or a writeback hint that
    raises in a custom policy, fails the commit with that error; nothing is promoted and
    nothing is left in the root (the workers' jobs ended first)."""
    hit: list[str] = []

    class Failing(SyncPolicy):
        def start_file(self, path: Path, offset: int = 0, length: int = 0) -> None:
            if failing == "start_file":
                hit.append(Path(path).name)
                raise OSError(errno.EIO, "injected hint error", str(path))
            super().start_file(path, offset, length)

        def file(self, path: Path) -> None:
            if failing == "file" and Path(path).name == "big.bin":
                hit.append(Path(path).name)
                raise OSError(errno.EIO, "injected fsync error", str(path))
            super().file(path)

    ckpts = CheckpointDir(tmp_path / "root", sync=Failing())
    with pytest.raises(OSError, match="injected"), ckpts.commit(1) as path:
        write(path, {"big.bin": b"b" * _tree.WRITEBACK_AT_LEAST, "small.bin": b"s"})
    assert hit == ["big.bin"]
    assert ckpts.steps() == []
    assert list(ckpts.root.iterdir()) == []


def test_a_job_cancelled_by_another_failure_raises_that_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that took a job but had not started it when another job failed cancels
    it; collecting the cancelled job's result raises the failure, not a bare
    CancelledError that would hide the EIO."""
    real_do = _tree.Workers._do
    cancelled: list[str] = []

    def do(self: _tree.Workers, future: Any, job: Callable[[], object]) -> None:
        if getattr(job, "slow", False):  # descheduled until the other job has failed
            while not self._failed:
                time.sleep(0.001)
        real_do(self, future, job)
        if future.cancelled():
            cancelled.append(getattr(job, "__name__", "?"))

    def slow() -> str:
        return "never"

    slow.slow = True  # type: ignore[attr-defined]

    def failing() -> str:
        raise OSError(errno.EIO, "injected flush error")

    monkeypatch.setattr(_tree.Workers, "_do", do)
    with pytest.raises(OSError, match="injected flush error"):
        _tree.run([slow, failing], workers=2)
    assert cancelled == ["slow"]  # the slow job really was cancelled (and is read first)


def test_durable_commit_fsyncs_files_dirs_staging_then_root(ckpts: CheckpointDir) -> None:
    """Each file (exactly once) and subdir is fsynced, the staging dir too, and after the
    rename the root, last."""
    calls: list[tuple[str, Path]] = []
    real_fsync_file, real_fsync_dir = _fs.fsync_file, _fs.fsync_dir

    def fsync_file(path: str | os.PathLike[str]) -> None:
        calls.append(("file", Path(path)))
        real_fsync_file(path)

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        calls.append(("dir", Path(path)))
        real_fsync_dir(path)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "fsync_file", fsync_file)
        m.setattr(_fs, "fsync_dir", fsync_dir)
        with ckpts.commit(2) as path:
            write(path, {"a.bin": b"a", "sub/b.bin": b"b", "sub/deeper/c.bin": b"c"})
            staging = path
    files = collections.Counter(p for kind, p in calls if kind == "file")
    assert files == {staging / rel: 1 for rel in ("a.bin", "sub/b.bin", "sub/deeper/c.bin")}
    dirs = [p for kind, p in calls if kind == "dir"]
    assert staging / "sub" in dirs
    assert staging / "sub" / "deeper" in dirs
    assert staging in dirs
    assert ckpts.root in dirs
    assert dirs.index(staging) < dirs.index(ckpts.root)
    assert calls[-1] == ("dir", ckpts.root)


def test_not_durable_commit_never_fsyncs_but_still_commits(tmp_path: Path) -> None:
    """durable=False makes no fsync at all, yet the checkpoint is complete and verifiable."""
    calls: list[int] = []

    def fsync_fd(fd: int) -> None:
        calls.append(fd)

    ckpts = CheckpointDir(tmp_path, durable=False)
    assert not ckpts.durable
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "fsync_fd", fsync_fd)
        commit_files(ckpts, 1, {"a": b"a", "d/b": b"b"})
        commit_files(ckpts, 1, {"a": b"again"})
    assert calls == []
    assert ckpts.verify(1).step == 1
    assert contents(ckpts.path_of(1)) == {"a": b"again"}
    with pytest.MonkeyPatch.context() as m:  # the probe does see a durable commit's fsyncs
        m.setattr(_fs, "fsync_fd", fsync_fd)
        commit_files(CheckpointDir(tmp_path / "durable"), 1, {"a": b"a"})
    assert calls


def test_staging_dir_and_checkpoint_follow_the_umask(tmp_path: Path, umask_027: int) -> None:
    """Under umask 027 the root, staging dir, checkpoint, marker and lock files are 0750/0640."""
    ckpts = CheckpointDir(tmp_path / "ckpts")

    def mode(p: Path) -> int:
        return stat.S_IMODE(os.lstat(p).st_mode)

    with ckpts.commit(1) as path:
        assert mode(path) == 0o750
        for name in os.listdir(ckpts.root):
            if name.endswith(".lock"):
                assert mode(ckpts.root / name) == 0o640, name
    assert mode(ckpts.root) == 0o750
    assert mode(ckpts.path_of(1)) == 0o750
    assert mode(ckpts.path_of(1) / MARKER) == 0o640
    with ckpts._root.locked():  # the root lock's file exists only while it is held
        assert mode(ckpts.root / ROOT_LOCK) == 0o640
    assert not os.path.lexists(ckpts.root / ROOT_LOCK)


# ---------------------------------------------------------------- rewriting a step


def test_rewrite_keeps_the_old_checkpoint_visible_until_promotion(ckpts: CheckpointDir) -> None:
    """While a rewrite of step N is staged, readers still see the complete old `N/`."""
    commit_files(ckpts, 5, OLD)
    with ckpts.commit(5) as path:
        write(path, NEW)
        assert ckpts.steps() == [5]
        assert contents(ckpts.path_of(5)) == OLD
        fresh = CheckpointDir(ckpts.root)
        latest = fresh.latest()
        assert latest is not None
        assert latest.path == ckpts.path_of(5)
        assert fresh.verify(5).step == 5
    assert contents(ckpts.path_of(5)) == NEW  # replaced entirely: no old-only file survives
    assert ckpts.verify(5).step == 5


def test_exception_mid_rewrite_leaves_the_old_checkpoint_intact(ckpts: CheckpointDir) -> None:
    """An exception in the block re-raises as is; the old `N/` is untouched and verifies."""
    commit_files(ckpts, 5, OLD)
    before = ckpts.get(5).manifest
    boom = RuntimeError("save failed halfway")

    def save(path: Path) -> None:
        write(path, {"model.bin": b"half"})
        raise boom

    with pytest.raises(RuntimeError, match="halfway") as info:
        commit_with(ckpts, 5, save)
    assert info.value is boom
    assert contents(ckpts.path_of(5)) == OLD
    assert ckpts.get(5).manifest == before
    assert ckpts.verify(5).step == 5
    assert set(os.listdir(ckpts.root)) == {"5"}


def test_commit_replaces_an_unmarked_directory_of_the_same_step(ckpts: CheckpointDir) -> None:
    """Committing step N over an unmarked (broken) `N/` replaces it whole with the new save."""
    write(ckpts.root / "5", {"model.bin": b"truncated", "junk.tmp": b"partial"})
    commit_files(ckpts, 5, NEW)
    assert contents(ckpts.path_of(5)) == NEW
    assert ckpts.steps() == [5]
    assert set(os.listdir(ckpts.root)) == {"5"}


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_exception_in_a_new_commit_leaves_nothing_behind(
    ckpts: CheckpointDir, exc_type: type[BaseException]
) -> None:
    """Any exception (even KeyboardInterrupt) removes the staging dir and its lock file."""
    commit_files(ckpts, 1, OLD)

    def save(path: Path) -> None:
        write(path, NEW)
        raise exc_type("interrupted")

    with pytest.raises(exc_type):
        commit_with(ckpts, 2, save)
    assert ckpts.steps() == [1]
    assert set(os.listdir(ckpts.root)) == {"1"}


def test_fallback_replace_without_rename_exchange(ckpts: CheckpointDir) -> None:
    """Where RENAME_EXCHANGE is refused (EINVAL), a rewrite moves the old copy aside instead."""
    commit_files(ckpts, 5, OLD)
    hits: list[tuple[Path, Path]] = []

    def no_exchange(a: Path, b: Path) -> None:
        hits.append((a, b))
        raise OSError(errno.EINVAL, "Invalid argument")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "rename_exchange", no_exchange)
        commit_files(ckpts, 5, NEW)
    assert len(hits) == 1
    assert contents(ckpts.path_of(5)) == NEW
    assert ckpts.verify(5).step == 5
    assert set(os.listdir(ckpts.root)) == {"5"}


def test_fallback_replace_restores_the_old_copy_if_promotion_fails(
    ckpts: CheckpointDir,
) -> None:
    """If the fallback's second rename fails, the old copy is renamed back and the error raised."""
    commit_files(ckpts, 5, OLD)
    exchange_hits: list[Path] = []
    noreplace_calls: list[tuple[Path, Path]] = []
    error = OSError(errno.EIO, "I/O error")
    real_noreplace = _fs.rename_noreplace

    def no_exchange(a: Path, b: Path) -> None:
        exchange_hits.append(a)
        raise OSError(errno.EINVAL, "Invalid argument")

    def rename_noreplace(src: Path, dst: Path) -> None:
        noreplace_calls.append((src, dst))
        if not os.path.lexists(dst):  # the fallback's second rename: the old copy is aside
            raise error
        real_noreplace(src, dst)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "rename_exchange", no_exchange)
        m.setattr(_fs, "rename_noreplace", rename_noreplace)
        with pytest.raises(OSError, match="I/O error") as info:
            commit_files(ckpts, 5, NEW)
    assert info.value is error
    assert len(exchange_hits) == 1
    assert len(noreplace_calls) == 2
    assert contents(ckpts.path_of(5)) == OLD
    assert ckpts.verify(5).step == 5
    assert set(os.listdir(ckpts.root)) == {"5"}
