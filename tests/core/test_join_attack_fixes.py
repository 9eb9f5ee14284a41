"""Issue 30 hardening, found by an outside attack: a checkpoint the scanner calls complete
never holds bytes of an unfinished save or of more than one save. A nested commit of an
open step without ``join=True`` is refused; a join is bound to the process that opened the
commit, and one from another thread is refused once that commit ended; a full disk is a
DiskFullError (an OSError, errno ENOSPC) that leaves nothing behind; a resume never starts
fresh silently over complete checkpoints written under another prefix."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from treeutil import contents, write

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CommitStateError,
    DiskFullError,
    RetentionPolicy,
    UnusableCheckpointsError,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.distributed import rank0_commit

Opener = Callable[[CheckpointDir, int], AbstractContextManager[Path | None]]


@contextlib.contextmanager
def _begun(c: CheckpointDir, s: int) -> Iterator[Path]:
    """``with begin(s) as handle``, yielding its staging path."""
    with c.begin(s) as handle:
        yield handle.path


NESTED: dict[str, Opener] = {
    "commit": lambda c, s: c.commit(s),
    "begin": _begun,
    "rank0_commit": rank0_commit,
}


def _leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if ".tmp-" in n)


# ---------------------------------------------------------------- 1: a nested non-join commit


@pytest.mark.parametrize("inner", NESTED, ids=str)
@pytest.mark.parametrize("outer", ["commit", "begin"], ids=lambda o: f"in-{o}")
def test_a_nested_commit_of_the_open_step_without_join_is_refused_naming_join(
    ckpts: CheckpointDir, inner: str, outer: str
) -> None:
    """``with commit(5): ... with commit(5):`` (no join=True) in one thread: the inner one
    is refused at once with CommitStateError naming join=True, before it stages anything;
    nothing is published meanwhile, and the outer commit publishes all of its files."""
    with NESTED[outer](ckpts, 5) as path:
        assert path is not None
        write(path, {"a.bin": b"a"})
        before = _leftovers(ckpts.root)
        with pytest.raises(CommitStateError, match="join=True"), NESTED[inner](ckpts, 5):
            raise AssertionError("the nested commit started")
        assert _leftovers(ckpts.root) == before  # nothing staged by the refused one
        assert ckpts.steps() == []
        write(path, {"b.bin": b"b"})
    assert contents(ckpts.verify(5).path) == {"a.bin": b"a", "b.bin": b"b"}
    assert _leftovers(ckpts.root) == []


def test_a_nested_named_commit_without_join_is_refused(ckpts: CheckpointDir) -> None:
    """The same for commit_named: the inner block is refused, the outer publishes whole."""
    with ckpts.commit_named("interrupted") as path:
        write(path, {"a.bin": b"a"})
        with (
            pytest.raises(CommitStateError, match="join=True"),
            ckpts.commit_named("interrupted"),
        ):
            raise AssertionError("the nested commit started")
        assert ckpts.named() == []
        write(path, {"b.bin": b"b"})
    assert contents(ckpts.get_named("interrupted").path) == {"a.bin": b"a", "b.bin": b"b"}


def test_a_nested_commit_of_another_step_still_commits(ckpts: CheckpointDir) -> None:
    """Only the open step is refused: a commit of another step inside it is independent."""
    with ckpts.commit(5) as path:
        write(path, {"a.bin": b"a"})
        with ckpts.commit(4) as other:
            write(other, {"x.bin": b"x"})
        assert ckpts.steps() == [4]
    assert ckpts.steps() == [4, 5]


# ---------------------------------------------------------------- 2: a forked child joining


def _in_child(body: Callable[[], str]) -> str:
    """Run ``body`` in a forked child; return what it returned (or its error's repr)."""
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            out = body()
        except BaseException as exc:
            out = f"{type(exc).__name__}: {exc}"
        os.write(write_end, out.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


JOINS_IN_CHILD: dict[str, Callable[[CheckpointDir], AbstractContextManager[Path | None]]] = {
    "commit": lambda c: c.commit(6, join=True),
    "rank0_commit": lambda c: rank0_commit(c, 6, join=True),
}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("joiner", JOINS_IN_CHILD, ids=str)
@pytest.mark.parametrize("outer", ["commit", "rank0_commit"], ids=lambda o: f"in-{o}")
def test_a_child_forked_inside_a_commit_cannot_join_it(
    ckpts: CheckpointDir, joiner: str, outer: str
) -> None:
    """A child forked inside an open commit inherits the registry of open commits, but a
    join there is refused with CommitStateError naming the fork: the child publishes
    nothing (no part of step 6 appears), and the parent's commit publishes whole."""
    opener = NESTED[outer]
    with opener(ckpts, 6) as path:
        assert path is not None
        write(path, {"a.bin": b"a"})

        def child() -> str:
            with JOINS_IN_CHILD[joiner](ckpts) as inner:
                assert inner is not None
                write(inner, {"child.bin": b"c"})
            return "joined"

        out = _in_child(child)
        assert out.startswith("CommitStateError"), out
        assert "fork" in out, out
        assert ckpts.steps() == []  # the child published no part of step 6
    assert contents(ckpts.verify(6).path) == {"a.bin": b"a"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_inside_a_named_commit_cannot_join_it(ckpts: CheckpointDir) -> None:
    """commit_named(join=True) in a forked child is refused the same way."""
    with ckpts.commit_named("interrupted") as path:
        write(path, {"a.bin": b"a"})

        def child() -> str:
            with ckpts.commit_named("interrupted", join=True) as inner:
                write(inner, {"child.bin": b"c"})
            return "joined"

        out = _in_child(child)
        assert out.startswith("CommitStateError"), out
        assert "fork" in out, out
        assert ckpts.named() == []
    assert contents(ckpts.get_named("interrupted").path) == {"a.bin": b"a"}


# ---------------------------------------------------------------- 3: joining after the end


def _join_from_thread(ckpts: CheckpointDir, step: int) -> list[BaseException]:
    seen: list[BaseException] = []

    def late() -> None:
        try:
            with ckpts.commit(step, join=True) as p:
                write(p, {"shard1.bin": b"late"})
        except BaseException as exc:
            seen.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    thread.join(30)
    return seen


def test_a_thread_joining_after_the_outer_commit_aborted_publishes_nothing(
    ckpts: CheckpointDir,
) -> None:
    """The outer commit of step 7 raised and aborted; a shard writer that joins it only
    now gets CommitStateError naming the abort: no step holding its single shard appears."""

    def trainer_save() -> None:
        with ckpts.commit(7) as path:
            write(path, {"shard0.bin": b"0"})
            raise ValueError("the trainer's save failed on purpose")

    with pytest.raises(ValueError, match="on purpose"):
        trainer_save()
    seen = _join_from_thread(ckpts, 7)
    assert [type(e) for e in seen] == [CommitStateError]
    assert "aborted" in str(seen[0])
    assert ckpts.steps() == []
    assert _leftovers(ckpts.root) == []


def test_the_thread_that_began_the_aborted_commit_may_commit_alone_again(
    ckpts: CheckpointDir,
) -> None:
    """Only a join from another thread (or process) is a late part: in the thread that
    began the aborted commit, ``join=True`` is the save function called alone (a retry),
    and commits as documented; nothing of the aborted save is in it."""
    with pytest.raises(ValueError, match="on purpose"):
        _failing_save(ckpts, 7)
    with ckpts.commit(7, join=True) as path:
        write(path, {"whole.bin": b"w"})
    assert contents(ckpts.verify(7).path) == {"whole.bin": b"w"}


def test_a_late_join_after_a_publish_is_refused_even_once_the_step_was_pruned(
    ckpts: CheckpointDir,
) -> None:
    """Published, then deleted by retention: a late joiner of that step still gets
    CommitStateError saying that commit was published, never a step 1 holding its shard."""
    keep = RetentionPolicy(keep_last=1)
    with ckpts.commit(1, retain=keep) as path:
        write(path, {"shard0.bin": b"0"})
    with ckpts.commit(2, retain=keep) as path:
        write(path, {"shard0.bin": b"0"})
    assert ckpts.steps() == [2]
    seen = _join_from_thread(ckpts, 1)
    assert [type(e) for e in seen] == [CommitStateError]
    assert "published" in str(seen[0])
    assert ckpts.steps() == [2]


def test_a_joiner_racing_the_abort_never_publishes_its_part(ckpts: CheckpointDir) -> None:
    """A joiner that arrives while the outer commit is being aborted (its state already
    changed, its staging dir not yet removed): refused, nothing published."""
    ready, go = threading.Event(), threading.Event()
    seen: list[BaseException] = []
    real_remove = _fs.remove_tree
    hit: list[Path] = []

    def slow_remove(path: Path) -> None:
        hit.append(path)
        ready.set()
        go.wait(30)
        real_remove(path)

    def late() -> None:
        ready.wait(30)
        try:
            with ckpts.commit(8, join=True) as p:
                write(p, {"shard1.bin": b"late"})
        except BaseException as exc:
            seen.append(exc)
        finally:
            go.set()

    thread = threading.Thread(target=late)
    thread.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fs, "remove_tree", slow_remove)
        with pytest.raises(ValueError, match="on purpose"):
            _failing_save(ckpts, 8)
    thread.join(30)
    assert hit  # the abort was caught in the middle
    assert [type(e) for e in seen] == [CommitStateError]
    assert ckpts.steps() == []


def _failing_save(ckpts: CheckpointDir, step: int) -> None:
    with ckpts.commit(step) as path:
        write(path, {"shard0.bin": b"0"})
        raise ValueError("on purpose")


# ---------------------------------------------------------------- 4: a full disk


def _enospc(path: object = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _check_disk_full(error: BaseException, ckpts: CheckpointDir) -> None:
    assert isinstance(error, DiskFullError)
    assert isinstance(error, OSError)
    assert error.errno == errno.ENOSPC
    assert "full" in str(error)
    assert "free space" in str(error).lower()
    assert ckpts.clean() == []  # nothing left behind for clean() either
    assert _leftovers(ckpts.root) == []
    assert contents(ckpts.verify(1).path) == {"old.bin": b"old"}  # nothing committed lost


@pytest.mark.parametrize("where", ["fsync_file", "write_file_durable", "block"])
def test_enospc_during_a_commit_is_a_disk_full_error_and_leaves_nothing(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """ENOSPC from a file's fsync, from writing the marker, or from the caller's own write
    in the block: DiskFullError (an OSError with errno ENOSPC, saying the disk is full and
    what to do), the original error chained; no staging leftovers; step 1 intact."""
    with ckpts.commit(1) as path:
        write(path, {"old.bin": b"old"})
    hit: list[str] = []

    def failing(*args: object, **kwargs: object) -> None:
        hit.append(where)
        raise _enospc(args[0] if args else None)

    if where != "block":
        monkeypatch.setattr(_fs, where, failing)

    def save() -> None:
        with ckpts.commit(2) as path:
            write(path, {"new.bin": b"new" * 1000})
            if where == "block":
                hit.append(where)
                raise _enospc(path / "new.bin")

    with pytest.raises(OSError, match="is full") as caught:
        save()
    monkeypatch.undo()
    assert hit
    _check_disk_full(caught.value, ckpts)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted at a fresh directory (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a 1 MiB tmpfs needs root and mount(8)")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem refuses (unbuffered: close cannot fail)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    finally:
        os.close(fd)


def test_a_real_full_disk_is_a_disk_full_error_and_loses_nothing(tiny_fs: Path) -> None:
    """On a real 1 MiB filesystem: a save too big for it, then a save on a disk filled to
    the last byte, each end with DiskFullError; clean() finds nothing left, and step 1
    is still there and verifies."""
    ckpts = CheckpointDir(tiny_fs / "root")
    with ckpts.commit(1) as path:
        write(path, {"old.bin": b"old"})
    with pytest.raises(OSError, match="is full") as caught, ckpts.commit(2) as path:
        write(path, {"big.bin": b"x" * 2_000_000})
    _check_disk_full(caught.value, ckpts)
    # Fill the disk to the last block beside the root, then commit a tiny save.
    with pytest.raises(OSError, match="No space") as filled:
        _fill(tiny_fs / "filler")
    assert filled.value.errno == errno.ENOSPC
    with pytest.raises(OSError, match="is full") as caught, ckpts.commit(3) as path:
        write(path, {"small.bin": b"s" * 8192})
    _check_disk_full(caught.value, ckpts)
    assert ckpts.steps() == [1]


# ---------------------------------------------------------------- 5: another prefix


def _complete(root: Path, prefix: str, steps: list[int]) -> None:
    other = CheckpointDir(root, prefix=prefix)
    for step in steps:
        with other.commit(step) as path:
            write(path, {"model.bin": bytes([step])})


@pytest.mark.parametrize(
    ("written", "opened"), [("checkpoint-", ""), ("", "checkpoint-"), ("ckpt_", "checkpoint-")]
)
def test_a_resume_over_checkpoints_of_another_prefix_is_refused_naming_it(
    tmp_path: Path, written: str, opened: str
) -> None:
    """checkpoint-3/ and checkpoint-5/ resumed with the default prefix (or any prefix that
    matches none): UnusableCheckpointsError naming ``prefix='checkpoint-'``, from
    resume_point and resume_plan alike, instead of a silent fresh start at step 0."""
    root = tmp_path / "root"
    _complete(root, written, [3, 5])
    ckpts = CheckpointDir(root, prefix=opened)
    for resume in (ckpts.resume_point, lambda: ckpts.resume_plan().resume()):
        with pytest.raises(UnusableCheckpointsError, match=f"prefix={written!r}") as caught:
            resume()
        assert [p.name for p in caught.value.paths] == [f"{written}3", f"{written}5"]
    assert ckpts.resume_plan().resume(fresh=True) is None  # a deliberate fresh start


def test_legacy_markers_under_another_prefix_are_refused_too(tmp_path: Path) -> None:
    """A Hugging Face root (checkpoint-500/ with an empty, touched marker) opened without
    the prefix: refused, naming the prefix."""
    (tmp_path / "checkpoint-500").mkdir()
    (tmp_path / "checkpoint-500" / MARKER).touch()
    with pytest.raises(UnusableCheckpointsError, match="prefix='checkpoint-'"):
        CheckpointDir(tmp_path).resume_point()


def test_named_checkpoints_aliases_and_own_steps_are_no_other_prefix(tmp_path: Path) -> None:
    """A named checkpoint whose name ends in digits and an alias are not another prefix's
    steps (a fresh start there is right), and a complete checkpoint of the root's own
    prefix is resumed from whatever else the root holds."""
    ckpts = CheckpointDir(tmp_path / "root")
    with ckpts.commit_named("run7") as path:
        write(path, {"m": b"n"})
    assert ckpts.resume_point() is None
    _complete(tmp_path / "root", "checkpoint-", [9])
    with ckpts.commit(2, aliases=["epoch1_step2"]) as path:
        write(path, {"m": b"2"})
    found = ckpts.resume_point()
    assert found is not None
    assert found.step == 2
