"""What a real trainer needs (issue 14): amend, late metadata, the open commit of a step,
named checkpoints, the best pointer, aliases, delete, and a safe upgrade from unmarked
checkpoints. One behaviour per test; the kill tests are in tests/crash_real."""

from __future__ import annotations

import errno
import logging
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from treeutil import contents, write

import atomic_ckpt
from atomic_ckpt import (
    BEST_LINK,
    MARKER,
    TMP_INFIX,
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    CheckpointNotFoundError,
    NamedCheckpoint,
    RetentionPolicy,
    StepConflictError,
    UnmarkedCheckpointsError,
)
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l2_syscalls import fs as _fs

OLD = {
    "model.bin": b"weights of epoch 3" * 100,
    "optim/state.pt": b"adam moments" * 50,
    "optim/extra.pt": b"extra",
    "config.json": b'{"lr": 0.1}',
}
TOKEN = "0123456789abcdef0123456789abcdef"
"""A token of the library's form (32 lowercase hex digits), for hand-made leftovers."""


def committed(ckpts: CheckpointDir, step: int, files: dict[str, bytes], **kw: Any) -> Checkpoint:
    with ckpts.commit(step, **kw) as path:
        write(path, files)
    return ckpts.get(step)


def leftovers(root: Path) -> list[str]:
    """Staging dirs, old copies, lock files and temporary links left in the root."""
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and n != ROOT_LOCK)


def inodes(directory: Path) -> dict[str, int]:
    """The inode of every regular file under ``directory`` (the marker left out)."""
    out: dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            p = Path(dirpath, name)
            if name != MARKER and p.is_file() and not p.is_symlink():
                out[p.relative_to(directory).as_posix()] = os.stat(p).st_ino
    return out


def aliases(root: Path) -> dict[str, str]:
    """The aliases of the root: every symlink but the best pointer and temporary links."""
    return {
        n: os.readlink(root / n)
        for n in os.listdir(root)
        if (root / n).is_symlink() and n != BEST_LINK and TMP_INFIX not in n
    }


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], list[tuple[Any, ...]]]:
    """Record the calls of an ``atomic_ckpt._core.l2_syscalls.fs`` function (still calling it)."""
    seen: dict[str, list[tuple[Any, ...]]] = {}

    def record(name: str) -> list[tuple[Any, ...]]:
        real = getattr(_fs, name)
        log = seen.setdefault(name, [])

        def spy(*args: Any, **kwargs: Any) -> Any:
            log.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(_fs, name, spy)
        return log

    return record


# ================================================================ amend


def test_amend_adds_a_file_and_carries_every_other_file_over(ckpts: CheckpointDir) -> None:
    """Files written in the amend are added; every committed file stays, byte for byte."""
    before = committed(ckpts, 3, OLD, metadata={"epoch": 3})
    with ckpts.amend(3) as path:
        assert list(path.iterdir()) == []  # an empty staging dir
        assert TMP_INFIX in path.name
        assert path.parent == ckpts.root
        (path / "val_metrics.json").write_text('{"loss": 0.5}')
    after = ckpts.verify(3)
    assert contents(after.path) == {**OLD, "val_metrics.json": b'{"loss": 0.5}'}
    old_entries = {e.path: e for e in before.manifest.files}
    for entry in after.manifest.files:
        if entry.path != "val_metrics.json":
            assert entry == old_entries[entry.path]  # reused as recorded
    assert ckpts.steps() == [3]
    assert leftovers(ckpts.root) == []


def test_a_file_written_in_the_amend_replaces_the_committed_one(ckpts: CheckpointDir) -> None:
    """A file written under a committed path replaces it (and its manifest entry)."""
    before = committed(ckpts, 3, OLD)
    with ckpts.amend(3) as path:
        (path / "model.bin").write_bytes(b"fine-tuned")
    after = ckpts.verify(3)
    assert contents(after.path) == {**OLD, "model.bin": b"fine-tuned"}
    old = next(e for e in before.manifest.files if e.path == "model.bin")
    new = next(e for e in after.manifest.files if e.path == "model.bin")
    assert (new.size, new.checksum) != (old.size, old.checksum)
    assert new.size == len(b"fine-tuned")


def test_a_file_written_into_a_committed_directory_keeps_its_other_files(
    ckpts: CheckpointDir,
) -> None:
    """Writing optim/new.pt keeps optim/state.pt and optim/extra.pt."""
    committed(ckpts, 3, OLD)
    with ckpts.amend(3) as path:
        (path / "optim").mkdir()
        (path / "optim" / "new.pt").write_bytes(b"new")
    assert contents(ckpts.verify(3).path) == {**OLD, "optim/new.pt": b"new"}


def test_amend_removes_a_file_and_a_whole_directory(ckpts: CheckpointDir) -> None:
    """``remove`` drops the paths named: a file, and a directory with everything below it."""
    committed(ckpts, 3, OLD)
    with ckpts.amend(3, remove=["config.json", "optim"]):
        pass
    after = ckpts.verify(3)
    assert contents(after.path) == {"model.bin": OLD["model.bin"]}
    assert sorted(e.path for e in after.manifest.files) == ["model.bin"]
    assert not (after.path / "optim").exists()


