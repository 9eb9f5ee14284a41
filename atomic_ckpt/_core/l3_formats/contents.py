"""What can be checked of a checkpoint's files without their writer: safetensors headers
against the file's length, a torch zip archive's central directory, JSON that parses.

Adopting a directory written without this library (``mark_complete``) runs these first, so
a legacy save torn by a kill (a truncated ``model.safetensors``, an ``optimizer.pt`` whose
archive never got its directory) is refused instead of marked complete. Formats not known
here are reported as unchecked. Read-only; every file is opened without following a link.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO, Literal, NamedTuple

from atomic_ckpt._core.l1_names.names import is_marker_name
from atomic_ckpt._core.l3_formats.tree import walk

_ZIP_MAGIC = b"PK\x03\x04"
_ZIP_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".zip")
_MAX_HEADER = 100 << 20
_DTYPE_SIZES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


class FileCheck(NamedTuple):
    """The verdict on one file: its path (relative), the format it was checked as (or
    None if not known here), and what is wrong with it (None: nothing found)."""

    path: str
    format: Literal["safetensors", "torch zip", "json"] | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True unless a check found the file broken (an unchecked file is ok)."""
        return self.problem is None


def check_contents(directory: str | os.PathLike[str]) -> list[FileCheck]:
    """Check every regular file under ``directory`` (but a marker) whose format is known
    here; one :class:`FileCheck` per regular file, in the walk's order."""
    top = Path(directory)
    out = []
    for rel, de in walk(top, is_marker_name):
        if de.is_file(follow_symlinks=False):
            out.append(check_file(top / rel, rel))
    return out


def check_file(path: Path, rel: str) -> FileCheck:
    """One file's verdict (see :class:`FileCheck`); an unreadable file is a problem."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return FileCheck(rel, None, f"cannot be opened: {exc.strerror or exc}")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return FileCheck(rel, None)
        head = f.read(8)
        if rel.endswith(".safetensors"):
            return FileCheck(rel, "safetensors", _safetensors(f, head, st.st_size))
        if head.startswith(_ZIP_MAGIC) or (rel.endswith(_ZIP_SUFFIXES) and st.st_size == 0):
            return FileCheck(rel, "torch zip", _zip(f, st.st_size))
        if rel.endswith(".json"):
            return FileCheck(rel, "json", _json(f, head))
    return FileCheck(rel, None)


def _safetensors(f: BinaryIO, head: bytes, size: int) -> str | None:
    if len(head) < 8:
        return f"is {size} bytes: shorter than a safetensors header (truncated)"
    (n,) = struct.unpack("<Q", head)
    if n > min(size - 8, _MAX_HEADER):
        return f"header of {n} bytes does not fit in the file's {size} bytes (truncated)"
    data = f.read(n)
    try:
        header = json.loads(data)
    except (ValueError, RecursionError):
        return "header is not valid JSON (torn or truncated)"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(o) for o in info["data_offsets"])
            extent = _DTYPE_SIZES[info["dtype"]]
            for d in info["shape"]:
                extent *= int(d)
        except (KeyError, TypeError, ValueError):
            return f"tensor {name!r} has a malformed header entry"
        if not 0 <= start <= stop or stop - start != extent:
            return f"tensor {name!r} has offsets that disagree with its dtype and shape"
        end = max(end, stop)
    if 8 + n + end != size:
        return (
            f"is {size} bytes, but its header describes {8 + n + end} "
            f"({'truncated' if size < 8 + n + end else 'trailing bytes'})"
        )
    return None


def _zip(f: BinaryIO, size: int) -> str | None:
    try:
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        return f"is not a complete zip archive ({exc}): truncated or torn"
    for info in infos:
        if info.header_offset + info.compress_size > size:
            return f"member {info.filename!r} ends past the end of the file (truncated)"
    return None


def _json(f: BinaryIO, head: bytes) -> str | None:
    try:
        json.loads(head + f.read())
    except (ValueError, RecursionError) as exc:
        return f"is not valid JSON ({exc})"
    return None
