"""What can be checked of a checkpoint's files without their writer: safetensors headers
against the file's length, a torch zip archive's central directory, JSON that parses.

Adopting a directory written without this library (``mark_complete``) runs these first, so
a legacy save torn by a kill (a truncated ``model.safetensors``, an ``optimizer.pt`` whose
archive never got its directory) is refused instead of marked complete. Formats not known
here are reported as unchecked. Read-only; every file is opened without following a link.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Literal, NamedTuple, cast

from atomic_ckpt._core.l1_names.names import is_marker_name, parse_tmp
from atomic_ckpt._core.l3_formats.tree import walk

_ZIP_MAGIC = b"PK\x03\x04"
_ZIP_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".zip")
_MAX_HEADER = 100 << 20
# The safetensors format's dtypes and their bits per element, for when the safetensors
# package is not installed to ask (:func:`_dtype_bits`); as of safetensors 0.8.
_FORMAT_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
    "I64": 64, "U64": 64,
}  # fmt: skip


def _tiny(dtype: str, count: int, nbytes: int) -> bytes:
    header = json.dumps({"t": {"dtype": dtype, "shape": [count], "data_offsets": [0, nbytes]}})
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(nbytes)


@functools.cache
def _dtype_bits() -> dict[str, int]:
    """Each safetensors dtype name and its bits per element, asked of the installed
    safetensors (its parser lists the names it accepts when given one it does not, and
    accepts 8 elements of a dtype in exactly ``bits`` bytes), so that a dtype a newer
    safetensors writes is checked rather than called damaged; the format's table as of
    0.8 where safetensors is not installed or does not answer."""
    try:
        import safetensors
    except ImportError:
        return dict(_FORMAT_BITS)
    parse = cast("Callable[[bytes], object]", safetensors.deserialize)
    try:
        parse(_tiny("?", 1, 1))
    except Exception as exc:  # (its error type is private to the package)
        listed = str(exc).partition("expected one of")[2]
        names = re.findall(r"`([A-Za-z0-9_]+)`", listed.partition(" at line")[0])
    else:
        names = []
    out = dict(_FORMAT_BITS)
    for name in names:
        for nbytes in range(1, 65):
            try:
                parse(_tiny(name, 8, nbytes))
            except Exception:  # (refused: not this width)
                continue
            out[name] = nbytes
            break
    return out


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
    """One file's verdict (see :class:`FileCheck`); an unreadable file is a problem, and
    so is the temporary of a one-file write killed before its rename (the save it is
    part of was cut short)."""
    if parse_tmp(path.name) is not None:
        return FileCheck(rel, None, "is the temporary of a write that never finished")
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
            bits = _dtype_bits().get(info["dtype"])  # None: a dtype not known here
            extent = bits
            for d in info["shape"]:
                extent = None if extent is None else extent * int(d)
        except (KeyError, TypeError, ValueError, AttributeError):
            return f"tensor {name!r} has a malformed header entry"
        if not 0 <= start <= stop or (extent is not None and (stop - start) * 8 != extent):
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
