"""A commit never writes a manifest its own reader or verify() refuses (issue 21, items 8
and 9): special files and names that are not UTF-8 are refused when committed, by every
path that makes a manifest (commit, amend, mark_complete, a rank's flush, a handle given
its entries)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from treeutil import contents, write

from atomic_ckpt import TMP_INFIX, CheckpointDir, ManifestError, VerificationError
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l3_formats.manifest import FileEntry, Manifest

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")

FILES = {"model.bin": b"M" * 64, "shards/a.bin": b"A" * 8}
NOT_UTF8 = b"caf\xe9.bin"  # Latin-1, as an old tool might name a file
"""A name that is not valid UTF-8 (Python sees it as 'caf\\udce9.bin')."""


def leftovers(root: Path) -> list[str]:
    """Staging dirs, old copies, lock files and temporary links left in the root."""
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and n != ROOT_LOCK)


def fifo(directory: Path) -> None:
    os.mkfifo(directory / "pipe")


def unix_socket(directory: Path) -> None:
    # Bound by a relative name: a socket's path is limited to ~100 bytes.
    here = os.getcwd()
    os.chdir(directory)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind("sock")
    finally:
        os.chdir(here)


def nested_fifo(directory: Path) -> None:
    os.mkfifo(directory / "shards" / "pipe")


SPECIAL: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "socket": unix_socket,
    "fifo-in-a-subdirectory": nested_fifo,
}


def not_utf8_file(directory: Path) -> None:
    with open(os.fsencode(directory) + b"/" + NOT_UTF8, "wb") as f:
        f.write(b"x")


def not_utf8_dir(directory: Path) -> None:
    os.mkdir(os.fsencode(directory) + b"/" + NOT_UTF8)


BAD_NAME: dict[str, Callable[[Path], None]] = {"file": not_utf8_file, "dir": not_utf8_dir}


def save(
    ckpts: CheckpointDir, step: int, files: dict[str, bytes], make: Callable[[Path], None]
) -> None:
    """Commit ``files`` and whatever ``make`` puts in the staging dir."""
    with ckpts.commit(step) as path:
        write(path, files)
        make(path)


# ================================================================ special files (item 8)


@pytest.mark.parametrize("make", SPECIAL.values(), ids=SPECIAL.keys())
def test_a_commit_holding_a_special_file_is_refused(
    ckpts: CheckpointDir, make: Callable[[Path], None]
) -> None:
    """A FIFO or a socket in the save: ManifestError naming it and what it is; nothing is
    committed, nothing is left (it used to commit a checkpoint that never verifies)."""
    with pytest.raises(ManifestError, match=r"pipe|sock") as info:
        save(ckpts, 1, FILES, make)
    assert "FIFO" in str(info.value) or "socket" in str(info.value)
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []


def test_a_commit_refused_for_a_fifo_leaves_the_previous_version(ckpts: CheckpointDir) -> None:
    """Replacing a step with a save that holds a FIFO keeps the old step, which verifies."""
    with ckpts.commit(1) as path:
        write(path, FILES)
    with pytest.raises(ManifestError):
        save(ckpts, 1, {"model.bin": b"new"}, fifo)
    assert contents(ckpts.verify(1).path) == FILES
    assert ckpts.latest(verify=True) == ckpts.get(1)


def test_an_amend_writing_a_fifo_is_refused(ckpts: CheckpointDir) -> None:
    """The amend's new entries are checked alike; the step stays as it was."""
    with ckpts.commit(1) as path:
        write(path, FILES)
    with pytest.raises(ManifestError, match="FIFO"), ckpts.amend(1) as path:
        fifo(path)
    assert contents(ckpts.verify(1).path) == FILES
    assert leftovers(ckpts.root) == []


def test_mark_complete_of_a_directory_holding_a_fifo_is_refused(ckpts: CheckpointDir) -> None:
    """Adopting a directory with a FIFO writes no marker: it stays unmarked."""
    path = ckpts.path_of(2)
    write(path, FILES)
    fifo(path)
    with pytest.raises(ManifestError, match="FIFO"):
        ckpts.mark_complete(2)
    assert not (path / "checkpoint_complete").exists()
    assert ckpts.steps() == []


