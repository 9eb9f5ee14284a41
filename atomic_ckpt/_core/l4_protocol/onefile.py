"""One file, committed atomically and durably: for tools whose checkpoint is a single file.

The directory commit's rules, for one name in a directory::

    with atomic_write("ckpts/last.ckpt") as tmp:   # tmp: ckpts/.last.ckpt.tmp-<hex>
        torch.save(state, tmp)
    # here ckpts/last.ckpt holds the new bytes, durably; on an error it is untouched

1. the caller writes a temporary file beside the target (same directory, so the rename
   is atomic; a hidden name containing ``.tmp-``, so no scanner mistakes it for a
   checkpoint);
2. fsync the temporary file;
3. rename it over the target (the commit point: readers see the old or the new file);
4. fsync the directory (this makes the rename durable).

On an error before step 3 the temporary file is removed, the target is untouched and the
original error propagates; an error in step 4 raises :class:`~atomic_ckpt.NotDurableError`
(the new file is visible but may not survive a power loss; it is not rolled back).
:func:`replace_symlink` and :func:`remove_file` are the same for a symlink and a delete;
:func:`commit_directory` and :func:`remove_directory` for a directory a framework names
itself (a sharded ``epoch=3.ckpt/``); ``clean_temporaries`` (in :mod:`.leftovers`) removes
what a crash left, never a write in progress: each of these holds its directory's lock.
Every call that changes the tree goes through :mod:`._fs`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from atomic_ckpt._core.l1_names.errors import CommitStateError, NotDurableError, wrap_os_error
from atomic_ckpt._core.l1_names.names import NAME_MAX, TMP_INFIX, new_token
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks

__all__ = [
    "atomic_write",
    "commit_directory",
    "remove_directory",
    "remove_file",
    "replace_symlink",
    "temp_name",
    "write_bytes_atomic",
]

PathLike = str | os.PathLike[str]
log = logging.getLogger(__name__)

_TOKEN_LEN = 32
_TEMP_RE = re.compile(rf"\..*{re.escape(TMP_INFIX)}[0-9a-f]{{{_TOKEN_LEN}}}", re.ASCII | re.DOTALL)
_ASIDE = "old-"
_ASIDE_RE = re.compile(
    rf"\.(?P<name>.+){re.escape(TMP_INFIX)}{_ASIDE}[0-9a-f]{{{_TOKEN_LEN}}}", re.DOTALL
)
"""``.<name>.tmp-old-<32 hex>``: an old directory that :func:`commit_directory` moved
aside (where the filesystem cannot exchange), under its full name so that it can be
put back."""


def _split(path: PathLike) -> tuple[Path, str]:
    """(the real directory holding ``path``, its name).

    The directory is resolved because a directory fsync never follows a symlink; the
    name is not: a symlink at the target is replaced, never written through.
    """
    p = Path(os.fspath(path))
    name = p.name
    if name in ("", ".", ".."):
        raise ValueError(f"{os.fspath(path)!r} does not name a file")
    return Path(os.path.realpath(p.parent)), name


def temp_name(name: str) -> str:
    """The hidden temporary name for ``name``: ``.<name>.tmp-<uuid4 hex>`` (shortened to fit)."""
    room = NAME_MAX - 1 - len(TMP_INFIX) - _TOKEN_LEN
    stem = name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
    return f".{stem}{TMP_INFIX}{new_token()}"


def _ensure_parent(directory: Path, *, durable: bool) -> None:
    """Create ``directory`` if missing; each new directory's entry made durable in its parent."""
    created = _fs.makedirs(directory)
    if durable:
        for made in created:
            _fs.fsync_dir(made.parent)
        if created:
            _fs.fsync_entry_once(directory, done=True)


def _raise_wrapped(exc: OSError, directory: Path) -> None:
    wrapped = wrap_os_error(exc, directory)
    if wrapped is not exc:
        raise wrapped from exc


