"""The single-file primitive: atomic_write, write_bytes_atomic, replace_symlink, remove_file."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import (
    TMP_INFIX,
    NotDurableError,
    RootNotWritableError,
    atomic_write,
    clean_temporaries,
    commit_directory,
    parse_step,
    remove_directory,
    remove_file,
    replace_symlink,
    write_bytes_atomic,
)
from atomic_ckpt._core.l1_names.names import NAME_MAX
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l4_protocol import onefile as _onefile


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def inject(
    monkeypatch: pytest.MonkeyPatch, name: str, err: int, *, when: Callable[..., bool] | None = None
) -> list[tuple[Any, ...]]:
    """Make ``_fs.<name>`` raise OSError(err) (when ``when(*args)`` holds); return the hits."""
    real = getattr(_fs, name)
    hits: list[tuple[Any, ...]] = []

    def fault(*args: Any, **kwargs: Any) -> Any:
        if when is None or when(*args):
            hits.append(args)
            raise OSError(err, os.strerror(err), str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(_fs, name, fault)
    return hits


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A directory holding one file, ``model.ckpt``, with the bytes ``old``."""
    path = tmp_path / "run" / "model.ckpt"
    path.parent.mkdir()
    path.write_bytes(b"old")
    return path


# ------------------------------------------------------------------ atomic_write


def test_atomic_write_replaces_the_file_and_leaves_nothing_else(old: Path) -> None:
    """The block's file replaces the target; the directory holds nothing but the target."""
    with atomic_write(old) as tmp:
        assert tmp.parent == old.parent
        assert tmp.name.startswith(".model.ckpt" + TMP_INFIX)
        assert old.read_bytes() == b"old"  # the target is untouched while writing
        tmp.write_bytes(b"new")
    assert old.read_bytes() == b"new"
    assert listing(old.parent) == ["model.ckpt"]


def test_atomic_write_creates_a_missing_file(tmp_path: Path) -> None:
    """A target that did not exist is created."""
    with atomic_write(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"x")
    assert (tmp_path / "a.bin").read_bytes() == b"x"
    assert listing(tmp_path) == ["a.bin"]


def test_temporary_name_is_hidden_and_never_a_step(tmp_path: Path) -> None:
    """The temporary name is hidden, carries .tmp-, is no step, and fits a long name."""
    name = _onefile.temp_name("7")
    assert name.startswith(".7" + TMP_INFIX)
    assert parse_step(name) is None
    long = _onefile.temp_name("é" * 200)
    assert len(long.encode()) <= NAME_MAX
    with atomic_write(tmp_path / ("x" * NAME_MAX)) as tmp:
        tmp.write_bytes(b"long")
    assert (tmp_path / ("x" * NAME_MAX)).read_bytes() == b"long"


