"""The checksum registry: the algorithms a manifest may name, as functions of an
open file, and the reading loop they share (one reused buffer per thread)."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
import zlib
from collections.abc import Callable
from typing import Protocol

_CHUNK = 1 << 20
"""Read size for hashing: big enough to amortize the syscall, small enough to stay in cache."""
_MAP_AT_LEAST = 1 << 20
"""A file hashed with ``mapped=True`` is mapped from this size on (below it, one read is
as cheap as setting up a mapping)."""
_MAP_CHUNK = 8 << 20
"""Bytes of a mapping handed to the hasher at a time."""
AHEAD = 32 << 20
"""``checksum_file``'s ``ahead`` is called once per this many bytes: a range big enough
for the disk to merge, small enough that hashing it takes about a millisecond while
the disk writes it."""


# ---------------------------------------------------------------- checksums


class _Hasher(Protocol):
    def update(self, data: memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


class _Crc32:
    """zlib.crc32 with hashlib's interface."""

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: memoryview, /) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def hexdigest(self) -> str:
        return f"{self._crc:08x}"


def _xxh3() -> _Hasher:
    import xxhash  # on first use only: importing atomic_ckpt stays cheap

    _HASHERS["xxh3_128"] = xxhash.xxh3_128  # later calls skip this function
    hasher: _Hasher = xxhash.xxh3_128()
    return hasher


_HASHERS: dict[str, Callable[[], _Hasher]] = {
    "crc32": _Crc32,
    "sha256": hashlib.sha256,
    "xxh3_128": _xxh3,
}


def new_hasher(algorithm: str) -> _Hasher:
    """An incremental hasher of ``algorithm`` (``update(buffer)``, ``hexdigest()``): for
    bytes hashed as they are written or read elsewhere, giving the digest
    :func:`checksum_file` gives for the same bytes. ValueError for a name that is not
    built in (an algorithm registered in ``CHECKSUMS`` later is a function of an fd only).
    """
    try:
        make = _HASHERS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown checksum {algorithm!r}; choose one of {sorted(_HASHERS)}"
        ) from None
    return make()


def checksum_fd(
    fd: int,
    algorithm: str,
    on_read: Callable[[int], None] | None = None,
    ahead: Callable[[int, int], None] | None = None,
) -> str:
    """The checksum of the open regular file ``fd`` (read from its offset to the end).

    ``on_read(n)`` is called after each read of ``n`` bytes (verify's progress);
    ``ahead`` as in :func:`checksum_file`.
    """
    hasher = _HASHERS[algorithm]()
    buf, view = _buffer()
    size = announced = 0
    while n := os.readv(fd, [buf]):
        while ahead is not None and size + n > announced:  # before these bytes are hashed
            ahead(announced, AHEAD)
            announced += AHEAD
        hasher.update(view[:n])
        size += n
        if on_read is not None:
            on_read(n)
    _local.hashed = size
    return hasher.hexdigest()


def hashed_size() -> int | None:
    """The size of the file the last :func:`checksum_file` call of this thread hashed (the
    bytes it read up to the end), or None if that call did not get that far.

    Lets verify check a file's size without an lstat of its own: on a few cores,
    one syscall (and GIL handoff) less per file was ~10% of a cold read of 1,000
    small files on 32 threads.
    """
    size: int | None = getattr(_local, "hashed", None)
    return size


_local = threading.local()


def _buffer() -> tuple[bytearray, memoryview]:
    """This thread's read buffer, made once: allocating (and zeroing) one per file cost
    more than hashing a 64 KiB file (xxh3: ~1 us), and a fstat to size it, more again."""
    try:
        found: tuple[bytearray, memoryview] = _local.buffer
    except AttributeError:
        buf = bytearray(_CHUNK)
        found = _local.buffer = (buf, memoryview(buf))
    return found


def _checksum_of(algorithm: str) -> Callable[[int], str]:
    return lambda fd: checksum_fd(fd, algorithm)


CHECKSUMS: dict[str, Callable[[int], str]] = {name: _checksum_of(name) for name in _HASHERS}
"""Supported checksum algorithms: name -> function of an open fd (read from offset 0)."""


