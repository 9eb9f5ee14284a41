"""Check a checkpoint's files against its manifest, never following a symlink."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ._manifest import FileEntry
from ._tree import checksum_file

__all__ = ["check_entry"]


def check_entry(top: Path, entry: FileEntry, algorithm: str | None) -> str | None:
    """Why ``entry`` does not match what is on disk under ``top``, or None if it does."""
    current = top
    for part in entry.path.split("/")[:-1]:  # never follow a symlink on the way
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return "missing (its directory is gone)"
        if not stat.S_ISDIR(st.st_mode):
            return f"{part} on its path is not a directory"
    target = top / entry.path
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return "missing"
    if entry.type == "dir":
        return None if stat.S_ISDIR(st.st_mode) else "should be a directory"
    if entry.type == "symlink":
        if not stat.S_ISLNK(st.st_mode):
            return "should be a symlink"
        actual = os.readlink(target)
        return (
            None
            if actual == entry.target
            else f"symlink points to {actual!r}, not {entry.target!r}"
        )
    if not stat.S_ISREG(st.st_mode):
        return "should be a regular file"
    if st.st_size != entry.size:
        return f"size is {st.st_size}, manifest says {entry.size}"
    if algorithm is not None and entry.checksum is not None:
        actual = checksum_file(target, algorithm)
        if actual != entry.checksum:
            return f"{algorithm} checksum is {actual}, manifest says {entry.checksum}"
    return None