@pytest.mark.parametrize("error", [RuntimeError("writer failed"), KeyboardInterrupt()])
def test_a_block_that_raises_leaves_the_old_file_and_no_temporary(
    old: Path, error: BaseException
) -> None:
    """An exception in the block (even KeyboardInterrupt) propagates; old file intact."""

    def save(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise error

    with pytest.raises(type(error)), atomic_write(old) as tmp:
        save(tmp)
    assert old.read_bytes() == b"old"
    assert listing(old.parent) == ["model.ckpt"]


def test_a_block_that_writes_nothing_raises(old: Path) -> None:
    """Writing nothing is an error (FileNotFoundError), not an empty checkpoint."""
    with pytest.raises(FileNotFoundError, match="wrote nothing"), atomic_write(old):
        pass
    assert old.read_bytes() == b"old"


def test_a_block_that_makes_a_directory_raises_and_it_is_removed(old: Path) -> None:
    """A directory at the temporary name is refused and removed."""
    with pytest.raises(IsADirectoryError), atomic_write(old) as tmp:
        (tmp / "sub").mkdir(parents=True)
    assert listing(old.parent) == ["model.ckpt"]


def test_enospc_in_the_file_fsync_leaves_the_old_file(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC at the data fsync: OSError(ENOSPC), old file intact, temporary gone."""
    hits = inject(monkeypatch, "fsync_file", errno.ENOSPC)
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)) as info, atomic_write(old) as tmp:
        tmp.write_bytes(b"new")
    assert hits, "the injected fault did not fire"
    assert info.value.errno == errno.ENOSPC
    assert old.read_bytes() == b"old"
    assert listing(old.parent) == ["model.ckpt"]


def test_permission_error_at_the_rename_is_the_library_error(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES at the rename: RootNotWritableError (a PermissionError), old file intact."""
    hits = inject(monkeypatch, "rename", errno.EACCES)
    with pytest.raises(RootNotWritableError) as info, atomic_write(old) as tmp:
        tmp.write_bytes(b"new")
    assert hits, "the injected fault did not fire"
    assert isinstance(info.value, PermissionError)
    assert isinstance(info.value.__cause__, OSError)
    assert old.read_bytes() == b"old"
    assert listing(old.parent) == ["model.ckpt"]


def test_directory_fsync_failure_after_the_rename_says_not_durable(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO at the directory fsync: NotDurableError; the new file is in place, not rolled back."""
    hits = inject(monkeypatch, "fsync_dir", errno.EIO)
    with pytest.raises(NotDurableError, match="may not survive"), atomic_write(old) as tmp:
        tmp.write_bytes(b"new")
    assert hits == [(old.parent,)]
    assert old.read_bytes() == b"new"
    assert listing(old.parent) == ["model.ckpt"]


def test_durable_false_makes_no_fsync(old: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """durable=False: still atomic, but no fsync is made."""
    calls = inject(monkeypatch, "fsync_file", errno.EIO) + inject(
        monkeypatch, "fsync_dir", errno.EIO
    )
    with atomic_write(old, durable=False) as tmp:
        tmp.write_bytes(b"new")
    write_bytes_atomic(old, b"newer", durable=False)
    assert calls == []
    assert old.read_bytes() == b"newer"


def test_parents_creates_missing_directories_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """parents=True makes the missing directories and fsyncs the parent of each."""
    synced: list[Path] = []
    real = _fs.fsync_dir
    monkeypatch.setattr(_fs, "fsync_dir", lambda p: (synced.append(Path(p)), real(p))[1])
    target = tmp_path / "a" / "b" / "f.bin"
    with atomic_write(target, parents=True) as tmp:
        tmp.write_bytes(b"x")
    assert target.read_bytes() == b"x"
    assert synced == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    with pytest.raises(FileNotFoundError), atomic_write(tmp_path / "c" / "f.bin") as tmp:
        tmp.write_bytes(b"x")


def test_a_symlinked_directory_is_fsynced_by_its_real_path(tmp_path: Path) -> None:
    """A target reached through a symlinked directory works (the fsync never follows links)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to("real")
    with atomic_write(tmp_path / "alias" / "f") as tmp:
        tmp.write_bytes(b"x")
    assert (tmp_path / "real" / "f").read_bytes() == b"x"


def test_a_symlink_at_the_target_is_replaced_not_written_through(tmp_path: Path) -> None:
    """A symlink at the target name is replaced by the new file; what it named is untouched."""
    (tmp_path / "other").write_bytes(b"other")
    (tmp_path / "last.ckpt").symlink_to("other")
    write_bytes_atomic(tmp_path / "last.ckpt", b"new")
    assert not (tmp_path / "last.ckpt").is_symlink()
    assert (tmp_path / "last.ckpt").read_bytes() == b"new"
    assert (tmp_path / "other").read_bytes() == b"other"


# ------------------------------------------------------------------ write_bytes_atomic


def test_write_bytes_atomic_replaces(old: Path) -> None:
    """write_bytes_atomic replaces the file and returns its path."""
    assert write_bytes_atomic(old, b"new") == old
    assert old.read_bytes() == b"new"
    assert listing(old.parent) == ["model.ckpt"]


def test_write_bytes_atomic_enospc_leaves_the_old_file(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while flushing the data: the old file is intact and the temporary is gone."""
    hits = inject(monkeypatch, "fsync_fd", errno.ENOSPC)
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)) as info:
        write_bytes_atomic(old, b"new")
    assert hits, "the injected fault did not fire"
    assert info.value.errno == errno.ENOSPC
    assert old.read_bytes() == b"old"
    assert listing(old.parent) == ["model.ckpt"]


# ------------------------------------------------------------------ replace_symlink


def test_replace_symlink_points_the_link_at_the_new_target(tmp_path: Path) -> None:
    """A link (or a regular file) at the name is replaced by a link to the new target."""
    (tmp_path / "a.ckpt").write_bytes(b"a")
    (tmp_path / "b.ckpt").write_bytes(b"b")
    replace_symlink("a.ckpt", tmp_path / "last.ckpt")
    assert os.readlink(tmp_path / "last.ckpt") == "a.ckpt"
    replace_symlink("b.ckpt", tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").read_bytes() == b"b"
    assert listing(tmp_path) == ["a.ckpt", "b.ckpt", "last.ckpt"]
    (tmp_path / "plain").write_bytes(b"p")
    replace_symlink("a.ckpt", tmp_path / "plain")
    assert os.readlink(tmp_path / "plain") == "a.ckpt"


def test_replace_symlink_failure_leaves_the_old_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO at the rename: the old link still names the old target, no temporary is left."""
    (tmp_path / "last.ckpt").symlink_to("a.ckpt")
    hits = inject(monkeypatch, "rename", errno.EIO)
    with pytest.raises(OSError, match=os.strerror(errno.EIO)) as info:
        replace_symlink("b.ckpt", tmp_path / "last.ckpt")
    assert hits, "the injected fault did not fire"
    assert info.value.errno == errno.EIO
    assert os.readlink(tmp_path / "last.ckpt") == "a.ckpt"
    assert listing(tmp_path) == ["last.ckpt"]


def test_replace_symlink_refuses_a_directory(tmp_path: Path) -> None:
    """A real directory at the link's name is left alone (IsADirectoryError)."""
    (tmp_path / "last.ckpt").mkdir()
    with pytest.raises(IsADirectoryError):
        replace_symlink("a.ckpt", tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").is_dir()
    assert listing(tmp_path) == ["last.ckpt"]


# ------------------------------------------------------------------ remove_file


def test_remove_file_unlinks_and_fsyncs_the_directory(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is gone and its directory fsynced; a second remove reports False."""
    synced: list[Path] = []
    real = _fs.fsync_dir
    monkeypatch.setattr(_fs, "fsync_dir", lambda p: (synced.append(Path(p)), real(p))[1])
    assert remove_file(old) is True
    assert synced == [old.parent]
    assert listing(old.parent) == []
    assert remove_file(old) is False
    with pytest.raises(FileNotFoundError):
        remove_file(old, missing_ok=False)


def test_remove_file_removes_a_symlink_not_its_target(tmp_path: Path) -> None:
    """A symlink is removed itself; the file it names stays."""
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "l").symlink_to("a")
    remove_file(tmp_path / "l")
    assert listing(tmp_path) == ["a"]


def test_remove_file_fsync_failure_says_not_durable(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO at the directory fsync after the unlink: NotDurableError."""
    hits = inject(monkeypatch, "fsync_dir", errno.EIO)
    with pytest.raises(NotDurableError, match="may be back"):
        remove_file(old)
    assert hits


# ------------------------------------------------------------------ clean_temporaries


def test_clean_temporaries_removes_only_orphaned_temporaries(old: Path) -> None:
    """Temporary files, links and trees that interrupted writes left go; all else stays."""
    directory = old.parent
    left = directory / _onefile.temp_name("model.ckpt")
    left.write_bytes(b"half")
    link = directory / _onefile.temp_name("last.ckpt")
    link.symlink_to("model.ckpt")
    keep = [".hidden", "x.tmp-" + "0" * 32, "." + "y.tmp-" + "0" * 31]
    for name in keep:
        (directory / name).write_bytes(b"mine")
    tree = directory / _onefile.temp_name("sharded.ckpt")
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "shard").write_bytes(b"half")
    removed = clean_temporaries(directory)
    assert sorted(removed) == sorted([left, link, tree])
    assert sorted(listing(directory)) == sorted(["model.ckpt", *keep])
    assert clean_temporaries(directory / "missing") == []


# ------------------------------------------------------------------ directories


def make_tree(path: Path, content: bytes) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "shard").write_bytes(content)
    return path


def test_commit_directory_puts_a_new_directory_in_place(tmp_path: Path) -> None:
    """A new directory is fsynced (every file and subdirectory) and renamed into place; the
    directory it lands in (made by pytest, never fsynced) gets its own entry made durable."""
    synced: list[str] = []
    staging = make_tree(tmp_path / _onefile.temp_name("a.ckpt"), b"new")
    real_file, real_dir = _fs.fsync_file, _fs.fsync_dir
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fs, "fsync_file", lambda p: (synced.append(Path(p).name), real_file(p))[1])
        mp.setattr(_fs, "fsync_dir", lambda p: (synced.append(Path(p).name), real_dir(p))[1])
        commit_directory(staging, tmp_path / "a.ckpt")
    assert sorted(synced[:2]) == ["shard", "sub"]  # before the rename, in any order
    assert synced[2:] == [staging.name, tmp_path.name, tmp_path.parent.name]
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"new"
    assert listing(tmp_path) == ["a.ckpt"]


@pytest.mark.parametrize("exchange", [True, False])
def test_commit_directory_replaces_an_existing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    """An existing directory is replaced (exchanged, or moved aside where the filesystem
    cannot exchange) and its old copy removed."""
    make_tree(tmp_path / "a.ckpt", b"old")
    hits = [] if exchange else inject(monkeypatch, "rename_exchange", errno.EINVAL)
    staging = make_tree(tmp_path / _onefile.temp_name("a.ckpt"), b"new")
    commit_directory(staging, tmp_path / "a.ckpt")
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"new"
    assert listing(tmp_path) == ["a.ckpt"]
    assert bool(hits) is not exchange


def test_commit_directory_failure_leaves_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while fsyncing the new tree: the old directory is untouched, staging is gone."""
    make_tree(tmp_path / "a.ckpt", b"old")
    staging = make_tree(tmp_path / _onefile.temp_name("a.ckpt"), b"new")
    hits = inject(monkeypatch, "fsync_file", errno.ENOSPC)
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)):
        commit_directory(staging, tmp_path / "a.ckpt")
    assert hits, "the injected fault did not fire"
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"old"
    assert listing(tmp_path) == ["a.ckpt"]
    other = make_tree(tmp_path / "elsewhere" / "x", b"x")
    with pytest.raises(ValueError, match="beside"):
        commit_directory(other, tmp_path / "x")


def killed(script: str, *args: Path) -> None:
    """Run ``script`` in a child process with ``args``; it must end at the point it
    arranged, where it dies abruptly with ``os._exit(9)`` (no cleanup, like a kill):
    exit status 9 is reached only through that injected point."""
    child = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 9, child.stderr


_CRASH_IN_THE_MOVE_ASIDE_WINDOW = """
import errno, os, sys
from pathlib import Path
from atomic_ckpt import commit_directory
from atomic_ckpt._core.l2_syscalls import fs as _fs
real_noreplace = _fs.rename_noreplace
calls = []
def no_exchange(a, b):
    raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")
def noreplace(src, dst):
    calls.append(src)
    if len(calls) == 2:  # the new one's rename, after the old one was moved aside
        os._exit(9)
    return real_noreplace(src, dst)
_fs.rename_exchange = no_exchange
_fs.rename_noreplace = noreplace
commit_directory(sys.argv[1], sys.argv[2])
"""


def test_a_crash_between_the_move_aside_and_the_rename_is_put_back_by_clean_temporaries(
    tmp_path: Path,
) -> None:
    """Without RENAME_EXCHANGE the old directory is moved aside first. A process killed in
    that window leaves no target, only the old copy aside: clean_temporaries puts it back
    (it must not remove the only copy) and removes the unfinished new one."""
    make_tree(tmp_path / "a.ckpt", b"old")
    staging = make_tree(tmp_path / _onefile.temp_name("a.ckpt"), b"new")
    killed(_CRASH_IN_THE_MOVE_ASIDE_WINDOW, staging, tmp_path / "a.ckpt")  # in the window
    left = listing(tmp_path)
    assert "a.ckpt" not in left
    (aside,) = [n for n in left if n.startswith(".a.ckpt.tmp-old-")]
    assert (tmp_path / aside / "sub" / "shard").read_bytes() == b"old"

    repaired = clean_temporaries(tmp_path)
    assert sorted(repaired) == sorted([tmp_path / aside, staging])
    assert listing(tmp_path) == ["a.ckpt"]
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"old"


def test_clean_temporaries_removes_an_old_copy_whose_replacement_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old copy left aside after the new directory took its name (a crash before it was
    removed) goes: first renamed to a plain temporary name (a kill while removing it never
    leaves a half-removed copy under a name that could be put back), then, after a fsync of
    the directory that makes the replacement durable, removed."""
    make_tree(tmp_path / "a.ckpt", b"new")
    aside = make_tree(tmp_path / (".a.ckpt.tmp-old-" + "ab" * 16), b"old")
    order: list[str] = []
    real_dir, real_remove = _fs.fsync_dir, _fs.remove_tree
    monkeypatch.setattr(_fs, "fsync_dir", lambda p: (order.append("fsync"), real_dir(p))[1])
    monkeypatch.setattr(
        _fs, "remove_tree", lambda p: (order.append(Path(p).name), real_remove(p))[1]
    )
    assert clean_temporaries(tmp_path) == [aside]
    assert order[0] == "fsync"
    assert order[1].startswith(f".{aside.name}.tmp-")  # removed under a temporary name
    assert order[2:] == ["fsync"]
    assert listing(tmp_path) == ["a.ckpt"]
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"new"


def test_several_old_copies_of_a_missing_name_are_all_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Which of two old copies is the latest cannot be told from their names: neither is
    put back, neither removed, and the warning says so."""
    first = make_tree(tmp_path / (".a.ckpt.tmp-old-" + "1" * 32), b"one")
    second = make_tree(tmp_path / (".a.ckpt.tmp-old-" + "2" * 32), b"two")
    with caplog.at_level("WARNING"):
        assert clean_temporaries(tmp_path) == []
    assert sorted(listing(tmp_path)) == sorted([first.name, second.name])
    assert "2 old copies" in caplog.text


def test_a_kill_while_the_replaced_copy_is_removed_never_leaves_it_to_be_put_back(
    tmp_path: Path,
) -> None:
    """Without RENAME_EXCHANGE the old copy is removed after the new one is in place. A
    kill in the middle of that removal leaves only a temporary: when the new directory is
    later deleted, clean_temporaries has no half-removed old copy to put back."""
    make_tree(tmp_path / "a.ckpt", b"old")
    for i in range(5):
        (tmp_path / "a.ckpt" / f"f{i}").write_bytes(b"old")
    staging = make_tree(tmp_path / _onefile.temp_name("a.ckpt"), b"new")
    killed(_KILL_WHILE_THE_OLD_COPY_IS_REMOVED, staging, tmp_path / "a.ckpt")  # mid-removal
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"new"
    assert not [n for n in listing(tmp_path) if _onefile._ASIDE_RE.fullmatch(n)]
    remove_directory(tmp_path / "a.ckpt")
    clean_temporaries(tmp_path)
    assert listing(tmp_path) == []


_KILL_WHILE_THE_OLD_COPY_IS_REMOVED = """
import errno, os, sys
from atomic_ckpt import commit_directory
from atomic_ckpt._core.l2_syscalls import fs as _fs
real_unlink = os.unlink
removed = []
def no_exchange(a, b):
    raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")
def unlink(path, *args, **kwargs):
    removed.append(path)
    if len(removed) == 4:  # the old copy is partly removed
        os._exit(9)
    return real_unlink(path, *args, **kwargs)
_fs.rename_exchange = no_exchange
os.unlink = unlink
commit_directory(sys.argv[1], sys.argv[2])
"""


def test_a_failed_move_back_says_where_the_old_copy_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new one's rename fails (EIO) and so does moving the old one back: the error says
    where the old copy is, and clean_temporaries puts it back."""
    make_tree(tmp_path / "a.ckpt", b"old")
    staging = make_tree(tmp_path / _onefile.temp_name("a.ckpt"), b"new")
    no_exchange = inject(monkeypatch, "rename_exchange", errno.EINVAL)
    failed_rename = inject(
        monkeypatch,
        "rename_noreplace",
        errno.EIO,
        when=lambda src, dst: "old" not in src.name and not (tmp_path / "a.ckpt").exists(),
    )
    stuck = inject(monkeypatch, "rename", errno.EIO, when=lambda src, dst: dst.name == "a.ckpt")
    with pytest.raises(OSError, match=os.strerror(errno.EIO)) as raised:
        commit_directory(staging, tmp_path / "a.ckpt")
    assert no_exchange, "the injected fault did not fire"
    assert failed_rename, "the injected fault did not fire"
    assert stuck, "the injected fault did not fire"
    assert any("clean_temporaries() puts it back" in n for n in raised.value.__notes__)
    monkeypatch.undo()
    clean_temporaries(tmp_path)
    assert listing(tmp_path) == ["a.ckpt"]
    assert (tmp_path / "a.ckpt" / "sub" / "shard").read_bytes() == b"old"


def test_a_name_too_long_to_move_aside_whole_is_refused_before_anything_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without RENAME_EXCHANGE the old copy must keep its whole name aside (to be put back):
    a name too long for that is refused with ENAMETOOLONG; the old one stays in place."""
    name = "n" * 230
    make_tree(tmp_path / name, b"old")
    staging = make_tree(tmp_path / _onefile.temp_name(name), b"new")
    hits = inject(monkeypatch, "rename_exchange", errno.EINVAL)
    with pytest.raises(OSError, match="at most 213 bytes") as raised:
        commit_directory(staging, tmp_path / name)
    assert hits
    assert raised.value.errno == errno.ENAMETOOLONG
    assert listing(tmp_path) == [name]
    assert (tmp_path / name / "sub" / "shard").read_bytes() == b"old"


def test_remove_directory_is_atomic_and_durable(tmp_path: Path) -> None:
    """A directory disappears under its name at once (renamed aside, then removed)."""
    make_tree(tmp_path / "a.ckpt", b"old")
    (tmp_path / "f").write_bytes(b"f")
    assert remove_directory(tmp_path / "a.ckpt") is True
    assert remove_directory(tmp_path / "a.ckpt") is False
    assert remove_directory(tmp_path / "f") is True  # a file: as remove_file
    assert listing(tmp_path) == []


# ------------------------------------------------------------------ power loss

Op = tuple[str, str]


def crash_outcomes(ops: list[Op], crash_point: int) -> set[str]:
    """What the target may hold after a power loss following ``ops[:crash_point]``.

    The crash model of PROTOCOL.md: data not fsynced may be lost or torn; a rename is
    durable only after its directory is fsynced, and before that may or may not survive.
    """
    done = ops[:crash_point]
    renamed = [i for i, op in enumerate(done) if op[0] == "rename"]
    if not renamed:
        return {"old"}
    r = renamed[0]
    data_synced = ("fsync_file", "tmp") in done[:r]
    dir_synced = ("fsync_dir", "dir") in done[r + 1 :]
    new = {"new"} if data_synced else {"new", "torn"}
    return new if dir_synced else {"old"} | new


def record(monkeypatch: pytest.MonkeyPatch, tmp_dir: Path, old: Path) -> list[Op]:
    """Run one atomic_write over ``old`` and log its _fs operations as (kind, which)."""
    ops: list[Op] = []

    def hook(name: str) -> None:
        real = getattr(_fs, name)

        def logged(*args: Any, **kwargs: Any) -> Any:
            path = Path(args[0])
            which = "dir" if path == tmp_dir else "parent" if path == tmp_dir.parent else "tmp"
            ops.append((name, which))
            return real(*args, **kwargs)

        monkeypatch.setattr(_fs, name, logged)

    for name in ("fsync_file", "fsync_dir", "rename"):
        hook(name)
    with atomic_write(old) as tmp:
        tmp.write_bytes(b"new")
    return ops


def test_power_loss_at_any_point_leaves_old_or_new_and_new_once_returned(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every crash point the target holds the old or the new bytes, and the new once it
    returned; the same checker rejects the order without either fsync (it can fail)."""
    ops = record(monkeypatch, old.parent, old)
    assert ops[:3] == [("fsync_file", "tmp"), ("rename", "tmp"), ("fsync_dir", "dir")]
    assert ops[3:] in ([], [("fsync_dir", "parent")])  # the first save into the directory
    for point in range(len(ops) + 1):
        assert crash_outcomes(ops, point) <= {"old", "new"}, point
    assert crash_outcomes(ops, len(ops)) == {"new"}
    no_data_fsync = [op for op in ops if op[0] != "fsync_file"]
    assert "torn" in crash_outcomes(no_data_fsync, len(no_data_fsync))
    no_dir_fsync = [op for op in ops if op[0] != "fsync_dir"]
    assert "old" in crash_outcomes(no_dir_fsync, len(no_dir_fsync))


def test_the_entry_of_a_directory_someone_else_made_is_made_durable_once(
    tmp_path: Path,
) -> None:
    """atomic_write into an existing directory fsyncs that directory's parent at the first
    save of this process (a framework's makedirs never did), not at every save."""
    directory = tmp_path / "made-by-a-framework"
    directory.mkdir()
    synced: list[Path] = []
    real_dir = _fs.fsync_dir
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fs, "fsync_dir", lambda p: (synced.append(Path(p)), real_dir(p))[1])
        for n in (1, 2):
            with atomic_write(directory / "last.ckpt") as tmp:
                tmp.write_bytes(b"%d" % n)
    assert synced == [directory, tmp_path, directory]


def test_clean_temporaries_never_removes_a_write_in_progress_in_another_process(
    tmp_path: Path,
) -> None:
    """A process inside ``atomic_write`` (its temporary half written) holds the directory:
    ``clean_temporaries`` from another process removes nothing then (not even an orphan),
    the write commits whole, and the next clean removes the orphan."""
    orphan = tmp_path / _onefile.temp_name("killed.bin")
    orphan.write_bytes(b"half")
    script = (
        "import sys, time\n"
        "from atomic_ckpt import atomic_write\n"
        "with atomic_write(sys.argv[1]) as tmp:\n"
        "    open(tmp, 'wb').write(b'first half')\n"
        "    print('writing', flush=True)\n"
        "    sys.stdin.readline()\n"
        "    open(tmp, 'ab').write(b', second half')\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "live.bin")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    assert child.stdout.readline() == "writing\n"
    live = [p for p in tmp_path.iterdir() if p.name.startswith(".live.bin.tmp-")]
    assert len(live) == 1, "the child's temporary is not there"
    assert clean_temporaries(tmp_path) == []
    assert live[0].exists()
    assert orphan.exists()
    child.communicate("go\n")
    assert child.returncode == 0
    assert (tmp_path / "live.bin").read_bytes() == b"first half, second half"
    assert clean_temporaries(tmp_path) == [orphan]


def test_a_directory_another_program_flocks_does_not_hang_the_writes_in_it(
    tmp_path: Path,
) -> None:
    """``flock ckpts/ python train.py`` (one training per directory, the shell idiom) holds
    an exclusive flock on the directory itself for the whole run: every write there still
    completes, whole, after a bounded wait for the lock (it hung forever on the first
    save), with one warning that names the directory and says writes go ahead without
    atomic_ckpt's lock."""
    import fcntl

    script = (
        "import sys\n"
        "from atomic_ckpt._core.l2_syscalls import locks\n"
        "locks._FOREIGN_WAIT = 0.2  # (the default waits longer than any clean holds it)\n"
        "from atomic_ckpt import atomic_write, write_bytes_atomic\n"
        "for n in range(3):\n"
        "    with atomic_write(sys.argv[1] + '/last.ckpt') as tmp:\n"
        "        tmp.write_bytes(b'save %d' % n)\n"
        "write_bytes_atomic(sys.argv[1] + '/notes.txt', b'done')\n"
    )
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what `flock -n dir cmd` takes
        try:
            done = subprocess.run(
                [sys.executable, "-c", script, str(tmp_path)],
                check=False,
                capture_output=True,
                text=True,
                timeout=120,  # a hang detector only: the writes take well under a second
            )
        except subprocess.TimeoutExpired:
            pytest.fail("a write into a directory another program flocks hung")
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "last.ckpt").read_bytes() == b"save 2"
    assert (tmp_path / "notes.txt").read_bytes() == b"done"
    assert done.stderr.count("locked exclusively (flock) by another program") == 1
    assert str(tmp_path) in done.stderr


def test_where_directories_cannot_be_flocked_every_write_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem whose ``flock`` fails on a directory for every operation (ENOSYS:
    Lustre mounted without ``flock``; ENOLCK): writes there go ahead without the directory
    lock, as documented, instead of raising from the unlock of a lock never taken (after
    the file was committed), and ``clean_temporaries`` cleans without it."""
    import fcntl
    import stat

    from atomic_ckpt._core.l2_syscalls import locks as _locks

    real = fcntl.flock
    refused: list[int] = []

    def flock(fd: int, operation: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            refused.append(operation)
            raise OSError(errno.ENOSYS, "Function not implemented")
        real(fd, operation)

    monkeypatch.setattr(_locks.fcntl, "flock", flock)
    orphan = tmp_path / _onefile.temp_name("killed.bin")
    orphan.write_bytes(b"half")
    with atomic_write(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"a")
    write_bytes_atomic(tmp_path / "b.bin", b"b")
    replace_symlink("a.bin", tmp_path / "last")
    staging = tmp_path / _onefile.temp_name("sharded")
    staging.mkdir()
    (staging / "shard").write_bytes(b"s")
    commit_directory(staging, tmp_path / "sharded")
    assert refused, "no flock of a directory was refused"
    assert (tmp_path / "a.bin").read_bytes() == b"a"
    assert (tmp_path / "b.bin").read_bytes() == b"b"
    assert os.readlink(tmp_path / "last") == "a.bin"
    assert (tmp_path / "sharded" / "shard").read_bytes() == b"s"
    assert clean_temporaries(tmp_path) == [orphan]