def test_amend_keeps_symlinks_and_empty_directories(ckpts: CheckpointDir) -> None:
    """A committed symlink (as a link) and an empty directory are carried over too."""
    with ckpts.commit(3) as path:
        write(path, OLD)
        (path / "latest_model").symlink_to("model.bin")
        (path / "empty").mkdir()
    with ckpts.amend(3) as path:
        (path / "note.txt").write_text("x")
    after = ckpts.verify(3)
    assert os.readlink(after.path / "latest_model") == "model.bin"
    assert (after.path / "empty").is_dir()


def test_amend_merges_metadata_into_the_manifests(ckpts: CheckpointDir) -> None:
    """New keys are added, given keys replaced, the others kept."""
    committed(ckpts, 3, OLD, metadata={"epoch": 3, "val_loss": None})
    with ckpts.amend(3, metadata={"val_loss": 0.25, "best": True}) as path:
        (path / "val_metrics.json").write_text("{}")
    assert ckpts.get(3).manifest.metadata == {"epoch": 3, "val_loss": 0.25, "best": True}


def test_carried_files_are_hard_links_to_the_committed_version(ckpts: CheckpointDir) -> None:
    """Where links work, a carried file is the committed inode (no copy), alone once promoted."""
    before = committed(ckpts, 3, OLD)
    old_inodes = inodes(before.path)
    with ckpts.amend(3) as path:
        (path / "val.json").write_text("{}")
    after = ckpts.get(3)
    new_inodes = inodes(after.path)
    assert {k: new_inodes[k] for k in old_inodes} == old_inodes
    # The old copy is gone, so nothing else links to them: writing one cannot reach
    # another checkpoint.
    assert all(os.stat(after.path / rel).st_nlink == 1 for rel in OLD)


def test_carried_files_are_neither_hashed_nor_fsynced_again(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, calls: Any
) -> None:
    """Only the new files are hashed and fsynced: carried entries are reused as recorded."""
    from atomic_ckpt._core.l3_formats import tree as _tree

    committed(ckpts, 3, OLD)
    hashed: list[str] = []
    real_checksum = _tree.checksum_file

    def spy(path: Path, algorithm: str, **options: Any) -> str:
        hashed.append(Path(path).name)
        return real_checksum(path, algorithm, **options)

    monkeypatch.setattr(_tree, "checksum_file", spy)
    fsynced = calls("fsync_file")
    with ckpts.amend(3) as path:
        (path / "val.json").write_text("{}")
    assert hashed == ["val.json"]
    assert [Path(p).name for (p,) in fsynced] == ["val.json"]
    ckpts.verify(3)


def test_carried_files_are_copied_and_fsynced_where_links_are_refused(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, calls: Any
) -> None:
    """A filesystem refusing hard links (EXDEV, EPERM...) gets copies, flushed before the rename."""
    before = committed(ckpts, 3, OLD)
    old_inodes = inodes(before.path)
    refused: list[str] = []

    def no_link(src: Any, dst: Any, **kwargs: Any) -> None:
        refused.append(Path(dst).name)
        raise OSError(errno.EXDEV, "no hard links here")

    monkeypatch.setattr(os, "link", no_link)
    fsynced = calls("fsync_file")
    with ckpts.amend(3) as path:
        (path / "val.json").write_text("{}")
    assert sorted(refused) == sorted(Path(rel).name for rel in OLD)  # the fault was hit
    after = ckpts.verify(3)
    assert contents(after.path) == {**OLD, "val.json": b"{}"}
    new_inodes = inodes(after.path)
    assert all(new_inodes[rel] != old_inodes[rel] for rel in OLD)
    assert sorted(Path(p).name for (p,) in fsynced) == sorted(
        [Path(rel).name for rel in OLD] + ["val.json"]
    )


def test_amend_replaces_the_step_by_an_exchange_like_a_commit(
    ckpts: CheckpointDir, calls: Any
) -> None:
    """The amended version is promoted by one atomic exchange, then the root is fsynced."""
    committed(ckpts, 3, OLD)
    exchanges = calls("rename_exchange")
    dir_syncs = calls("fsync_dir")
    with ckpts.amend(3) as path:
        (path / "val.json").write_text("{}")
    assert len(exchanges) == 1
    assert Path(exchanges[0][1]) == ckpts.path_of(3)
    assert Path(dir_syncs[-1][0]) == ckpts.root
    assert leftovers(ckpts.root) == []


def test_metadata_only_amend_rewrites_the_marker_in_place(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, calls: Any
) -> None:
    """No file, nothing removed: same directory, same inodes, a new metadata; no tree walk."""
    from atomic_ckpt._core.l4_protocol import amend as _amend

    before = committed(ckpts, 3, OLD, metadata={"epoch": 3})
    dir_inode = os.stat(before.path).st_ino
    old_inodes = inodes(before.path)
    walked: list[tuple[Path, list[Any]]] = []
    real_sync_tree = _amend.sync_tree

    def spy(top: Path, **kwargs: Any) -> Any:
        out = real_sync_tree(top, **kwargs)
        walked.append((top, out))
        return out

    monkeypatch.setattr(_amend, "sync_tree", spy)
    fsynced = calls("fsync_file")
    renames = calls("rename_exchange")
    dir_syncs = calls("fsync_dir")
    with ckpts.amend(3, metadata={"val_loss": 0.125}):
        pass
    after = ckpts.verify(3)
    assert after.manifest.metadata == {"epoch": 3, "val_loss": 0.125}
    assert after.manifest.files == before.manifest.files
    assert os.stat(after.path).st_ino == dir_inode
    assert inodes(after.path) == old_inodes
    assert fsynced == []
    assert renames == []
    # The only walk is of the (empty) staging dir; the checkpoint's own tree is not walked.
    assert [(TMP_INFIX in top.name, out) for top, out in walked] == [(True, [])]
    assert Path(dir_syncs[-1][0]) == after.path  # the marker's rename made durable
    assert sorted(os.listdir(after.path)) == sorted([MARKER, "model.bin", "optim", "config.json"])
    assert leftovers(ckpts.root) == []