def _discard(tmp: Path, exc: BaseException) -> None:
    """Remove the temporary file; a failure is attached to ``exc``, never raised instead."""
    try:
        _fs.remove_tree(tmp)  # a file, or whatever the block made there; never followed
    except OSError as cleanup:
        exc.add_note(f"atomic_ckpt: removing {tmp} also failed: {cleanup!r}")


def _fsync_directory(directory: Path, target: Path, what: str) -> None:
    """Step 4: fsync ``directory`` after ``what`` was renamed into place as ``target``
    (and, once per process, its parent, for a directory someone else created)."""
    try:
        _fs.fsync_dir(directory)
        _fs.fsync_entry_once(directory)
    except OSError as exc:
        raise NotDurableError(
            f"{what} {target} is in place, but fsync of {directory} failed ({exc}): it may "
            "not survive a power loss. Check the disk, then write it again",
            path=target,
        ) from exc


def _fsync_after_removal(directory: Path, target: Path) -> None:
    """fsync ``directory`` once ``target`` left it: the removal, durably."""
    try:
        _fs.fsync_dir(directory)
    except OSError as exc:
        raise NotDurableError(
            f"{target} was removed, but fsync of {directory} failed ({exc}): after a "
            "power loss it may be back. Check the disk, then remove it again",
            path=target,
        ) from exc


@contextlib.contextmanager
def atomic_write(path: PathLike, *, durable: bool = True, parents: bool = False) -> Iterator[Path]:
    """Replace the file ``path`` atomically (and, by default, durably) with what the block writes.

    Yields a temporary path beside ``path``; write the new file there (``torch.save(obj,
    tmp)``, ``open(tmp, "wb")``, anything that makes one regular file). On a normal exit it
    is fsynced and renamed over ``path``, and the directory is fsynced; ``path`` is
    returned by nothing but holds the new bytes. On an exception the temporary file is
    removed, ``path`` is untouched and the exception propagates. ``durable=False`` skips
    the fsyncs (atomic against a crash of the process, not a power loss). ``parents=True``
    creates missing parent directories (durably). Only the process that entered the block
    ends it: a child forked inside gets :class:`~atomic_ckpt.CommitStateError` on a normal
    exit, and neither its exit nor its exception touches the temporary file or ``path``.
    """
    directory, name = _split(path)
    target = directory / name
    tmp = directory / temp_name(name)
    pid = os.getpid()
    try:
        if parents:
            _ensure_parent(directory, durable=durable)
    except OSError as exc:
        _raise_wrapped(exc, directory)
        raise
    # A live write, to clean_temporaries in any process: it leaves this directory alone.
    with _locks.writing_in(directory):
        try:
            yield tmp
        except BaseException as exc:
            # The block's own error (say, a PermissionError reading a dataset shard):
            # propagated unchanged, never attributed to ``directory``.
            if os.getpid() == pid:  # a forked child's: the temporary file is the parent's
                _discard(tmp, exc)
            raise
        if os.getpid() != pid:
            raise _forked(pid, target)
        try:
            try:
                st = os.lstat(tmp)
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"the block wrote nothing at {tmp}; {target} is untouched"
                ) from None
            if not stat.S_ISREG(st.st_mode):
                raise IsADirectoryError(
                    f"the block must write one regular file at {tmp}, not a "
                    f"{'directory' if stat.S_ISDIR(st.st_mode) else 'special file or link'}; "
                    f"{target} is untouched"
                )
            if durable:
                _fs.fsync_file(tmp)  # 2. the data, before the name can point at it
            if _same_file(st, target):
                # The block made tmp another link of the very file at ``target`` (a dedup
                # link to the previous save, saved here again): rename(2) of two links of
                # one inode does nothing and would leave tmp behind, keeping it alive.
                os.unlink(tmp)
            else:
                _fs.rename(tmp, target)  # 3. the commit point
        except BaseException as exc:
            _discard(tmp, exc)
            if isinstance(exc, OSError):
                _raise_wrapped(exc, directory)
            raise
        if durable:
            _fsync_directory(directory, target, "the new file")  # 4. the rename, durably


