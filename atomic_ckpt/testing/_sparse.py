"""File contents with holes: a sparse file's data in memory, its holes not (issue 29.20).

A file's contents in the crash model are :data:`Data`: ``bytes``, or a :class:`Sparse`
(its size and the extents that hold data; zeros elsewhere) once a run of zeros of at
least :data:`HOLE` bytes would otherwise have to be held. The recorder edits a
:data:`Buffer` (a ``bytearray``, or a :class:`SparseBuf`). Files are read with
``SEEK_DATA``/``SEEK_HOLE`` and written back with their holes (``truncate``), so a 64 GiB
sparse file costs the bytes it holds, not its apparent size.

Two equal contents may be held either way (a file of zeros written as zeros, or as a
hole): they compare equal, but :func:`digest` tells them apart, so such a state is at
worst checked twice, never merged with a different one.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import os
import shutil
from dataclasses import dataclass
from typing import BinaryIO, TypeAlias

HOLE = 1 << 20
"""A run of zeros this long (or longer) is held as a hole, not as bytes."""


@dataclass(frozen=True, eq=False)
class Sparse:
    """``size`` bytes, zero but for ``extents``: (offset, bytes), sorted, disjoint."""

    size: int
    extents: tuple[tuple[int, bytes], ...] = ()

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (bytes, bytearray, Sparse)):
            return NotImplemented
        if len(other) != self.size:
            return False
        if not isinstance(other, Sparse):  # held in memory whole: so can this be
            return read(self, 0, self.size) == other
        spans = [(o, len(d)) for o, d in self.extents + other.extents]
        return all(read(self, o, n) == read(other, o, n) for o, n in spans)

    def __hash__(self) -> int:
        return hash(self.size)


Data: TypeAlias = "bytes | Sparse"


class SparseBuf:
    """A mutable :class:`Sparse`: the recorder's contents of a file with holes."""

    def __init__(self, size: int = 0, extents: list[tuple[int, bytearray]] | None = None):
        self.size = size
        self.extents: list[tuple[int, bytearray]] = extents or []

    def __len__(self) -> int:
        return self.size

    def write(self, offset: int, payload: bytes) -> None:
        end = offset + len(payload)
        self.size = max(self.size, end)
        if not payload:
            return
        ext = self.extents
        if ext and ext[-1][0] <= offset <= ext[-1][0] + len(ext[-1][1]):  # at the end
            start, data = ext[-1]
            data[offset - start : end - start] = payload
            return
        starts = [o for o, _ in ext]
        lo = bisect.bisect_left(starts, offset)
        if lo and ext[lo - 1][0] + len(ext[lo - 1][1]) >= offset:
            lo -= 1  # the one before reaches up to (or into) the new bytes
        hi = bisect.bisect_right(starts, end)
        merged = bytearray(payload)
        start = offset
        if lo < hi:
            first_at, first = ext[lo]
            if first_at < offset:
                merged[0:0] = first[: offset - first_at]
                start = first_at
            last_at, last = ext[hi - 1]
            if last_at + len(last) > end:
                merged += last[end - last_at :]
        ext[lo:hi] = [(start, merged)]

    def zero(self, offset: int, length: int) -> None:
        """Zeros over ``[offset, offset + length)`` (a punched hole), extending the size."""
        kept: list[tuple[int, bytearray]] = []
        end = offset + length
        for at, data in self.extents:
            if at + len(data) <= offset or at >= end:
                kept.append((at, data))
                continue
            if at < offset:
                kept.append((at, data[: offset - at]))
            if at + len(data) > end:
                kept.append((end, data[end - at :]))
        self.extents = kept
        self.size = max(self.size, end)

    def truncate(self, length: int) -> None:
        if length < self.size:
            self.zero(length, self.size - length)
            self.extents = [(at, d) for at, d in self.extents if at < length and d]
        self.size = length

    def freeze(self) -> Sparse:
        return Sparse(self.size, tuple((at, bytes(d)) for at, d in self.extents if d))


Buffer: TypeAlias = "bytearray | SparseBuf"


def thaw(data: Data) -> Buffer:
    if isinstance(data, Sparse):
        return SparseBuf(data.size, [(at, bytearray(d)) for at, d in data.extents])
    return bytearray(data)


def freeze(buf: Buffer) -> Data:
    return buf.freeze() if isinstance(buf, SparseBuf) else bytes(buf)


def _sparse(buf: Buffer) -> SparseBuf:
    if isinstance(buf, SparseBuf):
        return buf
    return SparseBuf(len(buf), [(0, buf)] if buf else [])