def test_verify_passes_after_every_amend_of_a_chain(ckpts: CheckpointDir) -> None:
    """Add, replace, remove, metadata only, again and again: each result verifies."""
    committed(ckpts, 3, OLD)
    expected = dict(OLD)
    for i in range(4):
        with ckpts.amend(3, metadata={"round": i}, remove=["config.json"] if i == 1 else ()) as p:
            if i != 2:
                (p / f"val{i}.json").write_text(str(i))
                (p / "model.bin").write_bytes(b"model %d" % i)
                expected.update({f"val{i}.json": str(i).encode(), "model.bin": b"model %d" % i})
        if i == 1:
            del expected["config.json"]
        after = ckpts.verify(3)
        assert contents(after.path) == expected
        assert after.manifest.metadata == {"round": i}
    assert leftovers(ckpts.root) == []


def test_amend_of_a_missing_step_is_checkpoint_not_found(ckpts: CheckpointDir) -> None:
    """Only a committed checkpoint can be amended; nothing is created."""
    committed(ckpts, 1, OLD)
    with pytest.raises(CheckpointNotFoundError), ckpts.amend(2):
        pytest.fail("the body must not run")
    assert ckpts.steps() == [1]
    assert leftovers(ckpts.root) == []


def test_amend_of_an_unmarked_directory_is_checkpoint_not_found(ckpts: CheckpointDir) -> None:
    """A step directory without a marker is not committed: amend refuses it, untouched."""
    write(ckpts.root / "2", {"model.bin": b"legacy"})
    with pytest.raises(CheckpointNotFoundError), ckpts.amend(2):
        pytest.fail("the body must not run")
    assert contents(ckpts.root / "2") == {"model.bin": b"legacy"}


def test_amend_of_a_legacy_marker_step_is_refused(ckpts: CheckpointDir) -> None:
    """An empty (touched) marker records no files: amend refuses and says to adopt it first."""
    write(ckpts.root / "2", {"model.bin": b"legacy", MARKER: b""})
    with pytest.raises(StepConflictError, match="mark-complete"), ckpts.amend(2):
        pytest.fail("the body must not run")
    assert contents(ckpts.root / "2") == {"model.bin": b"legacy"}
    assert (ckpts.root / "2" / MARKER).read_bytes() == b""
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("metadata_only", [False, True])
def test_amend_whose_body_raises_leaves_the_checkpoint_intact(
    ckpts: CheckpointDir, metadata_only: bool
) -> None:
    """An exception in the body propagates; the old version stays, no staging dir is left."""
    before = committed(ckpts, 3, OLD, metadata={"epoch": 3})
    marker = (before.path / MARKER).read_bytes()
    with (  # noqa: PT012
        pytest.raises(RuntimeError, match="validation crashed"),
        ckpts.amend(3, metadata={"val_loss": 1.0}) as path,
    ):
        if not metadata_only:
            (path / "model.bin").write_bytes(b"half written")
        raise RuntimeError("validation crashed")
    assert ckpts.verify(3).manifest.metadata == {"epoch": 3}
    assert contents(before.path) == OLD
    assert (before.path / MARKER).read_bytes() == marker
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", ".", ".."])
def test_amend_refuses_remove_paths_outside_the_checkpoint(ckpts: CheckpointDir, bad: str) -> None:
    """A path that is absolute or climbs out is a ValueError before anything happens."""
    committed(ckpts, 3, OLD)
    with pytest.raises(ValueError, match="remove="), ckpts.amend(3, remove=[bad]):
        pytest.fail("the body must not run")
    assert contents(ckpts.verify(3).path) == OLD
    assert leftovers(ckpts.root) == []


def test_amend_refuses_a_single_string_for_remove(ckpts: CheckpointDir) -> None:
    """``remove="weights"`` is a TypeError (as for aliases), not seven one-letter paths."""
    committed(ckpts, 3, {"weights": b"w", "w": b"one letter"})
    with pytest.raises(TypeError), ckpts.amend(3, remove="weights"):
        pass
    assert contents(ckpts.verify(3).path) == {"weights": b"w", "w": b"one letter"}


def test_amend_keeps_the_manifest_verifiable_under_another_checksum(tmp_path: Path) -> None:
    """Amending with a CheckpointDir whose checksum differs from the commit's still verifies."""
    committed(CheckpointDir(tmp_path, checksum="crc32"), 3, OLD)
    reader = CheckpointDir(tmp_path)  # the default, xxh3_128
    with reader.amend(3) as path:
        (path / "val.json").write_text("{}")
    reader.verify(3)
    CheckpointDir(tmp_path, checksum="crc32").verify(3)


