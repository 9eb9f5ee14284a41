"""Parsing a marker defensively: the header alone (what a scan judges), the body (the
file list, parsed only when asked for), or a whole marker of any earlier version.
A marker is untrusted input: anything malformed is a ManifestError, never a crash."""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

from atomic_ckpt._core.l1_names.errors import ManifestError, NewerFormatError
from atomic_ckpt._core.l3_formats.marker import (
    _CRC32_RE,
    _MAX_TOTAL_SIZE,
    FORMAT,
    MAGIC,
    MAX_FILE_SIZE,
    MAX_HEADER_BYTES,
    MAX_MARKER_BYTES,
    VERSION,
    FileEntry,
    Header,
    decode_floats,
)
from atomic_ckpt._version import __version__

# ---------------------------------------------------------------- parsing


def header_length(head: bytes) -> int | None:
    """The length of the header line (newline included) if ``head``, a marker's first
    bytes, begins a version-2 marker in the two-part layout; else None (the marker
    is then parsed whole)."""
    if not head.startswith(MAGIC):
        return None
    end = head.find(b"\n", 0, MAX_HEADER_BYTES)
    if end < 0 or head[end - 1 : end] != b",":
        return None
    return end + 1


def parse_header(line: bytes, size: int) -> tuple[dict[str, Any], Header]:
    """The fields and promises of a version-2 header line (with its newline), for a
    marker of ``size`` bytes; ManifestError unless both are valid."""
    if not line.endswith(b",\n"):
        if len(line) > MAX_HEADER_BYTES:
            raise ManifestError(f"manifest header is longer than {MAX_HEADER_BYTES} bytes")
        raise ManifestError("manifest header line is not closed (the marker is truncated)")
    doc = _loads(line[:-2] + b"}", "header")
    fields, header = _check_header(doc)
    if header is None:
        raise ManifestError("manifest header has no body length or checksum")
    if size != len(line) + header.body_bytes:
        raise ManifestError(
            f"marker is {size} bytes, its header says {len(line) + header.body_bytes} "
            "(truncated or extended)"
        )
    return fields, header