def test_a_ranks_flush_and_the_coordinators_listing_refuse_a_fifo(ckpts: CheckpointDir) -> None:
    """sync_files (a rank's own files) and list_tree (what the coordinator checks them
    against) refuse it too: a multi-rank commit cannot leave it out of the manifest."""
    staging = ckpts.root / "staging"
    write(staging, FILES)
    fifo(staging)
    with pytest.raises(ManifestError, match="FIFO"):
        ckpts.sync_files(staging, ["model.bin", "pipe"])
    with pytest.raises(ManifestError, match="FIFO"):
        ckpts.list_tree(staging)
    with pytest.raises(ManifestError, match="FIFO"):
        ckpts.sync_tree(staging)


def test_a_fifo_added_after_the_commit_still_fails_verify(ckpts: CheckpointDir) -> None:
    """verify() reports a special file planted in a committed checkpoint, as before."""
    with ckpts.commit(1) as path:
        write(path, FILES)
    fifo(ckpts.path_of(1))
    with pytest.raises(VerificationError, match="pipe"):
        ckpts.verify(1)


# ================================================================ names not UTF-8 (item 9)


@pytest.mark.parametrize("make", BAD_NAME.values(), ids=BAD_NAME.keys())
def test_a_commit_holding_a_name_that_is_not_utf8_is_refused(
    ckpts: CheckpointDir, make: Callable[[Path], None]
) -> None:
    """ManifestError naming the bytes of the name; nothing committed (it used to commit a
    manifest the reader then refused: complete for the scanner, damaged for verify)."""
    with pytest.raises(ManifestError, match="UTF-8") as info:
        save(ckpts, 1, FILES, make)
    assert repr(NOT_UTF8)[2:-1] in str(info.value)
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []


def test_mark_complete_of_a_name_that_is_not_utf8_is_refused(ckpts: CheckpointDir) -> None:
    """Adopting such a directory writes no marker."""
    path = ckpts.path_of(2)
    write(path, FILES)
    not_utf8_file(path)
    with pytest.raises(ManifestError, match="UTF-8"):
        ckpts.mark_complete(2)
    assert not (path / "checkpoint_complete").exists()


def test_a_symlink_target_that_is_not_utf8_commits_and_verifies(ckpts: CheckpointDir) -> None:
    """A link's target is recorded as it is (never followed) and read back equal: the
    reader accepts it, so it is not refused."""
    with ckpts.commit(1) as path:
        write(path, FILES)
        os.symlink(NOT_UTF8, os.fsencode(path) + b"/link")
    ckpt = ckpts.verify(1)
    (link,) = [e for e in ckpt.manifest.files if e.type == "symlink"]
    assert link.target == os.fsdecode(NOT_UTF8)
    with ckpts.amend(1) as path:
        (path / "val.json").write_text("{}")
    ckpts.verify(1)


@pytest.mark.parametrize("bad", [os.fsdecode(NOT_UTF8), "../outside", "a//b", "/abs"])
def test_a_handle_given_entries_the_reader_refuses_publishes_nothing(
    ckpts: CheckpointDir, bad: str
) -> None:
    """publish(files=...) with a path the reader would reject: ManifestError, no step
    (the manifest writer checks every path the reader checks)."""
    commit = ckpts.begin(1)
    write(commit.path, FILES)
    with pytest.raises(ManifestError, match="cannot write a manifest"):
        commit.publish(files=[FileEntry(bad, "file", size=1)])
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []


def test_every_manifest_written_reads_back(ckpts: CheckpointDir) -> None:
    """Names the reader accepts (non-ASCII UTF-8, dots, spaces, newlines) round-trip."""
    names = ["é.bin", "...", ".hidden", "a b", "line\nbreak", "日本"]
    m = Manifest(step=1, files=[FileEntry(n, "file", size=1) for n in sorted(names)])
    assert Manifest.from_bytes(m.to_bytes()).files == m.files


def test_a_manifest_larger_than_the_reader_reads_is_never_written(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More entries than a marker may hold (MAX_MARKER_BYTES, which the reader refuses
    beyond): ManifestError saying so, and nothing committed. (The limit is lowered here:
    reaching 256 MiB takes millions of files.)"""
    from atomic_ckpt._core.l3_formats import manifest as _manifest
    from atomic_ckpt._core.l3_formats import read as _read

    monkeypatch.setattr(_manifest, "MAX_MARKER_BYTES", 2000)
    monkeypatch.setattr(_read, "MAX_MARKER_BYTES", 2000)
    with pytest.raises(ManifestError, match="2000"):
        save(ckpts, 1, {f"f{i:03}.bin": b"x" for i in range(100)}, lambda _: None)
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []
    save(ckpts, 1, {"one.bin": b"x"}, lambda _: None)  # below the limit: read back
    assert ckpts.verify(1).manifest.file_count == 1
