"""Bad input gets a clear error, and nothing already committed is lost (issue 2, point 6)."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from treeutil import contents, write

import atomic_ckpt
from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    DiskFullError,
    DistributedCommitError,
    InvalidRootError,
    InvalidStepError,
    ManifestError,
    NotDurableError,
    RootNotWritableError,
    StagingLostError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l2_syscalls import fs as _fs

OLD = {"model.bin": b"old weights", "sub/opt.pt": b"old optimizer"}


@pytest.fixture
def committed(ckpts: CheckpointDir) -> CheckpointDir:
    """A root holding one complete checkpoint, step 1, with OLD's files."""
    with ckpts.commit(1) as path:
        write(path, OLD)
    return ckpts


def commit_with(ckpts: CheckpointDir, step: int, save: Callable[[Path], None]) -> None:
    """Commit ``step`` with ``save`` as the save function (so pytest.raises wraps one call)."""
    with ckpts.commit(step) as path:
        save(path)


def assert_untouched(ckpts: CheckpointDir, *extra: str) -> None:
    """Step 1 is intact and verifies; the root holds nothing else (but ``extra`` names)."""
    assert ckpts.steps() == [1]
    assert contents(ckpts.path_of(1)) == OLD
    ckpts.verify(1)
    assert set(os.listdir(ckpts.root)) == {"1", *extra}


# ---------------------------------------------------------------- the step


@pytest.mark.parametrize("step", [-1, -100, True, False, 1.0, 2.5, "3", None, b"4"])
def test_invalid_step_is_an_invalid_step_error(ckpts: CheckpointDir, step: Any) -> None:
    """A negative, bool, float or str step is InvalidStepError (a ValueError); nothing is made."""
    with pytest.raises(InvalidStepError) as info, ckpts.commit(step):
        pytest.fail("the block must not run")
    assert isinstance(info.value, ValueError)
    assert repr(step) in str(info.value) or str(step) in str(info.value)
    assert info.value.step == (step if type(step) is int else None)
    # verify takes "3" as ls shows step 3, as delete does (test_carry_named_checkpoint_verify)
    methods = (ckpts.get, ckpts.path_of) + (() if isinstance(step, str) else (ckpts.verify,))
    for method in methods:  # mark_complete: test_mark_complete.py
        with pytest.raises(InvalidStepError):
            method(step)
    assert not ckpts.root.exists()


# ---------------------------------------------------------------- the root


def test_root_that_is_a_file_is_not_a_directory_error(tmp_path: Path) -> None:
    """A root that exists as a file (or a link to one) is InvalidRootError, a NotADirectoryError."""
    (tmp_path / "file").write_bytes(b"keep me")
    (tmp_path / "link").symlink_to("file")
    for name in ("file", "link"):
        with pytest.raises(NotADirectoryError) as info:
            CheckpointDir(tmp_path / name)
        assert isinstance(info.value, InvalidRootError)
        assert info.value.path == (tmp_path / name).resolve()
    assert (tmp_path / "file").read_bytes() == b"keep me"


def test_root_replaced_by_a_file_after_construction(tmp_path: Path) -> None:
    """If the root becomes a file later, commit raises InvalidRootError and leaves the file be."""
    ckpts = CheckpointDir(tmp_path / "root")
    (tmp_path / "root").write_bytes(b"keep me")
    with pytest.raises(InvalidRootError), ckpts.commit(1):
        pytest.fail("the block must not run")
    assert (tmp_path / "root").read_bytes() == b"keep me"


def test_root_below_a_file_is_not_a_directory_error(tmp_path: Path) -> None:
    """A root whose parent is a file cannot be created: InvalidRootError, a NotADirectoryError."""
    (tmp_path / "file").write_bytes(b"")
    ckpts = CheckpointDir(tmp_path / "file" / "root")
    with pytest.raises(NotADirectoryError) as info, ckpts.commit(1):
        pytest.fail("the block must not run")
    assert isinstance(info.value, InvalidRootError)


def _try_commit(root: str | Path) -> tuple[list[int], BaseException | None]:
    """Read the steps of ``root``, then try to commit step 2; return the steps and the error."""
    ckpts = CheckpointDir(root)
    steps = ckpts.steps()
    try:
        with ckpts.commit(2) as path:
            (path / "x").write_bytes(b"x")
    except BaseException as exc:
        return steps, exc
    return steps, None