def test_the_open_commit_of_an_amend_is_the_steps_staging(ckpts: CheckpointDir) -> None:
    """During an amend, staging(step) is where it writes (a save split over methods works)."""
    committed(ckpts, 3, OLD)
    with ckpts.amend(3) as path:
        assert ckpts.staging(3) == path
    assert ckpts.staging(3) is None


# ================================================================ the commit handle


def test_handle_metadata_may_change_until_publish(ckpts: CheckpointDir) -> None:
    """A metric known after the files are written, set on .metadata (or replaced), is recorded."""
    commit = ckpts.begin(4, metadata={"epoch": 1})
    write(commit.path, OLD)
    commit.metadata["val_loss"] = 0.5
    commit.metadata = {**commit.metadata, "epoch": 2}
    ckpt = commit.publish()
    assert ckpt.manifest.metadata == ckpts.get(4).manifest.metadata == {"epoch": 2, "val_loss": 0.5}


def test_handle_metadata_changed_after_publish_changes_nothing(ckpts: CheckpointDir) -> None:
    """Once published, the manifest on disk is final."""
    commit = ckpts.begin(4, metadata={"epoch": 1})
    commit.publish()
    commit.metadata["epoch"] = 99
    assert ckpts.get(4).manifest.metadata == {"epoch": 1}


def test_staging_finds_this_processs_open_commit_of_a_step(ckpts: CheckpointDir) -> None:
    """staging(step) is the open commit's dir, from any CheckpointDir of the root, else None."""
    assert ckpts.staging(5) is None
    commit = ckpts.begin(5)
    assert ckpts.staging(5) == commit.path
    assert CheckpointDir(ckpts.root).staging(5) == commit.path
    assert ckpts.staging(6) is None
    assert CheckpointDir(ckpts.root, prefix="checkpoint-").staging(5) is None
    write(commit.path, OLD)
    commit.publish()
    assert ckpts.staging(5) is None
    aborted = ckpts.begin(6)
    aborted.abort()
    assert ckpts.staging(6) is None


def test_staging_lets_a_save_split_over_methods_write_one_commit(ckpts: CheckpointDir) -> None:
    """Methods that know only (root, step) write into the open commit; one checkpoint results."""

    def save_model(step: int) -> None:
        where = CheckpointDir(ckpts.root).staging(step)
        assert where is not None
        (where / "model.bin").write_bytes(b"m")

    def save_optimizer(step: int) -> None:
        where = CheckpointDir(ckpts.root).staging(step)
        assert where is not None
        (where / "optim.pt").write_bytes(b"o")

    with ckpts.begin(7):
        save_model(7)
        save_optimizer(7)
    assert contents(ckpts.verify(7).path) == {"model.bin": b"m", "optim.pt": b"o"}


def test_staging_is_none_in_a_forked_child(ckpts: CheckpointDir) -> None:
    """Another process never sees this one's open commit as its own."""
    commit = ckpts.begin(5)
    read, written = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(written, b"none" if ckpts.staging(5) is None else b"seen")
        os._exit(0)
    os.close(written)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"none"
    os.close(read)
    commit.abort()


# ================================================================ named checkpoints


def test_a_named_checkpoint_is_committed_but_never_a_step(ckpts: CheckpointDir) -> None:
    """commit_named makes root/<name>/ complete; latest() and steps() never count it."""
    committed(ckpts, 2, OLD)
    with ckpts.commit_named("interrupted", metadata={"epoch": 3, "step": 40}) as path:
        assert TMP_INFIX in path.name
        write(path, {"model.bin": b"mid-epoch"})
    named = ckpts.get_named("interrupted")
    assert isinstance(named, NamedCheckpoint)
    assert named.name == "interrupted"
    assert named.path == ckpts.root / "interrupted"
    assert named.manifest.step is None
    assert named.manifest.metadata == {"epoch": 3, "step": 40}
    assert contents(named.path) == {"model.bin": b"mid-epoch"}
    assert ckpts.named() == [named]
    assert ckpts.steps() == [2]
    assert ckpts.latest() == ckpts.get(2)
    assert [e.name for e in ckpts.entries(include_staging=True)] == ["2"]
    assert leftovers(ckpts.root) == []


def test_committing_a_name_again_replaces_it(ckpts: CheckpointDir) -> None:
    """A second commit of the same name replaces the first atomically."""
    for data in (b"first", b"second"):
        with ckpts.commit_named("interrupted") as path:
            write(path, {"model.bin": data})
    assert contents(ckpts.get_named("interrupted").path) == {"model.bin": b"second"}
    assert leftovers(ckpts.root) == []


def test_a_named_commit_whose_body_raises_leaves_nothing(ckpts: CheckpointDir) -> None:
    """An exception in the body propagates; no named checkpoint, no staging dir."""
    with pytest.raises(KeyboardInterrupt), ckpts.commit_named("interrupted") as path:  # noqa: PT012
        write(path, {"model.bin": b"half"})
        raise KeyboardInterrupt
    assert ckpts.named() == []
    assert leftovers(ckpts.root) == []


