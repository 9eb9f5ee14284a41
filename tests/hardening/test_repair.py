"""Repair, retention and adoption never lose a checkpoint, and never stall a commit."""

from __future__ import annotations

import errno
import math
import multiprocessing as mp
import os
import sys
import threading
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import BEST_LINK, MARKER, TMP_INFIX, CheckpointDir, NotDurableError
from atomic_ckpt.cli import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: fork, /proc")

CTX = mp.get_context("fork")


def _commit(ckpts: CheckpointDir, step: int, data: bytes, **metadata: Any) -> None:
    with ckpts.commit(step, metadata=metadata) as path:
        (path / "model.bin").write_bytes(data)


def _fd_path(fd: Any) -> str:
    """The path an open descriptor refers to (Linux: /proc/self/fd)."""
    number = fd if isinstance(fd, int) else fd.fileno()
    try:
        return os.readlink(f"/proc/self/fd/{number}")
    except OSError:
        return ""


# ---------------------------------------------------------------- clean() with another prefix


def _interrupted_fallback_replace(root: Path) -> Path:
    """On disk, what a crash inside the move-aside replace of ``checkpoint-5`` leaves.

    The old (and only) copy is complete under ``checkpoint-5.tmp-old-<t>``, the
    writer's staging dir ``checkpoint-5.tmp-<t>`` is still there, and there is
    no ``checkpoint-5``. Returns the old copy's path.
    """
    named = CheckpointDir(root, prefix="checkpoint-")
    _commit(named, 5, b"the only copy")
    token = uuid.uuid4().hex
    aside = root / f"checkpoint-5{TMP_INFIX}old-{token}"
    os.rename(named.path_of(5), aside)
    (root / f"checkpoint-5{TMP_INFIX}{token}").mkdir()
    return aside


def _assert_step_5_survives(root: Path, aside: Path) -> None:
    final = root / "checkpoint-5"
    assert (final / MARKER).is_file() or (aside / MARKER).is_file(), (
        "the only copy of checkpoint-5 was deleted"
    )
    named = CheckpointDir(root, prefix="checkpoint-")
    named.clean()  # the right prefix restores it, if the other clean() did not
    assert named.steps() == [5]
    assert (named.verify(5).path / "model.bin").read_bytes() == b"the only copy"


def test_clean_with_another_prefix_never_deletes_a_restorable_old_copy(tmp_path: Path) -> None:
    """clean() whose prefix does not parse a step's name leaves (or restores) its only copy."""
    root = tmp_path / "ckpts"
    aside = _interrupted_fallback_replace(root)
    CheckpointDir(root).clean()  # prefix "" does not parse "checkpoint-5"
    _assert_step_5_survives(root, aside)


def test_cli_clean_without_prefix_never_deletes_a_restorable_old_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`atomic-ckpt clean ROOT` without --prefix keeps (or restores) a prefixed step's only copy."""
    root = tmp_path / "ckpts"
    aside = _interrupted_fallback_replace(root)
    assert main(["clean", str(root)]) == 0
    capsys.readouterr()
    _assert_step_5_survives(root, aside)


# ---------------------------------------------------------------- prune() racing retain()


