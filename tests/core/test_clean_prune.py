"""clean() removes what crashed saves left, never a live save; prune() never half-deletes a step."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import shutil
import signal
import sys
from collections.abc import Iterator, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from treeutil import contents, snapshot, write

from atomic_ckpt import MARKER, TMP_INFIX, CheckpointDir
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l2_syscalls import fs as _fs

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs fork and SIGKILL")

CTX = mp.get_context("fork")
OLD = {"model.bin": b"old weights", "opt/state.pt": b"old optimizer"}
NEW = {"model.bin": b"new weights!", "opt/state.pt": b"new optimizer"}
TOKEN = "0123456789abcdef" * 2


def commit(ckpts: CheckpointDir, step: int, files: Mapping[str, bytes] = OLD) -> Path:
    with ckpts.commit(step) as path:
        write(path, files)
    return ckpts.path_of(step)


def tmp_entries(root: Path) -> set[str]:
    return {name for name in os.listdir(root) if TMP_INFIX in name and name != ROOT_LOCK}


# ---------------------------------------------------------------- a writer in another process


def _paused_writer(root: str, step: int, conn: Connection) -> None:
    """Child: stage ``step``, report the staging path, then wait for "go" (or to be killed)."""
    ckpts = CheckpointDir(root)
    with ckpts.commit(step) as path:
        write(path, NEW)
        conn.send(str(path))
        conn.recv()
    conn.close()


class Writer:
    """A second process sitting inside ``commit`` until released or killed."""

    def __init__(self, root: Path, step: int) -> None:
        self._conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=_paused_writer, args=(str(root), step, child))
        self.proc.start()
        child.close()
        self.staging = Path(self._conn.recv())  # EOFError, not a hang, if the child dies

    @property
    def lock(self) -> Path:
        return self.staging.with_name(self.staging.name + ".lock")

    def release(self) -> int | None:
        self._conn.send("go")
        self.proc.join()
        return self.proc.exitcode

    def kill(self) -> int | None:
        os.kill(self.proc.pid or 0, signal.SIGKILL)
        self.proc.join()
        return self.proc.exitcode

    def close(self) -> None:
        if self.proc.is_alive():
            self.kill()
        self._conn.close()


@pytest.fixture
def writers() -> Iterator[list[Writer]]:
    """Writers started by a test; any still alive at the end are killed."""
    started: list[Writer] = []
    yield started
    for w in started:
        w.close()


@pytest.mark.parametrize("step", [2, 1], ids=["new-step", "rewrite"])
def test_clean_spares_a_live_writers_staging_dir(
    ckpts: CheckpointDir, writers: list[Writer], step: int
) -> None:
    """clean() (and its dry run) leave alone a staging dir whose writer process is still saving."""
    commit(ckpts, 1)
    w = Writer(ckpts.root, step)
    writers.append(w)
    assert w.staging.is_dir()
    assert w.lock.is_file()
    assert ckpts.clean(dry_run=True) == []
    assert ckpts.clean() == []
    assert contents(w.staging) == NEW
    assert ckpts.steps() == [1]
    assert contents(ckpts.path_of(1)) == OLD
    assert w.release() == 0
    assert sorted({1, step}) == ckpts.steps()
    assert contents(ckpts.path_of(step)) == NEW
    assert tmp_entries(ckpts.root) == set()


@pytest.mark.parametrize("step", [2, 1], ids=["new-step", "rewrite"])
def test_clean_removes_a_killed_writers_staging_dir_and_lock(
    ckpts: CheckpointDir, writers: list[Writer], step: int
) -> None:
    """After a writer is SIGKILLed mid-save, clean() removes its staging dir and lock file."""
    commit(ckpts, 1)
    w = Writer(ckpts.root, step)
    writers.append(w)
    assert w.kill() == -signal.SIGKILL
    assert tmp_entries(ckpts.root) == {w.staging.name, w.lock.name}
    assert ckpts.steps() == [1]  # the orphan is invisible to readers
    assert contents(ckpts.path_of(1)) == OLD
    assert sorted(ckpts.clean()) == sorted([w.staging, w.lock])
    assert tmp_entries(ckpts.root) == set()
    assert set(os.listdir(ckpts.root)) == {"1"}
    ckpts.verify(1)
    assert ckpts.clean() == []


def test_clean_dry_run_removes_nothing(ckpts: CheckpointDir, writers: list[Writer]) -> None:
    """clean(dry_run=True) lists what clean() would remove and changes nothing on disk."""
    commit(ckpts, 1)
    w = Writer(ckpts.root, 2)
    writers.append(w)
    w.kill()
    (ckpts.root / f"7.tmp-{TOKEN}.lock").write_bytes(b"")  # an orphaned lock file alone
    before = snapshot(ckpts.root)
    would = ckpts.clean(dry_run=True)
    assert snapshot(ckpts.root) == before
    assert sorted(would) == sorted([w.staging, w.lock, ckpts.root / f"7.tmp-{TOKEN}.lock"])
    assert sorted(ckpts.clean()) == sorted(would)
    assert set(os.listdir(ckpts.root)) == {"1"}


def test_clean_removes_orphans_of_every_kind(ckpts: CheckpointDir) -> None:
    """Orphaned staging dirs, prune leftovers and lone lock files are removed, even marked ones."""
    real = commit(ckpts, 1)
    orphans = [
        f"2.tmp-{TOKEN}",
        f"3.tmp-del-{'1' * 32}",
        f"4.tmp-{'2' * 32}.lock",
    ]
    shutil.copytree(real, ckpts.root / orphans[0])  # complete-looking, but staging
    shutil.copytree(real, ckpts.root / orphans[1])
    (ckpts.root / orphans[2]).write_bytes(b"")
    removed = ckpts.clean()
    assert sorted(p.name for p in removed) == sorted(orphans)
    assert set(os.listdir(ckpts.root)) == {"1"}


def test_clean_never_touches_checkpoints_or_foreign_names(ckpts: CheckpointDir) -> None:
    """Complete and unmarked checkpoints, files and `.tmp-` names not made by the library stay."""
    commit(ckpts, 1)
    write(ckpts.root / "2", {"model.bin": b"unmarked"})
    (ckpts.root / "notes.txt").write_bytes(b"mine")
    write(ckpts.root / "9.tmp-handmade", {"x": b"not ours"})
    (ckpts.root / "best").symlink_to("1")
    before = snapshot(ckpts.root)
    assert ckpts.clean() == []
    assert snapshot(ckpts.root) == before


# ---------------------------------------------------------------- the fallback's crash window


def _crash_in_fallback_window(root: str) -> None:
    """Child: rewrite step 5 without RENAME_EXCHANGE, dying right after the old copy moves aside."""
    real_rename = _fs.rename

    def no_exchange(a: Path, b: Path) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    def rename(src: Path, dst: Path) -> None:
        real_rename(src, dst)
        if ".tmp-old-" in dst.name:
            os.kill(os.getpid(), signal.SIGKILL)

    _fs.rename_exchange = no_exchange  # type: ignore[assignment]
    _fs.rename = rename  # type: ignore[assignment]
    with CheckpointDir(root).commit(5) as path:
        write(path, NEW)


@pytest.fixture
def crashed_in_window(ckpts: CheckpointDir) -> CheckpointDir:
    """A root where a fallback rewrite of step 5 was killed between its two renames."""
    commit(ckpts, 5, OLD)
    proc = CTX.Process(target=_crash_in_fallback_window, args=(str(ckpts.root),))
    proc.start()
    proc.join()
    assert proc.exitcode == -signal.SIGKILL  # the injected crash was hit
    names = tmp_entries(ckpts.root)
    assert not ckpts.path_of(5).exists()
    assert len(names) == 3  # the old copy aside, the staged new copy and its lock
    assert any(n.startswith("5.tmp-old-") for n in names)  # the plain form
    return ckpts


def test_crash_in_the_fallback_window_is_repaired_by_clean(
    crashed_in_window: CheckpointDir,
) -> None:
    """clean() renames the old copy back to `5/` and removes the dead writer's staging and lock."""
    ckpts = crashed_in_window
    assert ckpts.steps() == []  # the documented window: readers see no step 5 ...
    staged = {n for n in tmp_entries(ckpts.root) if ".tmp-old-" not in n}
    assert len(staged) == 2  # the dead writer's new copy and its lock
    before = snapshot(ckpts.root)
    would = ckpts.clean(dry_run=True)
    assert snapshot(ckpts.root) == before  # ... a dry run does not repair it ...
    removed = ckpts.clean()  # ... clean() does
    assert sorted(removed) == sorted(would)
    assert {p.name for p in removed} == staged
    assert ckpts.steps() == [5]
    assert contents(ckpts.path_of(5)) == OLD
    ckpts.verify(5)
    assert set(os.listdir(ckpts.root)) == {"5"}