def _commit_in_child(roots: list[str], uid: int, conn: Connection) -> None:
    """Child of a forked process: drop to ``uid``, try to commit in each root, report."""
    try:
        os.setgid(uid)
        os.setuid(uid)
        conn.send([_try_commit(root) for root in roots])
    finally:
        conn.close()


@pytest.fixture
def world_readable_tmp() -> Iterator[Path]:
    """A temporary directory outside pytest's 0700 tree, so another uid can reach it."""
    path = Path(tempfile.mkdtemp(prefix="atomic_ckpt-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_root_without_write_permission(world_readable_tmp: Path) -> None:
    """An unwritable root (or parent of a missing root) is RootNotWritableError; nothing changes."""
    ckpts = CheckpointDir(world_readable_tmp / "root")
    with ckpts.commit(1) as path:
        write(path, OLD)
    missing = ckpts.root / "sub" / "missing"
    roots = [str(ckpts.root), str(missing)]
    ckpts.root.chmod(0o555)
    try:
        if os.geteuid() != 0:
            results = [_try_commit(root) for root in roots]
        else:
            # chmod does not stop root: run the commits in a child that drops to "nobody".
            ctx = mp.get_context("fork")
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_commit_in_child, args=(roots, 65534, child))
            proc.start()
            child.close()
            results = parent.recv()
            proc.join()
            assert proc.exitcode == 0
    finally:
        ckpts.root.chmod(0o755)
    assert [steps for steps, _ in results] == [[1], []]  # reading still works
    for root, (_, error) in zip(roots, results, strict=True):
        assert isinstance(error, RootNotWritableError)
        assert isinstance(error, PermissionError)
        assert error.path == Path(root)
        assert "permission denied" in str(error)
    assert not missing.parent.exists()
    assert_untouched(ckpts)


def _mount(*args: str) -> bool:
    result = subprocess.run(["mount", *args], capture_output=True, check=False)
    return result.returncode == 0


def test_root_on_a_read_only_filesystem(tmp_path: Path) -> None:
    """A read-only mounted root is RootNotWritableError (EROFS); its checkpoints stay readable."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to make a read-only bind mount")
    src = tmp_path / "src"
    ro = tmp_path / "ro"
    ro.mkdir()
    writer = CheckpointDir(src)
    with writer.commit(1) as path:
        write(path, OLD)
    if not _mount("--bind", str(src), str(ro)):
        pytest.skip("bind mounts are not permitted here (no CAP_SYS_ADMIN)")
    try:
        if not _mount("-o", "remount,ro,bind", str(ro)):
            pytest.skip("cannot remount the bind mount read-only here")
        ckpts = CheckpointDir(ro)
        assert ckpts.steps() == [1]
        with pytest.raises(RootNotWritableError) as info, ckpts.commit(2):
            pytest.fail("the block must not run")
        assert isinstance(info.value, PermissionError)
        assert "read-only" in str(info.value)
        ckpts.verify(1)
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert_untouched(writer)


# ---------------------------------------------------------------- the step's name is taken


@pytest.mark.parametrize("kind", ["file", "symlink-to-dir", "symlink-to-file", "dangling-symlink"])
def test_step_name_taken_by_a_file_or_symlink(
    committed: CheckpointDir, tmp_path: Path, kind: str
) -> None:
    """If `N` is a plain file or a symlink, commit(N) is StepConflictError (a FileExistsError)."""
    ckpts = committed
    target_dir = tmp_path / "elsewhere"
    write(target_dir, {"precious": b"do not touch"})
    name = ckpts.path_of(2)
    if kind == "file":
        name.write_bytes(b"not a checkpoint")
    elif kind == "symlink-to-dir":
        name.symlink_to(target_dir)
    elif kind == "symlink-to-file":
        name.symlink_to(target_dir / "precious")
    else:
        name.symlink_to(tmp_path / "nowhere")
    before = os.lstat(name)
    with pytest.raises(FileExistsError) as info, ckpts.commit(2):
        pytest.fail("the block must not run")
    assert isinstance(info.value, StepConflictError)
    assert info.value.path == name
    assert info.value.step == 2
    assert "move it away" in str(info.value)
    assert os.lstat(name) == before
    assert contents(target_dir) == {"precious": b"do not touch"}
    assert_untouched(ckpts, "2")


def test_step_name_taken_during_the_save(committed: CheckpointDir) -> None:
    """A file that appears at `N` while the save runs is caught at promotion; nothing is left."""
    ckpts = committed

    def save(path: Path) -> None:
        write(path, {"x": b"x"})
        ckpts.path_of(2).write_bytes(b"squatter")

    with pytest.raises(StepConflictError):
        commit_with(ckpts, 2, save)
    assert ckpts.path_of(2).read_bytes() == b"squatter"
    assert_untouched(ckpts, "2")


# ---------------------------------------------------------------- the disk fills


def test_enospc_raised_by_the_save_rolls_back(committed: CheckpointDir) -> None:
    """ENOSPC from the save is raised as a DiskFullError (errno ENOSPC) chained from it;
    earlier checkpoints and the root stay intact."""
    ckpts = committed
    full = OSError(errno.ENOSPC, "No space left on device")

    def save(path: Path) -> None:
        write(path, {"model.bin": b"partial"})
        raise full

    for step in (2, 1):  # a new step, then a rewrite of the existing one
        with pytest.raises(DiskFullError, match="No space left") as info:
            commit_with(ckpts, step, save)
        assert info.value.__cause__ is full
        assert info.value.errno == errno.ENOSPC
        assert_untouched(ckpts)


@pytest.mark.parametrize("target", ["write_file_durable", "fsync_file", "fsync_dir", "fsync_fd"])
@pytest.mark.parametrize("step", [1, 2], ids=["rewrite", "new-step"])
def test_enospc_during_the_commit_protocol_rolls_back(
    committed: CheckpointDir, target: str, step: int
) -> None:
    """ENOSPC from a durability syscall (fsync, the marker write) rolls back and is raised
    as a DiskFullError (errno ENOSPC) chained from it."""
    ckpts = committed
    full = OSError(errno.ENOSPC, "No space left on device")
    hits: list[tuple[Any, ...]] = []

    def fail(*args: Any, **kwargs: Any) -> None:
        hits.append(args)
        raise full

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, target, fail)
        with pytest.raises(DiskFullError, match="No space left") as info:
            commit_with(
                ckpts, step, lambda path: write(path, {"model.bin": b"new", "sub/d/o.pt": b"o"})
            )
    assert hits, f"the patched _fs.{target} was never called"
    assert info.value.__cause__ is full
    assert info.value.errno == errno.ENOSPC
    assert_untouched(ckpts)


# ---------------------------------------------------------------- the save misbehaves


def _delete(path: Path, tmp_path: Path) -> None:
    shutil.rmtree(path)


def _rename_away(path: Path, tmp_path: Path) -> None:
    path.rename(tmp_path / "moved")


def _replace_with_new_dir(path: Path, tmp_path: Path) -> None:
    # Moved, not deleted: the old inode stays alive, so the new dir cannot reuse its number.
    path.rename(tmp_path / "moved")
    path.mkdir()
    (path / "model.bin").write_bytes(b"impostor")


def _replace_with_symlink(path: Path, tmp_path: Path) -> None:
    (tmp_path / "impostor").mkdir()
    shutil.rmtree(path)
    path.symlink_to(tmp_path / "impostor")


@pytest.mark.parametrize(
    "sabotage", [_delete, _rename_away, _replace_with_new_dir, _replace_with_symlink]
)
@pytest.mark.parametrize("step", [1, 2], ids=["rewrite", "new-step"])
def test_save_that_loses_the_staging_dir_is_staging_lost_error(
    committed: CheckpointDir,
    tmp_path: Path,
    sabotage: Callable[[Path, Path], None],
    step: int,
) -> None:
    """Deleting, renaming or replacing the staging dir is StagingLostError; nothing is committed."""
    ckpts = committed
    staged: list[Path] = []

    def save(path: Path) -> None:
        write(path, {"model.bin": b"new"})
        staged.append(path)
        sabotage(path, tmp_path)

    with pytest.raises(StagingLostError) as info:
        commit_with(ckpts, step, save)
    (staging,) = staged
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.path == staging
    assert info.value.step == step
    assert "Nothing was committed" in str(info.value)
    assert_untouched(ckpts)


# ---------------------------------------------------------------- a corrupt marker


def test_corrupt_marker_is_a_clear_error_and_can_be_recommitted(committed: CheckpointDir) -> None:
    """get/verify of a step with a corrupt marker name the marker; a new commit replaces it."""
    ckpts = committed
    with ckpts.commit(2) as path:
        write(path, {"a": b"a"})
    marker = ckpts.path_of(2) / MARKER
    marker.write_bytes(b'{"format": "atomic_ckpt", "version": 1, "files": [tru')
    assert ckpts.steps() == [1]
    for method in (ckpts.get, ckpts.verify):
        with pytest.raises(CheckpointNotFoundError) as info:
            method(2)
        assert str(marker) in str(info.value)
        assert "not valid JSON" in str(info.value)
        assert info.value.step == 2
    with ckpts.commit(2) as path:
        write(path, {"a": b"fixed"})
    assert ckpts.steps() == [1, 2]
    ckpts.verify(2)


# ---------------------------------------------------------------- the error classes


ERRORS: list[tuple[type[CheckpointError], type[BaseException]]] = [
    (InvalidStepError, ValueError),
    (InvalidRootError, NotADirectoryError),
    (RootNotWritableError, PermissionError),
    (StepConflictError, FileExistsError),
    (CheckpointNotFoundError, FileNotFoundError),
    (StagingLostError, FileNotFoundError),
    (ManifestError, ValueError),
    (VerificationError, OSError),
    (NotDurableError, OSError),
    (DiskFullError, OSError),
    (CheckpointTimeoutError, TimeoutError),
    (DistributedCommitError, RuntimeError),
]

EXPORTED_ERRORS = sorted(
    (
        obj
        for name in atomic_ckpt.__all__
        if isinstance(obj := getattr(atomic_ckpt, name), type)
        and issubclass(obj, CheckpointError)
        and obj is not CheckpointError
    ),
    key=lambda cls: cls.__name__,
)


@pytest.mark.parametrize("cls", EXPORTED_ERRORS, ids=[c.__name__ for c in EXPORTED_ERRORS])
def test_every_exported_error_is_also_a_specific_builtin(cls: type[CheckpointError]) -> None:
    """Each exported error subclasses a builtin more specific than Exception, and pickles."""
    builtins = [
        base
        for base in cls.__mro__
        if base.__module__ == "builtins" and base not in (Exception, BaseException, object)
    ]
    assert builtins, f"{cls.__name__} subclasses no builtin a caller would catch"
    copy = pickle.loads(pickle.dumps(cls("msg", path="/r/3", step=3)))
    assert type(copy) is cls
    assert (copy.path, copy.step) == (Path("/r/3"), 3)


@pytest.mark.parametrize(("cls", "builtin"), ERRORS, ids=[c.__name__ for c, _ in ERRORS])
def test_error_is_its_builtin_and_pickles_with_path_and_step(
    cls: type[CheckpointError], builtin: type[BaseException]
) -> None:
    """Each error is a CheckpointError and the builtin it names, and pickles with path and step."""
    err = cls("what went wrong; what to do", path="/ckpts/7", step=7)
    err.add_note("a note survives too")
    assert isinstance(err, CheckpointError)
    assert isinstance(err, builtin)
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls
    assert str(copy) == "what went wrong; what to do"
    assert copy.path == Path("/ckpts/7")
    assert copy.step == 7
    assert copy.__notes__ == ["a note survives too"]
    bare = pickle.loads(pickle.dumps(cls("no path")))
    assert (bare.path, bare.step) == (None, None)


def test_distributed_commit_error_pickles_with_its_ranks() -> None:
    """DistributedCommitError keeps the failed ranks across pickling."""
    err = DistributedCommitError("rank 2 failed", path="/r/3", step=3, ranks=(2,))
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.ranks, copy.step, str(copy)) == ((2,), 3, "rank 2 failed")


def test_raised_error_pickles_across_processes(committed: CheckpointDir) -> None:
    """A real StepConflictError survives a trip through pickle with its attributes."""
    ckpts = committed
    ckpts.path_of(3).write_bytes(b"")
    with pytest.raises(StepConflictError) as info, ckpts.commit(3):
        pass
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.path, copy.step, str(copy)) == (info.value.path, 3, str(info.value))


# ---------------------------------------------------------------- cleanup and durability failures


def test_cleanup_failure_is_attached_as_a_note_never_swallowed(committed: CheckpointDir) -> None:
    """If removing the staging dir fails, the original error gets a note; clean() finishes later."""
    ckpts = committed
    boom = RuntimeError("the save failed")
    hits: list[Path] = []

    staged: list[Path] = []

    def remove_tree(path: Path) -> None:
        hits.append(path)
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))

    def save(path: Path) -> None:
        write(path, {"a": b"a"})
        staged.append(path)
        raise boom

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "remove_tree", remove_tree)
        with pytest.raises(RuntimeError, match="the save failed") as info:
            commit_with(ckpts, 2, save)
    (staging,) = staged
    assert hits == [staging]
    assert info.value is boom
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1
    assert str(staging) in notes[0]
    assert "Device or resource busy" in notes[0]
    assert ckpts.steps() == [1]
    assert staging.is_dir()  # left behind, but invisible to the scanner ...
    lock = staging.with_name(staging.name + ".lock")
    assert lock.is_file()  # ... with its lock file, the evidence that it is ours ...
    assert ckpts.clean() == [staging, lock]  # ... and removed by clean()
    assert_untouched(ckpts)


@pytest.mark.parametrize("step", [1, 2], ids=["rewrite", "new-step"])
def test_root_fsync_failure_after_promotion_is_not_durable_error(
    committed: CheckpointDir, step: int
) -> None:
    """If the root fsync fails after promotion, NotDurableError says so; the new save stays."""
    ckpts = committed
    hits: list[Path] = []
    real_fsync_dir = _fs.fsync_dir

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        if Path(path) == ckpts.root:
            hits.append(Path(path))
            raise OSError(errno.EIO, "Input/output error")
        real_fsync_dir(path)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "fsync_dir", fsync_dir)
        with pytest.raises(NotDurableError) as info, ckpts.commit(step) as path:
            write(path, {"new.bin": b"new"})
    assert hits
    assert isinstance(info.value, OSError)
    assert "may not survive a power loss" in str(info.value)
    assert info.value.path == ckpts.path_of(step)
    assert isinstance(info.value.__cause__, OSError)
    assert contents(ckpts.path_of(step)) == {"new.bin": b"new"}
    ckpts.verify(step)
    left = set(os.listdir(ckpts.root)) - {"1", str(step)}
    if step == 1:
        # The old copy may be the only durable one: it stays (its marker intact) for
        # clean(), which removes it once the disk works again.
        (old,) = left
        assert (ckpts.root / old / MARKER).is_file()
        assert [p.name for p in ckpts.clean()] == [old]
    else:
        assert left == set()
    assert set(os.listdir(ckpts.root)) == {"1", str(step)}


def test_root_lock_timeout_is_a_timeout_error(committed: CheckpointDir) -> None:
    """When another holder keeps the root lock, the promotion raises CheckpointTimeoutError
    (the root lock is taken only to promote) and nothing is promoted."""
    ckpts = CheckpointDir(committed.root, lock_timeout=0)
    holder = FileLock(ckpts.root / ROOT_LOCK, thread_local=False)
    with holder:
        with pytest.raises(TimeoutError) as info, ckpts.commit(2) as path:
            write(path, {"x.bin": b"x"})
        assert isinstance(info.value, CheckpointTimeoutError)
        assert info.value.path == ckpts.root
    assert_untouched(ckpts, ROOT_LOCK)  # filelock leaves its file; ours removes it


def test_numpy_and_torch_integer_steps_are_accepted(ckpts: CheckpointDir) -> None:
    """Steps from training loops (numpy or torch integers) commit like ints; bool never does."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    for raw in (np.int64(3), torch.tensor(4)):
        with ckpts.commit(raw) as path:
            (path / "f").write_text("x")
    assert ckpts.steps() == [3, 4]
    with pytest.raises(InvalidStepError):
        ckpts.commit(np.bool_(True)).__enter__()


def test_failed_rollback_of_the_fallback_keeps_the_original_error(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If moving the old copy back also fails, the promote error is raised with a note."""
    with ckpts.commit(5) as path:
        (path / "f").write_text("old")

    def no_exchange(a: Path, b: Path) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_fs, "rename_exchange", no_exchange)
    hits: list[str] = []
    real_rename = _fs.rename

    real_noreplace = _fs.rename_noreplace

    def rename_noreplace(src: Path, dst: Path) -> None:
        if dst.exists():
            real_noreplace(src, dst)  # the first try, for a new step: FileExistsError
        hits.append("promote")
        raise OSError(errno.ENOSPC, "injected", str(src))

    def rename(src: Path, dst: Path) -> None:
        if dst == ckpts.root / "5":
            hits.append("undo")
            raise OSError(errno.EIO, "injected undo", str(src))
        real_rename(src, dst)

    monkeypatch.setattr(_fs, "rename_noreplace", rename_noreplace)
    monkeypatch.setattr(_fs, "rename", rename)
    with pytest.raises(OSError, match="injected") as info, ckpts.commit(5) as path:
        (path / "f").write_text("new")
    assert hits == ["promote", "undo"]
    assert info.value.errno == errno.ENOSPC
    assert any("clean() renames it back" in n for n in info.value.__notes__)
    monkeypatch.undo()
    ckpts.clean()
    assert (ckpts.root / "5" / "f").read_text() == "old"