def _same_file(st: os.stat_result, target: Path) -> bool:
    """Whether ``target`` is the file ``st`` describes (its name already names it)."""
    try:
        return os.path.samestat(st, os.lstat(target))
    except OSError:
        return False


def _forked(pid: int, target: Path) -> CommitStateError:
    return CommitStateError(
        f"cannot end the atomic write of {target}: it belongs to process {pid}, and this is "
        f"process {os.getpid()} (forked inside the block). Only the process that began it "
        "may end it; end a forked child with os._exit()",
        path=target,
    )


def write_bytes_atomic(
    path: PathLike, data: bytes, *, durable: bool = True, parents: bool = False
) -> Path:
    """Replace the file ``path`` with ``data``, atomically and durably; return its path.

    The same as :func:`atomic_write` with a block that writes ``data``.
    """
    directory, name = _split(path)
    target = directory / name
    try:
        if parents:
            _ensure_parent(directory, durable=durable)
        # Temporary, fsync, rename: one call; it removes the temporary file on failure.
        with _locks.writing_in(directory):
            _fs.write_file_durable(target, data, tmp=directory / temp_name(name), sync=durable)
    except OSError as exc:
        _raise_wrapped(exc, directory)
        raise
    if durable:
        _fsync_directory(directory, target, "the new file")
    return target


def replace_symlink(target: PathLike, link: PathLike, *, durable: bool = True) -> Path:
    """Point the symlink ``link`` at ``target`` atomically: never absent, never half-made.

    A new link is made under a temporary name beside ``link`` and renamed over it (over a
    symlink or a regular file; a directory there raises ``IsADirectoryError``), then the
    directory is fsynced. ``target`` is stored as given (pass a relative path for a link
    that survives moving the directory). Returns the link's path.
    """
    directory, name = _split(link)
    path = directory / name
    try:
        with _locks.writing_in(directory):
            _fs.symlink_replace(os.fspath(target), path, directory / temp_name(name))
    except OSError as exc:
        _raise_wrapped(exc, directory)
        raise
    if durable:
        _fsync_directory(directory, path, "the symlink")
    return path


def remove_file(path: PathLike, *, durable: bool = True, missing_ok: bool = True) -> bool:
    """Delete the file or symlink ``path`` durably (unlink, then fsync the directory).

    True if it was removed, False if it was missing (``FileNotFoundError`` instead with
    ``missing_ok=False``). A directory raises (``IsADirectoryError`` or ``PermissionError``,
    as the platform says). A symlink is removed itself, never what it points at.
    """
    directory, name = _split(path)
    target = directory / name
    try:
        _fs.unlink(target)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    except OSError as exc:
        _raise_wrapped(exc, directory)
        raise
    if durable:
        _fsync_after_removal(directory, target)
    return True


