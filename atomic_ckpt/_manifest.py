"""The manifest: what the marker ``checkpoint_complete`` records about a checkpoint.

Format (version 1), a JSON object::

    {"format": "atomic_ckpt", "version": 1, "step": 7,
     "created": 1764486000.0, "library_version": "0.1.0",
     "checksum": "crc32" | null, "metadata": {...},
     "files": [{"path": "model.safetensors", "type": "file", "size": 123, "checksum": "..."},
               {"path": "shards", "type": "dir"},
               {"path": "best", "type": "symlink", "target": "model.safetensors"}]}

An empty marker (``touch checkpoint_complete``) is a legacy marker: the
checkpoint is complete but there is nothing to verify it against.

A marker is untrusted input: one larger than :data:`MAX_MARKER_BYTES`, nested
too deeply, or holding sizes, paths or numbers no save could have written is
not a manifest (its directory is incomplete), never a crash of the reader.

This module also holds the checksum registry: the algorithms a manifest may
name, as functions of an open file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._errors import ManifestError

FORMAT = "atomic_ckpt"
VERSION = 1

MAX_MARKER_BYTES = 256 << 20
"""The largest marker read (about two million files at ~120 bytes per entry)."""
MAX_FILE_SIZE = (1 << 63) - 1
"""The largest file size a manifest may record (off_t's range)."""

_CHUNK = 1 << 20
"""Read size for hashing: big enough to amortize the syscall, small enough to stay in cache."""


def _buffer(fd: int) -> tuple[bytearray, memoryview]:
    # Sized to the file (plus one byte, to see the end in one read), at most
    # _CHUNK: a fresh 1 MiB buffer per 64 KiB file would cost more than the hash.
    size = min(_CHUNK, os.fstat(fd).st_size + 1)
    buf = bytearray(size)
    return buf, memoryview(buf)


def _crc32(fd: int) -> str:
    crc = 0
    buf, view = _buffer(fd)
    while n := os.readv(fd, [buf]):
        crc = zlib.crc32(view[:n], crc)
    return f"{crc:08x}"


def _hashlib(name: str) -> Callable[[int], str]:
    def digest(fd: int) -> str:
        h = hashlib.new(name)
        buf, view = _buffer(fd)
        while n := os.readv(fd, [buf]):
            h.update(view[:n])
        return h.hexdigest()

    return digest


def _xxh3(fd: int) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    buf, view = _buffer(fd)
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
    return str(h.hexdigest())


CHECKSUMS: dict[str, Callable[[int], str]] = {
    "crc32": _crc32,
    "sha256": _hashlib("sha256"),
    "xxh3_128": _xxh3,
}
"""Supported checksum algorithms: name -> function of an open fd (read from offset 0)."""


def checksum_file(path: Path, algorithm: str) -> str:
    """The checksum of a regular file, never following a symlink."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        return CHECKSUMS[algorithm](fd)
    finally:
        os.close(fd)


def to_json(value: object) -> str:
    """Standard JSON for ``value``; ValueError (never ``NaN``) if it has no such form."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"metadata must be JSON-serializable (finite numbers): {exc}") from None


def check_metadata(metadata: object) -> dict[str, Any]:
    """``metadata`` as a fresh dict, checked to be a JSON object with finite numbers."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(
            f"metadata must be a mapping (a dict of JSON values), got {type(metadata).__name__}"
        )
    out = dict(metadata)
    if not all(isinstance(k, str) for k in out):
        raise TypeError("metadata keys must be strings")
    to_json(out)
    return out


EntryType = Literal["file", "dir", "symlink"]


@dataclass(frozen=True)
class FileEntry:
    """One entry of a checkpoint: a regular file, a directory or a symlink."""

    path: str
    """Relative, normalized POSIX path inside the checkpoint."""
    type: EntryType
    size: int = 0
    checksum: str | None = None
    target: str | None = None
    """For a symlink: where it points (never followed by the library)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "type": self.type}
        if self.type == "file":
            out["size"] = self.size
            if self.checksum is not None:
                out["checksum"] = self.checksum
        elif self.type == "symlink":
            out["target"] = self.target
        return out


@dataclass(frozen=True)
class Manifest:
    """The parsed contents of a checkpoint's marker."""

    step: int | None
    files: tuple[FileEntry, ...] = ()
    created: float | None = None
    library_version: str | None = None
    checksum: str | None = None
    """Checksum algorithm of the file entries, or None if none was recorded."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    legacy: bool = False
    """True for an empty marker: complete, but nothing to verify against."""

    @property
    def total_size(self) -> int:
        """Sum of the sizes of the regular files."""
        return sum(e.size for e in self.files if e.type == "file")

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "step": self.step,
            "created": self.created,
            "library_version": self.library_version,
            "checksum": self.checksum,
            "metadata": dict(self.metadata),
            "files": [e.to_json() for e in self.files],
        }
        return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse a marker's bytes; raise ManifestError if it is not a valid manifest."""
        if not data.strip():
            return cls(step=None, legacy=True)
        if len(data) > MAX_MARKER_BYTES:
            raise ManifestError(f"marker is larger than {MAX_MARKER_BYTES} bytes")
        try:
            doc = json.loads(data)
        except RecursionError:
            raise ManifestError("marker is JSON nested too deeply to be a manifest") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"marker is not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ManifestError("marker is JSON but not an object")
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ManifestError(
                f"unsupported manifest format {doc.get('format')!r} version {doc.get('version')!r}"
            )
        raw_files = doc.get("files")
        if not isinstance(raw_files, list):
            raise ManifestError("manifest has no file list")
        step = doc.get("step")
        if not (step is None or (isinstance(step, int) and not isinstance(step, bool))):
            raise ManifestError(f"manifest step {step!r} is not an integer")
        metadata = doc.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ManifestError("manifest metadata is not an object")
        created = doc.get("created")
        return cls(
            step=step,
            files=tuple(_parse_entry(e) for e in raw_files),
            created=float(created) if _is_time(created) else None,  # type: ignore[arg-type]
            library_version=_opt_str(doc.get("library_version")),
            checksum=_opt_str(doc.get("checksum")),
            metadata=metadata,
        )


def _is_time(value: object) -> bool:
    """A plausible POSIX timestamp (an untrusted manifest may hold anything)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value < 1e11
    )


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _parse_entry(raw: object) -> FileEntry:
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest entry {raw!r} is not an object")
    path, kind = raw.get("path"), raw.get("type", "file")
    if not isinstance(path, str) or kind not in ("file", "dir", "symlink"):
        raise ManifestError(f"manifest entry {raw!r} has no valid path or type")
    check_relative(path)
    size = raw.get("size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_SIZE:
        raise ManifestError(f"manifest entry {path!r} has an invalid size {size!r}")
    return FileEntry(
        path=path,
        type=kind,
        size=size,
        checksum=_opt_str(raw.get("checksum")),
        target=_opt_str(raw.get("target")),
    )


def check_relative(path: str) -> None:
    """Reject manifest paths that are absolute, not normalized, or climb out with ``..``."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError(f"path {path!r} in manifest is not valid UTF-8") from None
    if (
        not path
        or path.startswith("/")
        or "\0" in path
        or posixpath.normpath(path) != path
        or path == "."
        or path.split("/", maxsplit=1)[0] == ".."
    ):
        raise ManifestError(f"unsafe path {path!r} in manifest: must be relative and inside")
