"""A ``.ckpt`` that carries its own checksum: ``torch.save`` hashed as it writes, the digest in
the zip comment, and the check of :mod:`atomic_ckpt.integrations.lightning`'s verified loads.

The format. ``torch.save`` writes a zip archive, which ends with the end-of-central-directory
record (EOCD): 22 bytes, the last two the length of an archive comment (0 from torch). The
save hashes every byte torch writes, as it writes it, then sets that length and appends the
comment ``atomic_ckpt {"algorithm": ..., "checksum": ...}``. The checksum is therefore the
checksum of the file exactly as ``torch.save`` wrote it: the file without its comment, with
the comment's length zeroed. The file stays a standard zip and a standard ``torch.save``
file (``torch.load`` and Lightning's own ``CheckpointIO`` load it unchanged; ``zipfile``
shows the comment). A file saved any other way carries no checksum, and a truncated one
has lost it: either way it does not verify.

The check (:func:`verified`) maps the file (``map_file``, the pages a loader then reads),
hashes it through that mapping, and holds the mapping while the caller loads the file by
its path: the loader's reads are served from the very pages just hashed, so each byte is
fetched from storage once, as long as the file fits in the page cache beside what the load
allocates (pages evicted between the hash and the load are read again; nothing pins them).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from collections.abc import Iterator
from typing import IO, Any, cast

import torch

from atomic_ckpt import VerificationError
from atomic_ckpt._core.l2_syscalls.checksums import map_file, new_hasher

_EOCD = b"PK\x05\x06"
"""The signature of a zip archive's end-of-central-directory record."""
_EOCD_SIZE = 22
_MAGIC = b"atomic_ckpt "
"""What the comment begins with (the JSON of the checksum follows)."""
_TAIL = 1024
"""Bytes at the end of a file that hold the EOCD and the comment (ours is ~80 bytes)."""
_CHUNK = 8 << 20
"""Bytes of the mapping handed to the hasher at a time."""


class _HashingWriter:
    """The file object ``torch.save`` writes into: each write is hashed, then written; the
    last :data:`_EOCD_SIZE` bytes are remembered (the record the comment length is in)."""

    def __init__(self, file: Any, algorithm: str) -> None:
        self._file = file
        self.hasher = new_hasher(algorithm)
        self.size = 0
        self.tail = b""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self._file.write(view)  # a buffered file: writes everything (or raises)
        self.size += len(view)
        self.tail = (self.tail + bytes(view[-_EOCD_SIZE:]))[-_EOCD_SIZE:]
        return len(view)

    def flush(self) -> None:
        self._file.flush()


def save(checkpoint: Any, path: str | os.PathLike[str], algorithm: str) -> str:
    """``torch.save(checkpoint, path)``, with the checksum of what it wrote as the comment;
    returns that checksum."""
    with open(path, "wb") as f:
        writer = _HashingWriter(f, algorithm)
        torch.save(
            checkpoint, cast("IO[bytes]", writer)
        )  # looked up now: a test's patched torch.save runs
        tail = writer.tail
        if len(tail) != _EOCD_SIZE or not tail.startswith(_EOCD) or tail[-2:] != b"\0\0":
            raise ValueError(
                f"torch.save did not end {path} with a zip directory without a comment: "
                "cannot record its checksum (pass checksum=None to save without one)"
            )
        comment = _MAGIC + json.dumps(
            {"algorithm": algorithm, "checksum": writer.hasher.hexdigest()},
            separators=(",", ":"),
        ).encode("ascii")
        f.seek(writer.size - 2)
        f.write(struct.pack("<H", len(comment)) + comment)
    return writer.hasher.hexdigest()


def _recorded(view: memoryview, path: str) -> tuple[str, str, int]:
    """(algorithm, checksum, where the comment begins) from the comment of the file in
    ``view``; VerificationError naming ``path`` if it has none or it is damaged."""
    size = len(view)
    tail = bytes(view[max(0, size - _TAIL) :])
    at = tail.rfind(_EOCD)  # our comment never holds these bytes: the last one is the EOCD
    if at < 0 or at + _EOCD_SIZE > len(tail):
        raise _failed(path, "it is not a complete torch.save file (no zip directory at its end)")
    (length,) = struct.unpack("<H", tail[at + 20 : at + _EOCD_SIZE])
    comment = tail[at + _EOCD_SIZE :]
    if length == 0 and not comment:
        raise _failed(
            path,
            "it carries no checksum (saved without atomic_ckpt's: by another CheckpointIO, "
            "or with checksum=None)",
        )
    if length != len(comment) or not comment.startswith(_MAGIC):
        raise _failed(path, "its checksum record is damaged")
    try:
        record = json.loads(comment[len(_MAGIC) :])
        algorithm, checksum = record["algorithm"], record["checksum"]
    except (ValueError, KeyError, TypeError):
        raise _failed(path, "its checksum record is damaged") from None
    if not isinstance(algorithm, str) or not isinstance(checksum, str):
        raise _failed(path, "its checksum record is damaged")
    return algorithm, checksum, size - len(comment)


@contextlib.contextmanager
def verified(path: str | os.PathLike[str], *, fd: int | None = None) -> Iterator[memoryview]:
    """Check ``path`` against the checksum it carries, then yield the mapping it was hashed
    through for the block: load from it, never by reopening the path (a verified load
    reads only the bytes it verified). VerificationError naming the file if it does not
    match, carries no checksum, or its record is damaged. ``fd``: the file checked is
    that open descriptor of ``path`` (left open: a loader can open the same file again
    as ``/proc/self/fd/<fd>``)."""
    text = os.fspath(path)
    # Mapped, not hashed yet: the comment is left out.
    view, _ = map_file(text, None) if fd is None else map_file(text, None, fd=fd)
    try:
        algorithm, expected, body = _recorded(view, text)
        try:
            hasher = new_hasher(algorithm)
        except ValueError:
            raise _failed(text, f"its checksum is {algorithm!r}, unknown here") from None
        end = body - 2  # the comment's length field: hashed as torch wrote it, zero
        for start in range(0, end, _CHUNK):
            hasher.update(view[start : min(end, start + _CHUNK)])
        hasher.update(memoryview(b"\0\0"))
        found = hasher.hexdigest()
        if found != expected:
            raise _failed(text, f"its {algorithm} checksum is {found}, but {expected} was recorded")
        yield view
    finally:
        _release(view)


def _release(view: memoryview) -> None:
    area = view.obj
    view.release()
    if isinstance(area, mmap.mmap):
        with contextlib.suppress(BufferError):  # a slice a traceback holds: freed with it
            area.close()


def _failed(path: str, why: str) -> VerificationError:
    return VerificationError(
        f"checkpoint {path} does not verify: {why}. It was not loaded; load another "
        "checkpoint, or, to load it unverified, verify_on_load=False",
        path=path,
        problems=(f"{path}: {why}",),
    )