class _Listing:
    """A finished ``os.scandir`` listing, replayed (so the caller can be paused after it)."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self._it = iter(entries)

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> os.DirEntry[str]:
        return next(self._it)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass


def _prune_pausing_after_listing(root: str, conn: Connection) -> None:
    """Child: prune(keep_last=1), pausing right after its first listing of the root.

    It says "listed" and waits for "go": meanwhile another process may act on
    the root. A correct prune holds the root lock across its decision, so the
    other process waits; the current one decides on what it listed earlier.
    """
    real_scandir, real_listdir = os.scandir, os.listdir
    paused = False

    def is_root(path: Any) -> bool:
        return isinstance(path, str | os.PathLike) and os.path.realpath(path) == root

    def pause() -> None:
        nonlocal paused
        paused = True
        conn.send("listed")
        assert conn.recv() == "go"

    def scandir(path: Any = ".") -> Any:
        if paused or not is_root(path):
            return real_scandir(path)
        with real_scandir(path) as it:
            entries = list(it)
        pause()
        return _Listing(entries)

    def listdir(path: Any = ".") -> list[Any]:
        names = real_listdir(path)
        if not paused and is_root(path):
            pause()
        return names

    os.scandir = scandir
    os.listdir = listdir
    CheckpointDir(root).prune(keep_last=1)
    conn.send("done")


def _retain_by_metric(root: str) -> None:
    """Child: point checkpoint_best at the lowest loss and keep only the latest besides."""
    CheckpointDir(root).retain(metric="loss", keep_last=1)


def test_prune_racing_a_retain_never_leaves_best_dangling(tmp_path: Path) -> None:
    """While prune() decides, a retain() in another process that moves checkpoint_best waits for it.

    Steps 1 (loss 0.5), 2 (loss 0.1), 3 (loss 0.7); checkpoint_best names 1. A
    prune(keep_last=1) lists the root and is paused; a retain(metric="loss")
    then moves checkpoint_best to 2, which the prune chose to delete.
    """
    root = tmp_path / "ckpts"
    ckpts = CheckpointDir(root)
    _commit(ckpts, 1, b"one", loss=0.5)
    ckpts.retain(metric="loss", keep_last=3)
    _commit(ckpts, 2, b"two", loss=0.1)
    _commit(ckpts, 3, b"three", loss=0.7)
    assert os.readlink(root / BEST_LINK) == "1"

    parent_end, child_end = CTX.Pipe()
    pruner = CTX.Process(target=_prune_pausing_after_listing, args=(str(ckpts.root), child_end))
    pruner.start()
    retainer: mp.process.BaseProcess | None = None
    try:
        assert parent_end.poll(10), "the pruning process never listed the root"
        assert parent_end.recv() == "listed"
        retainer = CTX.Process(target=_retain_by_metric, args=(str(ckpts.root),))
        retainer.start()
        retainer.join(1.5)  # done by now, unless it rightly waits for the pruner's lock
        parent_end.send("go")
        assert parent_end.poll(10), "the pruning process did not finish"
        assert parent_end.recv() == "done"
        pruner.join(10)
        retainer.join(10)
    finally:
        for proc in (pruner, retainer):
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join()
    assert pruner.exitcode == 0
    assert retainer.exitcode == 0
    link = root / BEST_LINK
    if os.path.lexists(link):
        target = os.readlink(link)
        assert (root / target / MARKER).is_file(), f"{BEST_LINK} -> {target}, which was deleted"
        best = ckpts.best()
        assert best is not None
        assert best.step in ckpts.steps()


# ---------------------------------------------------------------- mark_complete() vs commit()


def test_mark_complete_of_a_big_tree_does_not_stall_a_concurrent_commit(tmp_path: Path) -> None:
    """A commit with a short lock timeout succeeds while mark_complete() hashes a big tree."""
    root = tmp_path / "ckpts"
    legacy = root / "1"
    legacy.mkdir(parents=True)
    with open(legacy / "weights.bin", "wb") as f:
        f.truncate(1 << 30)  # sparse: nothing to write, but sha256 still reads 1 GiB
    adopter = CheckpointDir(root, checksum="sha256")
    writer = CheckpointDir(root, lock_timeout=0.2)
    outcome: dict[str, BaseException | None] = {}

    def adopt() -> None:
        try:
            adopter.mark_complete(1)
            outcome["adopt"] = None
        except BaseException as exc:
            outcome["adopt"] = exc

    thread = threading.Thread(target=adopt)
    thread.start()
    try:
        time.sleep(0.05)
        assert thread.is_alive(), "mark_complete finished at once: the tree is not big enough"
        _commit(writer, 2, b"saved while the legacy tree is adopted")
    finally:
        thread.join(60)
    assert outcome["adopt"] is None
    assert writer.steps() == [1, 2]


# ---------------------------------------------------------------- failed mark_complete()


def test_a_failed_mark_complete_leaves_no_temporary_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When writing the marker fails, the adopted directory is left as it was: no temp marker."""
    root = tmp_path / "ckpts"
    legacy = root / "1"
    legacy.mkdir(parents=True)
    (legacy / "weights.bin").write_bytes(b"legacy weights")
    ckpts = CheckpointDir(root)
    real_fsync = os.fsync
    hits: list[str] = []

    def fsync(fd: Any) -> None:
        # Any file the library creates in the directory: the marker or its temporary name.
        path = _fd_path(fd)
        if os.path.dirname(path) == str(ckpts.path_of(1)) and os.path.basename(path) not in (
            "weights.bin",
            "",
        ):
            hits.append(path)
            raise OSError(errno.EIO, "injected: fsync of the marker failed")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError):  # noqa: PT011 (the injected EIO, wrapped or not)
        ckpts.mark_complete(1)
    monkeypatch.undo()
    assert hits, "the injected fsync failure was never hit"
    assert sorted(os.listdir(legacy)) == ["weights.bin"]


