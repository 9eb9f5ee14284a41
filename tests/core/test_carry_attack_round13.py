"""Round 13 attack on issue 32 (carry): each test specifies behaviour that failed.

A carry that cannot be made for a reason that has nothing to do with the source (the
disk filling up while the copy fallback writes, the source step replaced by a concurrent
save while its subtree was being carried) must say so, not report the source as
"changed after its commit; run verify() on that checkpoint" (a healthy checkpoint then
looks damaged, and the torch helpers' carry_frozen logs a false corruption warning).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, Commit, StepConflictError, VerificationError
from atomic_ckpt._core.l2_syscalls import share as _share

MODEL = bytes(range(256)) * 64


def _first(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
        (path / "tok").mkdir()
        for k in range(4):
            (path / "tok" / f"{k}.json").write_bytes(b"{%d}" % k)


def test_a_full_disk_during_the_copy_fallback_is_a_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where neither a reflink nor a hard link is possible (another filesystem, a
    link-count limit) the carry copies; a disk that fills up during that copy is an
    OSError with errno ENOSPC (the commit's DiskFullError once the block ends), never a
    VerificationError blaming the source, which is intact and still verifies."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)

    def no_link(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMLINK, "Too many links")

    def full(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_share, "_reflink", lambda fd_in, dst: False)
    monkeypatch.setattr(_share.os, "link", no_link)
    monkeypatch.setattr(_share.os, "sendfile", full)
    with pytest.raises(OSError, match="No space left") as caught, ckpts.begin(2) as commit:
        commit.carry("model.pt", from_=1)
    monkeypatch.undo()
    assert not isinstance(caught.value, VerificationError), caught.value
    assert caught.value.errno == errno.ENOSPC
    assert ckpts.verify(1).step == 1  # the source was never the problem
    assert [c.step for c in ckpts.checkpoints()] == [1]
    assert sorted(os.listdir(tmp_path / "r")) == ["1"]


def test_a_source_replaced_while_its_subtree_is_carried_is_a_step_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another save rewriting the source step while a subtree is carried from it (its
    old directory moved aside and removed under the carry) is a StepConflictError
    ("look it up again and retry"), as amend reports it and as the carry itself reports
    a replacement seen before it starts: the source was not changed after its commit,
    and verify() of it passes."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    real = _share.share_file
    calls = 0

    def share_file(top_fd: int, rel: str, dst: Path, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:  # a concurrent rewrite of step 1 lands mid-subtree
            with ckpts.commit(1) as path:
                (path / "model.pt").write_bytes(MODEL[::-1])
        return real(top_fd, rel, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_share, "share_file", share_file)
    with pytest.raises((StepConflictError, VerificationError)) as caught, ckpts.begin(2) as c:
        c.carry("tok/", from_=1)
    monkeypatch.undo()
    assert isinstance(caught.value, StepConflictError), caught.value
    assert ckpts.verify(1).step == 1
    assert [c.step for c in ckpts.checkpoints()] == [1]


def test_an_atomic_write_whose_block_links_the_target_leaves_no_temporary(tmp_path: Path) -> None:
    """A block that makes the temporary file another hard link of the very file at the
    target (what a dedup against the previous save of the same path does) replaces
    nothing: the temporary name goes, instead of staying behind as a second name that
    keeps the data alive after the target is replaced (rename(2) of two links of one
    inode is a no-op)."""
    from atomic_ckpt import atomic_write

    target = tmp_path / "last.ckpt"
    target.write_bytes(MODEL)
    with atomic_write(target) as tmp:
        os.link(target, tmp)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
    assert os.lstat(target).st_nlink == 1
    assert target.read_bytes() == MODEL


def test_a_carry_in_flight_when_the_block_ends_is_placed_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A carry made from another thread while the block ends (a loader thread carrying
    the tokenizer as the main thread finishes the save) is part of the commit, like a
    joined block: the publish waits for it and puts the file at its name; or, begun after
    the publish started, it is refused with CommitStateError. Never is its private
    waiting name committed as a file of the checkpoint."""
    import threading
    import time

    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    real = _share.share_file
    started = threading.Event()

    def slow(*args: object, **kwargs: object) -> object:
        started.set()
        made = real(*args, **kwargs)  # type: ignore[arg-type]
        time.sleep(0.3)  # the main thread ends the block meanwhile
        return made

    monkeypatch.setattr(_share, "share_file", slow)
    got: list[object] = []

    def carry(commit: object) -> None:
        try:
            got.append(commit.carry("model.pt", from_=1))  # type: ignore[attr-defined]
        except Exception as exc:  # recorded, checked below
            got.append(exc)

    with ckpts.begin(2) as commit:
        thread = threading.Thread(target=carry, args=(commit,))
        thread.start()
        assert started.wait(5)
        (commit.path / "trainable.bin").write_bytes(b"2")
    thread.join()
    names = sorted(os.listdir(tmp_path / "r" / "2"))
    assert not [n for n in names if ".tmp-" in n], names
    assert got[0] in ("hardlink", "reflink", "copy"), got
    assert (tmp_path / "r" / "2" / "model.pt").read_bytes() == MODEL
    assert ckpts.verify(2).step == 2