def test_named_lists_complete_named_checkpoints_by_name(ckpts: CheckpointDir) -> None:
    """named() lists every complete named checkpoint, by name, and nothing else."""
    for name in ("zeta", "alpha"):
        with ckpts.commit_named(name) as path:
            write(path, {"m": name.encode()})
    committed(ckpts, 1, OLD, aliases=["first"])
    (ckpts.root / "notes").mkdir()  # no marker: not a checkpoint
    assert [n.name for n in ckpts.named()] == ["alpha", "zeta"]


@pytest.mark.parametrize(
    "name",
    ["5", "checkpoint-5", "a.tmp-x", "a/b", ".hidden", BEST_LINK, MARKER, "", ".", ".."],
)
def test_invalid_names_are_value_errors(tmp_path: Path, name: str) -> None:
    """A name that is a step (digits, prefix and digits), a .tmp- name, hidden, has a slash
    or is the best pointer is refused before anything is created."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix="checkpoint-")
    with pytest.raises(ValueError, match="must be a plain name"), ckpts.commit_named(name):
        pytest.fail("the body must not run")
    with pytest.raises(ValueError, match="must be a plain name"):
        ckpts.get_named(name)
    assert not ckpts.root.exists() or leftovers(ckpts.root) == []


def test_get_named_of_a_missing_or_unmarked_name_is_checkpoint_not_found(
    ckpts: CheckpointDir,
) -> None:
    """No directory, or one without a marker, is not a named checkpoint."""
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get_named("interrupted")
    write(ckpts.root / "interrupted", {"model.bin": b"x"})
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get_named("interrupted")
    assert ckpts.named() == []


def test_promote_named_makes_a_step_whose_manifest_records_it(ckpts: CheckpointDir) -> None:
    """The named checkpoint becomes step N (same files and metadata); verify() agrees."""
    committed(ckpts, 2, OLD)
    with ckpts.commit_named("interrupted", metadata={"epoch": 3}) as path:
        write(path, {"model.bin": b"mid-epoch"})
    ckpt = ckpts.promote_named("interrupted", 3)
    assert ckpt == ckpts.verify(3)
    assert ckpt.path == ckpts.path_of(3)
    assert ckpt.manifest.step == 3
    assert ckpt.manifest.metadata == {"epoch": 3}
    assert contents(ckpt.path) == {"model.bin": b"mid-epoch"}
    assert ckpts.named() == []
    assert ckpts.latest() == ckpt
    assert leftovers(ckpts.root) == []


def test_promote_named_replaces_an_existing_step_like_a_commit(ckpts: CheckpointDir) -> None:
    """Promoting over step N swaps it atomically; the old N goes, nothing is left behind."""
    committed(ckpts, 3, OLD, aliases=["epoch3"])
    with ckpts.commit_named("interrupted") as path:
        write(path, {"model.bin": b"newer"})
    ckpt = ckpts.promote_named("interrupted", 3)
    assert contents(ckpts.verify(3).path) == {"model.bin": b"newer"}
    assert ckpt.manifest.step == 3
    assert ckpts.named() == []
    assert os.readlink(ckpts.root / "epoch3") == "3"
    assert leftovers(ckpts.root) == []


def test_promote_named_of_a_missing_name_is_checkpoint_not_found(ckpts: CheckpointDir) -> None:
    """Nothing to promote: CheckpointNotFoundError, and the step is untouched."""
    committed(ckpts, 3, OLD)
    with pytest.raises(CheckpointNotFoundError):
        ckpts.promote_named("interrupted", 3)
    assert contents(ckpts.verify(3).path) == OLD


def test_a_named_checkpoint_moved_by_hand_is_not_a_complete_step(ckpts: CheckpointDir) -> None:
    """`mv interrupted 5`: its manifest records no step, so, like `mv 5 6`, the scanner and
    verify() agree that 5 is not complete, and say to move it back and promote it."""
    with ckpts.commit_named("interrupted") as path:
        write(path, {"model.bin": b"mid"})
    os.rename(ckpts.root / "interrupted", ckpts.root / "5")
    assert ckpts.steps() == []
    assert ckpts.latest() is None
    (entry,) = ckpts.entries()
    assert entry.status == "invalid"
    assert entry.problem is not None
    assert "records no step" in entry.problem
    assert "promote_named" in entry.problem
    with pytest.raises(CheckpointNotFoundError, match="promote_named"):
        ckpts.verify(5)
    os.rename(ckpts.root / "5", ckpts.root / "interrupted")  # what the message says
    assert ckpts.verify(ckpts.promote_named("interrupted", 5).step).step == 5


def test_a_step_moved_by_hand_to_a_name_is_not_a_named_checkpoint(ckpts: CheckpointDir) -> None:
    """`mv 5 interrupted`: its manifest records step 5, so it is not a complete named
    checkpoint (a hand copy cut short would look complete otherwise); the message says so."""
    committed(ckpts, 5, OLD)
    os.rename(ckpts.path_of(5), ckpts.root / "interrupted")
    assert ckpts.named() == []
    with pytest.raises(CheckpointNotFoundError, match="records step 5"):
        ckpts.get_named("interrupted")
    with pytest.raises(CheckpointNotFoundError, match="records step 5"):
        ckpts.promote_named("interrupted", 6)


def test_a_step_whose_manifest_records_another_step_is_not_complete(
    ckpts: CheckpointDir,
) -> None:
    """`mv 5 6`: the scanner and verify() agree that 6 is not a complete checkpoint
    (its manifest records step 5), and both say so, naming the recorded step."""
    committed(ckpts, 5, OLD)
    os.rename(ckpts.root / "5", ckpts.root / "6")
    assert ckpts.steps() == []
    assert ckpts.latest() is None
    assert ckpts.latest(verify=True) is None
    (entry,) = ckpts.entries()
    assert entry.status == "invalid"
    assert entry.problem is not None
    assert "records step 5" in entry.problem
    with pytest.raises(atomic_ckpt.CheckpointNotFoundError, match="records step 5"):
        ckpts.verify(6)


def test_aliases_of_a_named_checkpoint_follow_its_promotion(ckpts: CheckpointDir) -> None:
    """An alias made with commit_named never dangles: after promote_named it names the step."""
    with ckpts.commit_named("interrupted", aliases=["resume_here"]) as path:
        write(path, {"model.bin": b"mid"})
    assert os.readlink(ckpts.root / "resume_here") == "interrupted"
    ckpts.promote_named("interrupted", 4)
    alias = ckpts.root / "resume_here"
    assert not alias.is_symlink() or (alias.resolve() == ckpts.path_of(4))


# ================================================================ the best pointer


def test_set_best_points_the_best_link_durably(ckpts: CheckpointDir, calls: Any) -> None:
    """set_best(N) makes checkpoint_best -> N, then fsyncs the root; best() reads it."""
    committed(ckpts, 1, OLD)
    committed(ckpts, 2, OLD)
    dir_syncs = calls("fsync_dir")
    ckpt = ckpts.set_best(1)
    assert ckpt == ckpts.get(1) == ckpts.best()
    assert os.readlink(ckpts.root / BEST_LINK) == "1"
    assert Path(dir_syncs[-1][0]) == ckpts.root
    ckpts.set_best(2)
    assert ckpts.best() == ckpts.get(2)
    assert leftovers(ckpts.root) == []


def test_set_best_of_a_step_that_is_not_complete_is_checkpoint_not_found(
    ckpts: CheckpointDir,
) -> None:
    """A missing step, an unmarked dir or a named checkpoint cannot be best; the pointer stays."""
    committed(ckpts, 1, OLD)
    ckpts.set_best(1)
    write(ckpts.root / "2", {"model.bin": b"unmarked"})
    with ckpts.commit_named("interrupted") as path:
        write(path, {"m": b"x"})
    for step in (2, 3):
        with pytest.raises(CheckpointNotFoundError):
            ckpts.set_best(step)
    assert os.readlink(ckpts.root / BEST_LINK) == "1"


def test_a_policy_with_delete_false_only_points_the_best(ckpts: CheckpointDir) -> None:
    """RetentionPolicy(metric=..., delete=False) moves checkpoint_best and deletes nothing."""
    for step, loss in [(1, 0.9), (2, 0.3), (3, 0.5), (4, 0.7)]:
        committed(ckpts, step, OLD, metadata={"val_loss": loss})
    deleted = ckpts.retain(RetentionPolicy(metric="val_loss", delete=False))
    assert deleted == []
    assert ckpts.steps() == [1, 2, 3, 4]
    best = ckpts.best()
    assert best is not None
    assert best.step == 2


def test_a_policy_that_deletes_nothing_needs_a_metric() -> None:
    """RetentionPolicy(delete=False) without a metric would do nothing: ValueError."""
    with pytest.raises(ValueError, match="metric"):
        RetentionPolicy(delete=False)
    with pytest.raises(ValueError, match="metric"):
        RetentionPolicy(keep_last=2, delete=False)


def test_keep_best_plus_last_keeps_the_union(ckpts: CheckpointDir) -> None:
    """keep_last=2 and keep_best=1 by a metric: the last two and the best, pointed at."""
    for step, loss in [(1, 0.9), (2, 0.1), (3, 0.5), (4, 0.7), (5, 0.6)]:
        committed(ckpts, step, OLD, metadata={"val_loss": loss})
    ckpts.retain(RetentionPolicy(keep_last=2, keep_best=1, metric="val_loss"))
    assert ckpts.steps() == [2, 4, 5]
    best = ckpts.best()
    assert best is not None
    assert best.step == 2


# ================================================================ aliases


def test_commit_points_aliases_at_the_step_and_the_scanner_ignores_them(
    ckpts: CheckpointDir,
) -> None:
    """commit(aliases=...) makes root/<alias> -> <step dir> symlinks; steps, entries and
    named checkpoints do not see them."""
    committed(ckpts, 16626, OLD, aliases=["epoch0_step16626", "last"])
    assert aliases(ckpts.root) == {"epoch0_step16626": "16626", "last": "16626"}
    assert contents(ckpts.root / "epoch0_step16626") == OLD
    assert ckpts.steps() == [16626]
    assert [e.name for e in ckpts.entries(include_staging=True)] == ["16626"]
    assert ckpts.named() == []
    assert leftovers(ckpts.root) == []


def test_begin_takes_aliases_too(tmp_path: Path) -> None:
    """The handle points its aliases with the promotion; with a prefix, at the prefixed name."""
    ckpts = CheckpointDir(tmp_path, prefix="checkpoint-")
    commit = ckpts.begin(3, aliases=["epoch1_step3"])
    assert not (tmp_path / "epoch1_step3").is_symlink()  # not before the promotion
    write(commit.path, OLD)
    commit.publish()
    assert aliases(tmp_path) == {"epoch1_step3": "checkpoint-3"}


def test_an_alias_given_again_moves_to_the_new_step(ckpts: CheckpointDir) -> None:
    """An alias that names step 1 is replaced atomically when step 2 takes it."""
    committed(ckpts, 1, OLD, aliases=["last"])
    committed(ckpts, 2, OLD, aliases=["last"])
    assert aliases(ckpts.root) == {"last": "2"}
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("alias", ["7", "checkpoint-7", BEST_LINK, "a.tmp-b", "a/b", "", "..", "."])
def test_invalid_aliases_are_value_errors_before_anything_is_made(
    tmp_path: Path, alias: str
) -> None:
    """A step name, the best pointer, a .tmp- name, a path: ValueError from commit() or
    begin(), before any staging dir exists."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix="checkpoint-")
    with pytest.raises(ValueError, match="alias"), ckpts.commit(1, aliases=[alias]):
        pytest.fail("the body must not run")
    with pytest.raises(ValueError, match="alias"):
        ckpts.begin(1, aliases=[alias])
    assert not ckpts.root.exists() or leftovers(ckpts.root) == []