def _loads(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ManifestError(f"manifest {what} is JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest {what} is not valid JSON ({exc})") from None


def _check_header(doc: object) -> tuple[dict[str, Any], Header | None]:
    """The common fields of a version 1 or 2 document, and a version 2's promises
    about its body (None for version 1)."""
    if not isinstance(doc, dict):
        raise ManifestError("marker is JSON but not an object")
    version = doc.get("version")
    if doc.get("format") != FORMAT or type(version) is not int or version < 1:
        raise ManifestError(
            f"unsupported manifest format {doc.get('format')!r} version {doc.get('version')!r}"
        )
    if version > VERSION:
        raise NewerFormatError(
            f"written by a newer atomic_ckpt (marker format version {version}; atomic_ckpt "
            f"{__version__} reads versions 1 to {VERSION}): upgrade atomic_ckpt to use it"
        )
    step = doc.get("step")
    if not (step is None or (isinstance(step, int) and not isinstance(step, bool))):
        raise ManifestError(f"manifest step {step!r} is not an integer")
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ManifestError("manifest metadata is not an object")
    fields: dict[str, Any] = {
        "step": step,
        "created": _time(doc.get("created")),
        "library_version": _opt_str(doc.get("library_version")),
        "checksum": _opt_str(doc.get("checksum")),
        "metadata": decode_floats(metadata),
    }
    if version == 1:
        return fields, None
    entries = _count(doc, "entries", MAX_MARKER_BYTES)
    crc = doc.get("body_crc32")
    if not isinstance(crc, str) or _CRC32_RE.fullmatch(crc) is None:
        raise ManifestError(f"manifest header body_crc32 {crc!r} is not 8 hex digits")
    header = Header(
        entries=entries,
        file_count=_count(doc, "file_count", entries),
        total_size=_count(doc, "total_size", _MAX_TOTAL_SIZE),
        body_bytes=_count(doc, "body_bytes", MAX_MARKER_BYTES),
        body_crc32=crc,
    )
    return fields, header


def _count(doc: dict[str, Any], key: str, most: int) -> int:
    value = doc.get(key)
    if type(value) is not int or not 0 <= value <= most:
        raise ManifestError(f"manifest header {key} {value!r} is not a count from 0 to {most}")
    return value


def parse_whole(data: bytes) -> tuple[dict[str, Any], tuple[FileEntry, ...]]:
    """A marker that is not in the two-part layout (version 1, or a re-serialized 2): its
    fields and its files, for :meth:`Manifest.from_bytes` to build a manifest of."""
    doc = _loads(data, "marker")
    fields, _ = _check_header(doc)
    raw_files = doc.get("files")
    if not isinstance(raw_files, list):
        raise ManifestError("manifest has no file list")
    return fields, _parse_entries(raw_files)


def parse_body(body: bytes, header: Header) -> tuple[FileEntry, ...]:
    """A version-2 body, checked against what its header promised."""
    if len(body) != header.body_bytes:
        raise ManifestError(
            f"manifest body is {len(body)} bytes, its header says {header.body_bytes}"
        )
    crc = f"{zlib.crc32(body):08x}"
    if crc != header.body_crc32:
        raise ManifestError(
            f"manifest body's CRC-32 is {crc}, its header says {header.body_crc32}: the "
            "marker is damaged, so the file list cannot be trusted"
        )
    doc = _loads(b"{" + body, "body")
    if not isinstance(doc, dict) or doc.keys() != {"files"} or not isinstance(doc["files"], list):
        raise ManifestError("manifest body is not a file list")
    files = _parse_entries(doc["files"])
    regular = [e.size for e in files if e.type == "file"]
    found = (len(files), len(regular), sum(regular))
    promised = (header.entries, header.file_count, header.total_size)
    if found != promised:
        raise ManifestError(
            f"manifest body lists (entries, files, bytes) {found}, its header says {promised}"
        )
    return files


def _parse_entries(raw_files: list[Any]) -> tuple[FileEntry, ...]:
    return tuple(_parse_entry(e) for e in raw_files)


def _time(value: object) -> float | None:
    """A plausible POSIX timestamp, or None (an untrusted manifest may hold anything)."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value < 1e11
    ):
        return float(value)
    return None


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _parse_entry(raw: object) -> FileEntry:
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest entry {str(raw)[:100]!r} is not an object")
    path, kind = raw.get("path"), raw.get("type", "file")
    if not isinstance(path, str) or kind not in ("file", "dir", "symlink"):
        raise ManifestError(f"manifest entry {str(raw)[:100]!r} has no valid path or type")
    check_relative(path)
    size = raw.get("size", 0)
    if type(size) is not int or not 0 <= size <= MAX_FILE_SIZE:
        raise ManifestError(f"manifest entry {path!r} has an invalid size {str(size)[:40]}")
    return FileEntry(
        path=path,
        type=kind,
        size=size,
        checksum=_opt_str(raw.get("checksum")),
        target=_opt_str(raw.get("target")),
        ino=_opt_count(raw.get("ino")),
        mtime_ns=_opt_count(raw.get("mtime_ns")),
    )


def _opt_count(value: object) -> int | None:
    """A non-negative int that fits 64 bits, or None (an identity field is only a hint:
    one that is not plausible is dropped, and a carry then hashes the file)."""
    return value if type(value) is int and 0 <= value < 1 << 64 else None


_NOT_NORMAL = frozenset({"", ".", ".."})


def check_relative(path: str) -> None:
    """Reject manifest paths that are absolute, not normalized, or climb out with ``..``."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError(f"path {path!r} in manifest is not valid UTF-8") from None
    # An empty component is a leading, trailing or doubled slash; "." and ".." are
    # not normalized (or climb out): exactly the paths posixpath.normpath changes,
    # plus "." and ".." themselves.
    if "\0" in path or not _NOT_NORMAL.isdisjoint(path.split("/")):
        raise ManifestError(f"unsafe path {path!r} in manifest: must be relative and inside")
