"""The marker's format: its constants, limits, the file entry and the header's promises.

The types here are what the parser (:mod:`.parse`) builds and :class:`.manifest.Manifest`
holds; neither of those is imported here.

Format version 2 (written since issue 15) is one JSON object laid out in two
parts, so that a reader can judge a marker from its first line alone. The
header (one line, wrapped here)::

    {"format": "atomic_ckpt", "version": 2, "step": 7, "created": 1764486000.0,
     "library_version": "0.1.0", "checksum": "xxh3_128", "metadata": {}, "entries": 3,
     "file_count": 1, "total_size": 123, "body_bytes": 194, "body_crc32": "c4bdfda5",

then the body, one entry a line (``type`` left out for a regular file)::

    "files":[
    {"path":"best","type":"symlink","target":"model.safetensors"},
    {"path":"model.safetensors","size":123,"checksum":"0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
    {"path":"shards","type":"dir"}
    ]}

* The **header** is the first line, at most :data:`MAX_HEADER_BYTES` (bounding
  the metadata): every field but the file list, the counts (``entries``,
  ``file_count``, ``total_size``), and the length and CRC-32 of the **body**,
  which is everything after the header's newline. The header line with its
  final ``,`` replaced by ``}`` is a JSON object of its own.
* A marker is a valid manifest when its header is, and the marker's size is the
  header's plus ``body_bytes``: that is what the scanner checks (``steps()``,
  ``latest()``, ``ls``), without reading the body. The body is read, checked
  against ``body_crc32`` and the counts, and parsed only when someone asks for
  ``Manifest.files`` (``verify``, ``amend``, user code); a body that fails
  these checks raises :class:`ManifestError` there, and ``verify`` reports it
  as a :class:`VerificationError`. (A CRC-32 catches damage, not forgery: whoever
  can write the marker can write its checksum.)
* The whole marker stays one JSON document, so ``jq`` and scripts read it as
  before. Rewritten by such a tool (so no longer in this layout: a first line
  that does not end with ``,``), a version-2 document is parsed whole, like
  version 1; its counts and body checksum describe a layout it no longer has
  and are not checked, but its header fields must be there.

Version 1 (read, no longer written) is the same object, indented, with
``"type": "file"`` on every file and without the counts and the body fields;
it is parsed whole. An empty marker (``touch checkpoint_complete``) is a
legacy marker: the checkpoint is complete but there is nothing to verify it
against.

A marker is untrusted input: one larger than :data:`MAX_MARKER_BYTES`, with a
header longer than :data:`MAX_HEADER_BYTES`, nested too deeply, or holding
sizes, paths or numbers no save could have written is not a manifest (its
directory is incomplete; in the body of a version-2 marker: its ``files``
raise ManifestError), never a crash of the reader.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FORMAT = "atomic_ckpt"
VERSION = 2
"""The format version written. Versions 1 and 2 are read."""

MAGIC = b'{"format": "atomic_ckpt", "version": 2, '
"""How every version-2 marker in the two-part layout begins."""

MAX_MARKER_BYTES = 256 << 20
"""The largest marker read (about two and a half million files at ~100 bytes per entry)."""
MAX_HEADER_BYTES = 1 << 20
"""The longest header line of a version-2 marker (the metadata is most of it)."""
MAX_METADATA_BYTES = MAX_HEADER_BYTES - 4096
"""The largest metadata a manifest may hold, as JSON (the rest of the header fits in 4 KiB)."""
MAX_FILE_SIZE = (1 << 63) - 1
"""The largest file size a manifest may record (off_t's range)."""
_MAX_TOTAL_SIZE = MAX_FILE_SIZE * MAX_MARKER_BYTES
"""More than the files of any marker could add up to (bounds an untrusted header's total)."""

_CRC32_RE = re.compile(r"[0-9a-f]{8}", re.ASCII)


# ---------------------------------------------------------------- metadata


FLOAT_KEY = "$atomic_ckpt.float"
"""The one key of the JSON object that stands for a non-finite float in metadata
(``{"$atomic_ckpt.float": "NaN"}``, ``"Infinity"``, ``"-Infinity"``): a diverged run's
NaN loss is recorded losslessly while the marker stays standard JSON, which has no NaN.
User metadata may not use the key itself."""

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_floats(value: object) -> object:
    """``value`` with every non-finite float replaced by its :data:`FLOAT_KEY` object;
    ValueError for a mapping that uses :data:`FLOAT_KEY` as a key of its own."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {
            FLOAT_KEY: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        }
    if isinstance(value, Mapping):
        if FLOAT_KEY in value:
            raise ValueError(
                f"metadata key {FLOAT_KEY!r} is reserved (it encodes NaN and infinities): rename it"
            )
        return {k: encode_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_floats(v) for v in value]
    return value


def decode_floats(value: Any) -> Any:
    """The inverse of :func:`encode_floats`, for metadata read from a marker."""
    if isinstance(value, dict):
        if len(value) == 1 and FLOAT_KEY in value:
            found = _NON_FINITE.get(value[FLOAT_KEY])
            if found is not None:
                return found
        return {k: decode_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_floats(v) for v in value]
    return value


def to_json(value: object) -> str:
    """Standard JSON for ``value`` (non-finite floats as :data:`FLOAT_KEY` objects, never
    ``NaN``); ValueError if it has no such form."""
    try:
        return json.dumps(encode_floats(value), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"metadata must be JSON-serializable: {exc}") from None


def check_metadata(metadata: object) -> dict[str, Any]:
    """``metadata`` as a fresh dict, checked to be a JSON object that fits in a marker's
    header (:data:`MAX_METADATA_BYTES` as JSON). NaN and infinities are accepted: they are
    recorded as :data:`FLOAT_KEY` objects and read back as floats."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(
            f"metadata must be a mapping (a dict of JSON values), got {type(metadata).__name__}"
        )
    out = dict(metadata)
    if not all(isinstance(k, str) for k in out):
        raise TypeError("metadata keys must be strings")
    size = len(to_json(out))
    if size > MAX_METADATA_BYTES:
        raise ValueError(
            f"metadata is {size} bytes as JSON, more than a manifest holds "
            f"({MAX_METADATA_BYTES}): keep metrics in it, and write anything larger as a "
            "file of the checkpoint"
        )
    return out