def test_aliases_must_be_a_collection_not_a_string(ckpts: CheckpointDir) -> None:
    """aliases="last" is a TypeError, not four one-letter aliases."""
    with pytest.raises(TypeError):
        ckpts.begin(1, aliases="last")


def test_an_alias_name_taken_by_a_file_is_refused_before_anything_changes(
    ckpts: CheckpointDir,
) -> None:
    """StepConflictError, and the step is neither promoted nor replaced; the file stays."""
    committed(ckpts, 1, OLD)
    (ckpts.root / "notes.txt").write_text("mine")
    with pytest.raises(StepConflictError), ckpts.commit(1, aliases=["notes.txt"]) as path:
        write(path, {"model.bin": b"new"})
    with pytest.raises(StepConflictError), ckpts.commit(2, aliases=["notes.txt"]) as path:
        write(path, {"model.bin": b"new"})
    assert (ckpts.root / "notes.txt").read_text() == "mine"
    assert contents(ckpts.verify(1).path) == OLD
    assert ckpts.steps() == [1]
    ckpts.clean()
    assert leftovers(ckpts.root) == []


def test_deleting_a_step_removes_its_aliases_only(ckpts: CheckpointDir) -> None:
    """delete(N) removes the aliases naming N; the others stay."""
    committed(ckpts, 1, OLD, aliases=["epoch0", "first"])
    committed(ckpts, 2, OLD, aliases=["epoch1"])
    ckpts.delete(1)
    assert aliases(ckpts.root) == {"epoch1": "2"}