def test_a_carry_into_a_staging_dir_that_is_gone_does_not_blame_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging dir removed under a carry (the commit aborted by another thread, or
    removed by hand) makes the new name impossible: that error propagates as it is
    (FileNotFoundError, or CommitStateError), never a VerificationError saying the
    intact source changed after its commit."""
    import shutil

    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    real = _share.share_file

    def gone(top_fd: int, rel: str, dst: Path, **kwargs: object) -> object:
        shutil.rmtree(dst.parent)  # the staging dir, aborted meanwhile
        return real(top_fd, rel, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_share, "share_file", gone)
    with pytest.raises(OSError) as caught, ckpts.begin(2) as commit:  # noqa: PT011
        commit.carry("model.pt", from_=1)
    monkeypatch.undo()
    assert not isinstance(caught.value, VerificationError), caught.value
    assert ckpts.verify(1).step == 1


def test_carries_from_joined_threads_at_once_each_get_their_own_waiting_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks joined to one commit from several threads (``join=True``) may each carry a
    different path at the same time (a tokenizer thread, a frozen-weights thread): every
    carry succeeds and every carried file is committed at its name."""
    import threading

    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    real = _share.share_file
    both = threading.Barrier(2, timeout=5)

    def together(*args: object, **kwargs: object) -> object:
        both.wait()  # each carry has named its waiting file; now both make it
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_share, "share_file", together)
    errors: list[BaseException] = []

    def part(commit: Commit, relpath: str) -> None:
        try:
            with ckpts.commit(2, join=True):
                commit.carry(relpath, from_=1)
        except BaseException as exc:  # recorded, checked below
            errors.append(exc)

    with ckpts.begin(2) as commit:
        paths = ("model.pt", "tok/0.json")
        threads = [threading.Thread(target=part, args=(commit, p)) for p in paths]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    monkeypatch.undo()
    assert errors == []
    names = {e.path for e in ckpts.verify(2).manifest.files}
    assert {"model.pt", "tok/0.json"} <= names
    assert not [n for n in names if ".tmp-" in n]


def test_a_block_that_removes_a_carried_file_is_told_which_carry_it_broke(
    tmp_path: Path,
) -> None:
    """A writer that empties its output directory first (removing every entry it finds,
    the private name a carried file waits at among them) makes the carry impossible: the
    commit fails, nothing is published, and the error names the carried path and says the
    block removed it (not a bare rename error between two private names)."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with (  # noqa: PT012
        pytest.raises(FileNotFoundError, match=r"model\.pt.*removed"),
        ckpts.begin(2) as commit,
    ):
        commit.carry("model.pt", from_=1)
        for name in os.listdir(commit.path):
            os.unlink(commit.path / name)
        (commit.path / "trainable.bin").write_bytes(b"2")
    assert [c.step for c in ckpts.checkpoints()] == [1]
    assert ckpts.verify(1).step == 1


def test_a_carry_into_an_amend_is_committed(tmp_path: Path) -> None:
    """An amend's commit takes a carry like any other commit (through a block joined to
    it, ``commit(step, join=True, carry=...)``): the carried file is in the amended
    checkpoint with the source's bytes, beside the files kept and the files written."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with ckpts.commit(2) as path:
        (path / "trainable.bin").write_bytes(b"2")
    with ckpts.amend(2) as path:
        (path / "extra.json").write_bytes(b"{}")
        with ckpts.commit(2, join=True, carry={"model.pt": 1, "tok/": 1}):
            pass
    names = {e.path for e in ckpts.verify(2).manifest.files if e.type == "file"}
    assert names == {
        "trainable.bin",
        "extra.json",
        "model.pt",
        "tok/0.json",
        "tok/1.json",
        "tok/2.json",
        "tok/3.json",
    }
    assert (tmp_path / "r" / "2" / "model.pt").read_bytes() == MODEL
    ckpts.delete(1)
    assert ckpts.verify(2).step == 2