# ---------------------------------------------------------------- NotDurableError: keep the old


def test_not_durable_replace_keeps_the_old_copy(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the root fsync after promotion fails, the replaced copy is kept (for clean())."""
    _commit(ckpts, 1, b"old")
    root = ckpts.root
    real_fsync = os.fsync
    hits: list[str] = []

    def fsync(fd: Any) -> None:
        if (
            not hits
            and _fd_path(fd) == str(root)
            and (ckpts.path_of(1) / "model.bin").read_bytes() == b"new!"
        ):
            hits.append("root fsync after promotion")
            raise OSError(errno.EIO, "injected: fsync of the root failed")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(NotDurableError):
        _commit(ckpts, 1, b"new!")
    monkeypatch.undo()
    assert hits, "the injected root fsync failure was never hit"
    assert (ckpts.path_of(1) / "model.bin").read_bytes() == b"new!"
    old = [
        p
        for p in root.iterdir()
        if p != ckpts.path_of(1) and p.is_dir() and (p / "model.bin").is_file()
    ]
    assert [(p / "model.bin").read_bytes() for p in old] == [b"old"], (
        "the old copy, maybe the only durable one, was deleted"
    )
    assert ckpts.steps() == [1]


# ---------------------------------------------------------------- clean() and foreign names


@pytest.fixture
def foreign(ckpts: CheckpointDir) -> list[Path]:
    """A root with step 1 and a user's own ``notes.tmp-<hex>`` file and ``scratch.tmp-<hex>/``."""
    _commit(ckpts, 1, b"one")
    notes = ckpts.root / f"notes{TMP_INFIX}{uuid.uuid4().hex}"
    notes.write_text("my notes")
    scratch = ckpts.root / f"scratch{TMP_INFIX}{uuid.uuid4().hex}"
    scratch.mkdir()
    (scratch / "data.txt").write_text("my data")
    return [notes, scratch]


def test_clean_leaves_tmp_names_it_did_not_create_alone(
    ckpts: CheckpointDir, foreign: list[Path]
) -> None:
    """clean() removes only what this library left, not any ``<name>.tmp-<32 hex>`` entry."""
    assert not set(ckpts.clean(dry_run=True)) & set(foreign)
    removed = ckpts.clean()
    assert not set(removed) & set(foreign)
    assert foreign[0].read_text() == "my notes"
    assert (foreign[1] / "data.txt").read_text() == "my data"


# ---------------------------------------------------------------- metadata


@pytest.mark.parametrize("metadata", [[], [("loss", 0.5)]], ids=["empty-list", "pairs"])
def test_metadata_must_be_a_mapping(ckpts: CheckpointDir, metadata: list[Any]) -> None:
    """metadata that is not a mapping (even an empty list) is refused before anything is written."""
    with pytest.raises((TypeError, ValueError)), ckpts.commit(1, metadata=metadata) as path:  # type: ignore[arg-type]
        (path / "model.bin").write_bytes(b"x")
    assert ckpts.steps() == []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_metadata_is_recorded_and_read_back(ckpts: CheckpointDir, value: float) -> None:
    """A NaN (or infinite) metric is committed (encoded, the marker stays standard JSON) and
    read back as the same float."""
    _commit(ckpts, 1, b"x", loss=value)
    got = ckpts.get(1).manifest.metadata["loss"]
    assert got == value or (math.isnan(got) and math.isnan(value))