def put(buf: Buffer, offset: int, payload: bytes) -> Buffer:
    """``payload`` written at ``offset`` (a gap before it zero); the buffer, maybe new."""
    if isinstance(buf, bytearray) and offset - len(buf) < HOLE:
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(payload)] = payload
        return buf
    out = _sparse(buf)
    out.write(offset, payload)
    return out


def zero(buf: Buffer, offset: int, length: int) -> Buffer:
    """Zeros over a range (fallocate's punch or zero range), extending the file."""
    if isinstance(buf, bytearray) and offset + length - len(buf) < HOLE and length < HOLE:
        return put(buf, offset, bytes(length))
    out = _sparse(buf)
    out.zero(offset, length)
    return out


def cut(buf: Buffer, length: int) -> Buffer:
    """The file truncated to (or extended with zeros to) ``length``."""
    if isinstance(buf, bytearray) and length - len(buf) < HOLE:
        del buf[length:]
        buf.extend(bytes(max(0, length - len(buf))))
        return buf
    out = _sparse(buf)
    out.truncate(length)
    return out


def read(data: Data | Buffer, offset: int, length: int) -> bytes:
    """The bytes at ``[offset, offset + length)`` (fewer past the end)."""
    if isinstance(data, (bytes, bytearray)):
        return bytes(data[offset : offset + length])
    length = max(0, min(length, data.size - offset))
    out = bytearray(length)
    for at, d in data.extents:
        lo, hi = max(at, offset), min(at + len(d), offset + length)
        if lo < hi:
            out[lo - offset : hi - offset] = d[lo - at : hi - at]
    return bytes(out)


def text(data: Data) -> str:
    """A symlink's target."""
    return os.fsdecode(read(data, 0, len(data)))


def zeros(length: int) -> Data:
    return Sparse(length) if length >= HOLE else bytes(length)


def prefix(data: Data, length: int) -> Data:
    if not isinstance(data, Sparse):
        return data[:length]
    return freeze(cut(thaw(data), length)) if length < data.size else data


def all_zero(data: Data) -> bool:
    """Whether every byte is zero (an empty file too)."""
    if isinstance(data, Sparse):
        return all(not d.strip(b"\0") for _, d in data.extents)
    return not data.strip(b"\0")


def stored(data: Data) -> int:
    """The bytes held in memory (and written to disk) for ``data``."""
    return sum(len(d) for _, d in data.extents) if isinstance(data, Sparse) else len(data)


def digest(data: Data) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    if isinstance(data, Sparse):
        h.update(f"sparse {data.size}".encode())
        for at, d in data.extents:
            h.update(f":{at}:{len(d)}:".encode())
            h.update(d)
    else:
        h.update(data)
    return h.digest()


def load(path: str | os.PathLike[str] | int) -> Data:
    """A file's contents (by path, or from a descriptor, which it closes); a large one
    read with SEEK_DATA/SEEK_HOLE, its holes (and runs of :data:`HOLE` zero bytes) left
    out of memory."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 16 * HOLE:
            return f.read()
        extents: list[tuple[int, list[bytes]]] = []
        fd, pos, reach = f.fileno(), 0, -1
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no data past pos
                    raise
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            for at in range(start, end, HOLE):
                chunk = os.pread(fd, min(HOLE, end - at), at)
                if not chunk.strip(b"\0"):
                    continue
                if at == reach:
                    extents[-1][1].append(chunk)
                else:
                    extents.append((at, [chunk]))
                reach = at + len(chunk)
            pos = end
        joined = tuple((at, b"".join(chunks)) for at, chunks in extents)
        if len(joined) == 1 and joined[0][0] == 0 and len(joined[0][1]) == size:
            return joined[0][1]  # no hole after all
        return Sparse(size, joined)


def copy(src: str, dst: str) -> None:
    """``shutil.copytree``'s copy function for the audit's copy of the user's directory:
    only the data regions (SEEK_DATA) are copied, holes stay holes (a plain copy would
    write out a 64 GiB sparse file's zeros); then the mode and times."""
    with open(src, "rb") as f, open(dst, "wb") as g:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(f.fileno(), pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                break
            end = os.lseek(f.fileno(), start, os.SEEK_HOLE)
            for at in range(start, end, HOLE):
                g.seek(at)
                g.write(os.pread(f.fileno(), min(HOLE, end - at), at))
            pos = end
        g.truncate(size)
    shutil.copystat(src, dst)


def write_to(f: BinaryIO, data: Data) -> None:
    """Write ``data`` to the empty file ``f``, holes as holes."""
    if not isinstance(data, Sparse):
        f.write(data)
        return
    for at, d in data.extents:
        f.seek(at)
        f.write(d)
    f.truncate(data.size)