def test_retention_removes_the_aliases_of_what_it_deletes(ckpts: CheckpointDir) -> None:
    """prune/retain never leave an alias naming a deleted step."""
    for step in range(1, 5):
        committed(ckpts, step, OLD, aliases=[f"epoch{step}"])
    ckpts.prune(keep_last=2)
    assert aliases(ckpts.root) == {"epoch3": "3", "epoch4": "4"}
    committed(ckpts, 5, OLD, metadata={"val_loss": 0.1}, aliases=["epoch5"])
    ckpts.retain(RetentionPolicy(metric="val_loss"))
    assert aliases(ckpts.root) == {"epoch5": "5"}


def test_a_commit_retain_policy_removes_aliases_too(ckpts: CheckpointDir) -> None:
    """A retention policy given to commit() removes the deleted steps' aliases."""
    for step in range(1, 4):
        committed(ckpts, step, OLD, aliases=[f"e{step}"], retain=RetentionPolicy(keep_last=1))
    assert aliases(ckpts.root) == {"e3": "3"}


# ================================================================ delete


def test_delete_removes_one_step_durably(ckpts: CheckpointDir, calls: Any) -> None:
    """delete(N): gone at once (the rename made durable), its files removed, nothing left."""
    committed(ckpts, 1, OLD)
    committed(ckpts, 2, OLD)
    dir_syncs = calls("fsync_dir")
    path = ckpts.delete(1)
    assert path == ckpts.path_of(1)
    assert not path.exists()
    assert ckpts.steps() == [2]
    assert any(Path(p) == ckpts.root for (p,) in dir_syncs)
    assert leftovers(ckpts.root) == []


def test_delete_works_on_the_latest_step(ckpts: CheckpointDir) -> None:
    """Unlike prune, delete may remove the latest checkpoint (even the only one)."""
    committed(ckpts, 1, OLD)
    committed(ckpts, 2, OLD)
    ckpts.delete(2)
    assert ckpts.latest() == ckpts.get(1)
    ckpts.delete(1)
    assert ckpts.latest() is None
    assert leftovers(ckpts.root) == []


def test_delete_refuses_the_best_unless_forced(ckpts: CheckpointDir) -> None:
    """The step checkpoint_best names: StepConflictError; force=True deletes it and the pointer."""
    committed(ckpts, 1, OLD)
    committed(ckpts, 2, OLD)
    ckpts.set_best(1)
    with pytest.raises(StepConflictError, match="force"):
        ckpts.delete(1)
    assert ckpts.steps() == [1, 2]
    ckpts.delete(1, force=True)
    assert ckpts.steps() == [2]
    assert not os.path.lexists(ckpts.root / BEST_LINK)
    assert ckpts.best() is None