def checksum_file(
    path: str | os.PathLike[str],
    algorithm: str,
    *,
    on_read: Callable[[int], None] | None = None,
    mapped: bool = False,
    ahead: Callable[[int, int], None] | None = None,
) -> str:
    """The checksum of a regular file, never following a symlink.

    ``on_read(n)`` is called after each read of ``n`` bytes. ``ahead(offset, length)``
    is called before each :data:`AHEAD` bytes are hashed, from offset 0 (a commit
    starts their writeback there, so the disk writes while the CPU hashes); once, with
    ``(0, 0)`` (the whole file), for an algorithm registered in ``CHECKSUMS`` later.

    ``mapped=True`` hashes a large file through a read-only mapping instead of
    reading it: nothing is copied out of the page cache (64 MiB here: 2.2 ms against
    9.1 ms), which matters when the hash runs beside the file's fsync on few cores.
    Only for a file nobody truncates while it is hashed, such as a commit's own
    staging files: touching a mapped page past a truncated end kills the process
    (SIGBUS), where a read just ends early. A file that cannot be mapped is read.
    """
    _local.hashed = None
    fd = os.open(path, _OPEN_FLAGS)
    try:
        if algorithm not in _HASHERS:  # an algorithm registered in CHECKSUMS later
            if ahead is not None:
                ahead(0, 0)
            return CHECKSUMS[algorithm](fd)
        if mapped and on_read is None:
            digest = _checksum_mapped(fd, algorithm, ahead)
            if digest is not None:
                return digest
        return checksum_fd(fd, algorithm, on_read, ahead)
    finally:
        os.close(fd)


def map_file(
    path: str | os.PathLike[str],
    algorithm: str | None,
    *,
    on_read: Callable[[int], None] | None = None,
    fd: int | None = None,
) -> tuple[memoryview, str | None]:
    """A regular file (never through a symlink) mapped into memory, and its checksum
    computed through that mapping: the pages hashed are the pages a loader then reads
    from the returned view, so a verified load fetches each byte from storage once and
    copies nothing on the way (a file-backed mapping: no anonymous memory to fault in).

    The mapping is private and writable (``torch.frombuffer`` wants a writable buffer;
    nothing writes to it). Only for files nobody truncates while they are mapped (a
    committed checkpoint's): touching a page past a truncated end is SIGBUS. An empty
    file is an empty view. ``algorithm`` None: mapped, not hashed. Sets
    :func:`hashed_size` like checksum_file. ``fd``: the file is that open descriptor
    (left open), ``path`` only names it.
    """
    _local.hashed = None
    given = fd
    if fd is None:
        fd = os.open(path, _OPEN_FLAGS)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            view = memoryview(b"")
        else:
            area = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
            if hasattr(mmap, "MADV_SEQUENTIAL"):
                area.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(area)
        digest = None
        if algorithm is not None and algorithm not in _HASHERS:  # an fd function only
            digest = CHECKSUMS[algorithm](fd)
        elif algorithm is not None:
            hasher = _HASHERS[algorithm]()
            for start in range(0, size, _MAP_CHUNK):
                hasher.update(view[start : start + _MAP_CHUNK])
                if on_read is not None:
                    on_read(min(_MAP_CHUNK, size - start))
            digest = hasher.hexdigest()
        elif on_read is not None:
            on_read(size)
    finally:
        if given is None:
            os.close(fd)
    _local.hashed = size
    return view, digest


def _checksum_mapped(
    fd: int, algorithm: str, ahead: Callable[[int, int], None] | None = None
) -> str | None:
    """``fd``'s checksum through a read-only mapping, or None where it is not mapped
    (small, empty or not mappable: the caller reads it)."""
    size = os.fstat(fd).st_size
    if size < _MAP_AT_LEAST:
        return None
    try:
        area = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # a FIFO, a filesystem without mmap, a file just shrunk
        return None
    try:
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            area.madvise(mmap.MADV_SEQUENTIAL)
        hasher = _HASHERS[algorithm]()
        with memoryview(area) as view:
            announced = 0
            for start in range(0, size, _MAP_CHUNK):
                end = min(start + _MAP_CHUNK, size)
                while ahead is not None and end > announced:  # before these bytes are hashed
                    ahead(announced, AHEAD)
                    announced += AHEAD
                hasher.update(view[start:end])
    finally:
        with contextlib.suppress(BufferError):  # a slice a traceback holds: freed with it
            area.close()
    _local.hashed = size
    return hasher.hexdigest()


_OPEN_FLAGS = (
    os.O_RDONLY
    | os.O_NONBLOCK  # a FIFO put in a file's place reads as empty, never blocks
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