def commit_directory(staging: PathLike, target: PathLike, *, durable: bool = True) -> Path:
    """Put the finished directory ``staging`` in place as ``target``, atomically and durably.

    For a checkpoint that is a directory under a name a framework chose (a sharded
    ``epoch=3.ckpt/``): write it under :func:`temp_name` beside the target, then call this.
    Every regular file and directory in ``staging`` is fsynced (links are not followed),
    then it is renamed to ``target`` (``RENAME_NOREPLACE``), or, where ``target`` exists,
    exchanged with it atomically (``RENAME_EXCHANGE``) and the old copy removed; the parent
    is fsynced. Where the filesystem cannot exchange, the old ``target`` is first renamed
    aside (``.<name>.tmp-old-<hex>``): a crash in that window leaves no ``target`` but the
    old copy aside, which :func:`clean_temporaries` puts back. On an error before the
    rename the staging directory is removed and ``target`` is untouched. Returns
    ``target``'s path.
    """
    source = Path(os.path.realpath(staging))
    directory, name = _split(target)
    final = directory / name
    if source.parent != directory:
        raise ValueError(f"{source} must sit beside {final} (a rename across directories)")
    with _locks.writing_in(directory):
        old: Path | None = None
        try:
            if durable:
                _fsync_tree(source)
            try:
                _fs.rename_noreplace(source, final)
            except FileExistsError:
                try:
                    _fs.rename_exchange(source, final)
                    old = source  # the old copy now sits under the staging name
                except OSError as exc:
                    if exc.errno not in _fs.EXCHANGE_UNSUPPORTED:
                        raise
                    for stale in _asides_of(directory, name):  # at most one aside per name
                        remove_directory(stale, durable=durable)
                    aside = directory / _aside_name(name)
                    _fs.replace_by_moving_aside(
                        source, final, aside, repair="clean_temporaries() puts it back"
                    )
                    old = aside
        except BaseException as exc:
            if old is None:  # not promoted: remove the staging directory, touch nothing else
                try:
                    _fs.remove_tree(source)
                except OSError as cleanup:
                    exc.add_note(f"atomic_ckpt: removing {source} also failed: {cleanup!r}")
            if isinstance(exc, OSError):
                _raise_wrapped(exc, directory)
            raise
        if durable:
            _fsync_directory(directory, final, "the new directory")
        if old is not None and old != source:  # moved aside: never half-removed under that name
            remove_directory(old, durable=durable)
        elif old is not None:  # exchanged: the old copy holds the staging (temporary) name
            _fs.remove_tree(old)
    return final


def _asides_of(directory: Path, name: str) -> list[Path]:
    """The old copies of ``name`` moved aside in ``directory``."""
    return [
        directory / entry
        for entry in sorted(os.listdir(directory))
        if (found := _ASIDE_RE.fullmatch(entry)) is not None and found["name"] == name
    ]


def _aside_name(name: str) -> str:
    """The name the old ``name`` is moved aside under; OSError(ENAMETOOLONG) if the whole
    name does not fit (it must, to be put back after a crash)."""
    aside = f".{name}{TMP_INFIX}{_ASIDE}{new_token()}"
    if len(aside.encode("utf-8", "surrogateescape")) > NAME_MAX:
        limit = NAME_MAX - (1 + len(TMP_INFIX) + len(_ASIDE) + _TOKEN_LEN)
        raise OSError(
            errno.ENAMETOOLONG,
            f"this filesystem cannot exchange directories, so replacing {name!r} moves the "
            f"old one aside under a longer name, which must keep the whole name to be put "
            f"back after a crash: use a name of at most {limit} bytes",
            name,
        )
    return aside


def _fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under ``root`` (never following a link)."""
    for current, dirs, files in os.walk(root):
        for name in files:
            path = Path(current) / name
            if stat.S_ISREG(os.lstat(path).st_mode):
                _fs.fsync_file(path)
        for name in dirs:
            if not os.path.islink(Path(current) / name):
                _fs.fsync_dir(Path(current) / name)
    _fs.fsync_dir(root)


def remove_directory(path: PathLike, *, durable: bool = True) -> bool:
    """Delete the directory ``path`` atomically: renamed under a temporary name first (so it
    is gone at once, never half-deleted under its name), the parent fsynced, then removed.
    False if it was missing. A symlink or a file is removed like :func:`remove_file`."""
    directory, name = _split(path)
    target = directory / name
    if not os.path.lexists(target):
        return False
    if not target.is_dir() or target.is_symlink():
        return remove_file(target, durable=durable)
    with _locks.writing_in(directory):
        aside = directory / temp_name(name)
        try:
            _fs.rename(target, aside)
        except FileNotFoundError:
            return False
        except OSError as exc:
            _raise_wrapped(exc, directory)
            raise
        if durable:
            _fsync_after_removal(directory, target)
        _fs.remove_tree(aside)
    return True