def test_crash_in_the_fallback_window_is_repaired_by_the_next_commit(
    crashed_in_window: CheckpointDir,
) -> None:
    """The next commit (under the root lock) also renames the old copy back before promoting."""
    ckpts = crashed_in_window
    commit(ckpts, 6, NEW)
    assert ckpts.steps() == [5, 6]
    assert contents(ckpts.path_of(5)) == OLD
    ckpts.verify(5)
    assert len(ckpts.clean()) == 2  # the dead writer's staging dir and lock
    assert set(os.listdir(ckpts.root)) == {"5", "6"}


# ---------------------------------------------------------------- prune


def test_prune_deletes_all_but_the_newest(ckpts: CheckpointDir) -> None:
    """prune(keep_last=2) deletes the older complete checkpoints and returns their paths."""
    for step in (1, 2, 3, 4, 5):
        commit(ckpts, step)
    removed = ckpts.prune(keep_last=2)
    assert removed == [ckpts.path_of(s) for s in (1, 2, 3)]
    assert ckpts.steps() == [4, 5]
    assert set(os.listdir(ckpts.root)) == {"4", "5"}
    assert ckpts.prune(keep_last=2) == []
    assert ckpts.prune(keep_last=10) == []


def test_prune_never_deletes_the_latest_or_incomplete_dirs(ckpts: CheckpointDir) -> None:
    """keep_last=1 keeps the latest complete step; unmarked and staging dirs are not prune's."""
    for step in (1, 2, 3):
        commit(ckpts, step)
    write(ckpts.root / "9", {"model.bin": b"unmarked, newer"})
    write(ckpts.root / "0", {"model.bin": b"unmarked, older"})
    assert ckpts.prune(keep_last=1) == [ckpts.path_of(1), ckpts.path_of(2)]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 3
    assert (ckpts.root / "9" / "model.bin").exists()
    assert (ckpts.root / "0" / "model.bin").exists()


