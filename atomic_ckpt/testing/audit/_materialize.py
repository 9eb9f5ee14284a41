"""Put crash states on disk: set the audited directory aside, show one state after another
at its path (changing only what differs from the last one), and put the original back."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from atomic_ckpt.testing._states import _Flat
from atomic_ckpt.testing.audit._errors import AuditError

_Key = tuple[int, int, int, int]


def _key(st: os.stat_result) -> _Key:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hard_linked(tree: Path) -> list[str]:
    """Files under ``tree`` with more than one name (issue 29.6, 29.12): a copy would
    split them, and a name outside the tree would change them unseen; the audit refuses."""
    found: list[str] = []
    for folder, _, files in os.walk(tree):
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                found.append(os.path.relpath(os.path.join(folder, name), tree))
    return sorted(found)


class Materializer:
    """Shows crash states at ``target``, one at a time, incrementally.

    Only the entries that differ from the previous state are written; an entry a check
    changed (its inode, size or times moved) is rewritten, so a check may modify the
    tree freely.
    """

    def __init__(self, target: Path) -> None:
        self.target = target
        self._shown: dict[str, tuple[str, bytes, _Key]] = {}
        self.written = 0
        """Bytes written so far (the cost of materialising)."""

    def show(self, flat: _Flat) -> None:
        """Make ``target`` hold exactly ``flat`` (paths relative to it, parents first)."""
        want = {path: (kind, payload) for path, kind, payload in flat}
        self.target.mkdir(parents=True, exist_ok=True)
        self._prune(self.target, "", want)
        for path, kind, payload in flat:
            full = self.target / path
            if path in self._shown:
                continue
            if kind == "dir":
                full.mkdir()
                self._shown[path] = (kind, b"", _key(os.lstat(full)))
            elif kind == "symlink":
                os.symlink(os.fsdecode(payload), full)
                self._shown[path] = (kind, payload, _key(os.lstat(full)))
            else:
                with open(full, "wb") as f:
                    f.write(payload)
                self.written += len(payload)
                self._shown[path] = (kind, payload, _key(os.lstat(full)))

    def _prune(self, directory: Path, rel: str, want: dict[str, tuple[str, bytes]]) -> None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            path = f"{rel}{name}"
            full = directory / name
            st = os.lstat(full)
            kind = (
                "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "dir"
                if stat.S_ISDIR(st.st_mode)
                else "file"
            )
            shown = self._shown.get(path)
            wanted = want.get(path)
            keep = (
                shown is not None
                and wanted is not None
                and shown[0] == kind == wanted[0]
                and (kind == "dir" or shown[2] == _key(st))
                and (shown[1] is wanted[1] or shown[1] == wanted[1])
            )
            if keep and kind == "dir":
                self._prune(full, path + "/", want)
                continue
            if keep:
                continue
            if kind == "dir":
                shutil.rmtree(full)
            else:
                os.unlink(full)
            # what this object showed at or below ``path`` is gone (a directory a check
            # turned into a file took its files with it: issue 29.13)
            for gone in [p for p in self._shown if p == path or p.startswith(path + "/")]:
                del self._shown[gone]
        # a name this object showed that is no longer on disk must be recreated
        for path in [p for p in self._shown if p.startswith(rel) and "/" not in p[len(rel) :]]:
            if not os.path.lexists(self.target / path):
                for gone in [p for p in self._shown if p == path or p.startswith(path + "/")]:
                    del self._shown[gone]


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) arrived during an audit: the original directory is put back."""


def aside_path(root: Path) -> Path:
    """Where the original ``root`` waits while crash states are shown at its path."""
    return root.parent / f".{root.name}.audit-original"


def remove(path: Path) -> None:
    """Remove whatever is at ``path`` (a tree, a file, a symlink), if anything."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


@contextlib.contextmanager
def set_aside(root: Path) -> Iterator[Path | None]:
    """Move ``root`` aside for the audit and put it back afterwards, also after Ctrl-C,
    SIGTERM or SIGHUP (the signals raise :class:`Interrupted` in the main thread).

    Yields where the original is (None if ``root`` did not exist). What the audit leaves
    at ``root`` is removed first.
    """
    aside = aside_path(root)
    if os.path.lexists(aside):
        raise AuditError(
            f"{aside} exists: an earlier audit of {root} was killed before it could put the "
            f"original back; check it, move it back to {root} (or remove it), then audit again"
        )
    moved = os.path.lexists(root)
    if moved:
        os.rename(root, aside)
    previous: dict[signal.Signals, Any] = {}

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, interrupted)
    try:
        yield aside if moved else None
    finally:
        try:
            remove(root)
        finally:
            if moved:
                os.rename(aside, root)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