def test_delete_of_a_step_that_is_not_complete_is_checkpoint_not_found(
    ckpts: CheckpointDir,
) -> None:
    """A missing step or an unmarked dir: CheckpointNotFoundError, nothing removed."""
    write(ckpts.root / "2", {"model.bin": b"unmarked"})
    for step in (1, 2):
        with pytest.raises(CheckpointNotFoundError):
            ckpts.delete(step)
    assert contents(ckpts.root / "2") == {"model.bin": b"unmarked"}


# ================================================================ unmarked roots


@pytest.fixture
def legacy_root(tmp_path: Path) -> Iterator[CheckpointDir]:
    """A root written before atomic_ckpt: epoch dirs without a marker."""
    for step in (0, 1):
        write(tmp_path / "legacy" / str(step), {"model.bin": b"epoch %d" % step})
    return CheckpointDir(tmp_path / "legacy")


def test_resume_point_refuses_a_root_of_only_unmarked_checkpoints(
    legacy_root: CheckpointDir,
) -> None:
    """UnmarkedCheckpointsError (a CheckpointError and a FileExistsError) names the dirs and
    the remedies in a user's terms (`atomic-ckpt mark-complete`, starting from scratch),
    never a library switch."""
    with pytest.raises(UnmarkedCheckpointsError) as info:
        legacy_root.resume_point()
    err = info.value
    assert isinstance(err, CheckpointError)
    assert isinstance(err, FileExistsError)
    assert err.paths == (legacy_root.root / "0", legacy_root.root / "1")
    assert "atomic-ckpt mark-complete" in str(err)
    assert "from scratch deliberately" in str(err)
    assert "fresh" not in str(err)
    assert "0, 1" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert copy.paths == err.paths
    assert str(copy) == str(err)
    with pytest.raises(UnmarkedCheckpointsError):
        legacy_root.resume_point(verify=True)


def test_resume_point_with_fresh_starts_over_deliberately(legacy_root: CheckpointDir) -> None:
    """fresh=True: None (start from scratch), the unmarked dirs untouched."""
    assert legacy_root.resume_point(fresh=True) is None
    assert contents(legacy_root.root / "0") == {"model.bin": b"epoch 0"}


def test_resume_point_is_latest_when_there_is_a_complete_checkpoint(
    legacy_root: CheckpointDir,
) -> None:
    """Unmarked dirs beside a complete checkpoint do not stop a resume; none at all is None."""
    committed(legacy_root, 2, OLD)
    assert legacy_root.resume_point() == legacy_root.get(2)
    assert CheckpointDir(legacy_root.root / "missing").resume_point() is None


def test_torch_resume_refuses_an_unmarked_root_unless_fresh(legacy_root: CheckpointDir) -> None:
    """atomic_ckpt.torch.resume applies the same rule, with fresh= passed through."""
    torch = pytest.importorskip("torch")
    from atomic_ckpt.torch import resume

    model = torch.nn.Linear(2, 1)
    with pytest.raises(UnmarkedCheckpointsError):
        resume(legacy_root, model=model)
    assert resume(legacy_root, model=model, fresh=True) is None


def test_a_commit_over_an_unmarked_dir_warns_naming_it(
    legacy_root: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Replacing an unmarked dir is logged as a warning with its path."""
    with caplog.at_level(logging.WARNING, logger="atomic_ckpt"):
        committed(legacy_root, 0, OLD)
    assert any(
        r.levelno == logging.WARNING and str(legacy_root.root / "0") in r.getMessage()
        for r in caplog.records
    )


# ================================================================ clean(force=True)


def test_clean_force_removes_library_shaped_entries_without_evidence(
    ckpts: CheckpointDir,
) -> None:
    """A staging dir whose lock a power loss dropped: left by clean(), removed by
    clean(force=True); a name not of the library's form is left by both."""
    committed(ckpts, 1, OLD)
    orphan = ckpts.root / f"2.tmp-{TOKEN}"
    write(orphan, {"model.bin": b"half"})
    foreign = ckpts.root / "notes.tmp-mine"
    write(foreign, {"a": b"b"})
    assert ckpts.clean() == []
    assert orphan.is_dir()
    assert ckpts.clean(force=True, dry_run=True) == [orphan]
    assert orphan.is_dir()
    assert ckpts.clean(force=True) == [orphan]
    assert not orphan.exists()
    assert foreign.is_dir()
    assert contents(ckpts.verify(1).path) == OLD


def test_clean_force_never_removes_a_live_save(ckpts: CheckpointDir) -> None:
    """A staging dir whose writer holds its lock survives clean(force=True) and publishes."""
    commit = ckpts.begin(3)
    write(commit.path, OLD)
    assert ckpts.clean(force=True) == []
    commit.publish()
    assert contents(ckpts.verify(3).path) == OLD


def test_the_public_api_exports_the_trainer_names() -> None:
    """UnmarkedCheckpointsError and NamedCheckpoint are importable from atomic_ckpt."""
    assert "UnmarkedCheckpointsError" in atomic_ckpt.__all__
    assert "NamedCheckpoint" in atomic_ckpt.__all__