def test_prune_with_a_prefix(tmp_path: Path) -> None:
    """prune() works on prefixed names."""
    ckpts = CheckpointDir(tmp_path, prefix="checkpoint-")
    for step in (1, 2):
        commit(ckpts, step)
    assert ckpts.prune(keep_last=1) == [tmp_path / "checkpoint-1"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]


@pytest.mark.parametrize("keep_last", [0, -1, True, 1.5, "2", None])
def test_prune_rejects_a_count_that_could_delete_the_latest(
    ckpts: CheckpointDir, keep_last: Any
) -> None:
    """keep_last=0, a negative count or a non-int is a ValueError; nothing is deleted."""
    commit(ckpts, 1)
    commit(ckpts, 2)
    with pytest.raises(ValueError, match="keep_last"):
        ckpts.prune(keep_last=keep_last)
    assert ckpts.steps() == [1, 2]


def test_interrupted_prune_never_leaves_a_complete_looking_dir(ckpts: CheckpointDir) -> None:
    """A deletion that fails halfway leaves an `N.tmp-del-` dir, never a half-deleted `N/`."""
    for step in (1, 2, 3):
        commit(ckpts, step)
    hits: list[Path] = []

    def remove_tree(path: Path) -> None:
        hits.append(path)
        # Delete a data file but keep the marker: only the rename can hide it now.
        (path / "model.bin").unlink()
        raise OSError(errno.EIO, "Input/output error", str(path))

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "remove_tree", remove_tree)
        with pytest.raises(OSError, match="Input/output error"):
            ckpts.prune(keep_last=1)
    assert len(hits) == 1
    half = hits[0]
    assert half.name.startswith("1.tmp-del-")
    assert (half / MARKER).is_file()
    assert not (half / "model.bin").exists()
    assert not ckpts.path_of(1).exists()
    assert not ckpts.path_of(2).exists()
    assert CheckpointDir(ckpts.root).steps() == [3]
    # No lock left: each victim still holds its marker, which tells clean() it is ours.
    assert all(not n.endswith(".lock") for n in tmp_entries(ckpts.root))
    removed = ckpts.clean()
    assert half in removed
    assert len(removed) == 2  # both moved-aside victims
    assert set(os.listdir(ckpts.root)) == {"3"}
    ckpts.verify(3)


def test_clean_deletes_orphans_without_holding_the_root_lock(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """clean() claims orphans under the root lock but deletes them outside it, so commits go on."""
    with ckpts.commit(1) as path:
        (path / "f").write_bytes(b"1")
    orphan = ckpts.root / f"2{TMP_INFIX}{'ab' * 16}"
    orphan.mkdir()
    (orphan / "big").write_bytes(b"x" * 1000)
    lock = ckpts.root / f"2{TMP_INFIX}{'ab' * 16}.lock"  # its dead writer's lock file
    lock.write_bytes(b"")
    real_remove = _fs.remove_tree
    free_during_removal: list[bool] = []

    def remove_and_probe(path: Path) -> None:
        if path == orphan:
            probe = CheckpointDir(ckpts.root, lock_timeout=0)
            probe.prune(keep_last=1)  # CheckpointTimeoutError if clean() still held the lock
            free_during_removal.append(True)
        real_remove(path)

    monkeypatch.setattr(_fs, "remove_tree", remove_and_probe)
    assert ckpts.clean() == [orphan, lock]
    assert free_during_removal == [True]
    assert not orphan.exists()


def test_a_pruned_step_never_comes_back_after_a_fallback_replace(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old copy left by a finished fallback replace never returns, even once it is pruned."""

    def no_exchange(a: Path, b: Path) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_fs, "rename_exchange", no_exchange)
    for step, payload in [(5, b"v1"), (5, b"v2"), (6, b"6"), (7, b"7")]:
        with ckpts.commit(step) as path:
            (path / "f").write_bytes(payload)
    # As if the writer of the second save of 5 died before removing its old copy (step 7).
    old_copy = ckpts.root / f"5{TMP_INFIX}old-{'cd' * 16}"
    shutil.copytree(ckpts.root / "5", old_copy)
    (old_copy / "f").write_bytes(b"v1")
    assert ckpts.prune(keep_last=2) == [ckpts.root / "5"]
    with ckpts.commit(8) as path:
        (path / "f").write_bytes(b"8")
    ckpts.clean()
    assert ckpts.steps() == [6, 7, 8]
    assert not old_copy.exists()