# ---------------------------------------------------------------- entries

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
    ino: int | None = field(default=None, compare=False, repr=False)
    """For a file: its inode number when it was hashed at the commit (None if unknown)."""
    mtime_ns: int | None = field(default=None, compare=False, repr=False)
    """For a file: its modification time (ns) when it was hashed at the commit. With
    :attr:`ino` and :attr:`size`, what tells a carry that the file is still the one whose
    checksum the manifest records (PROTOCOL.md, carried files); not part of equality."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "type": self.type}
        if self.type == "file":
            out["size"] = self.size
            if self.checksum is not None:
                out["checksum"] = self.checksum
        elif self.type == "symlink":
            out["target"] = self.target
        return out

    def _compact(self) -> dict[str, Any]:
        """The version-2 form: ``type`` left out for a regular file, the commonest entry."""
        if self.type != "file":
            return self.to_json()
        out: dict[str, Any] = {"path": self.path, "size": self.size}
        if self.checksum is not None:
            out["checksum"] = self.checksum
        if self.ino is not None and self.mtime_ns is not None:
            out["ino"], out["mtime_ns"] = self.ino, self.mtime_ns
        return out


# ---------------------------------------------------------------- the manifest


class BodySource(Protocol):
    """Where a lazily read manifest gets its body from (a marker file, re-read on demand)."""

    def read(self) -> bytes:
        """The body's bytes; ManifestError if the marker is gone or no longer the one read."""
        ...


@dataclass(frozen=True)
class Header:
    """What a version-2 header promises about its body."""

    entries: int
    file_count: int
    total_size: int
    body_bytes: int
    body_crc32: str
