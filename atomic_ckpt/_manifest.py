"""The manifest: what the marker ``checkpoint_complete`` records about a checkpoint.

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

This module also holds the checksum registry: the algorithms a manifest may
name, as functions of an open file.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import FrozenInstanceError, dataclass
from typing import Any, Literal, Protocol

from ._errors import ManifestError

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


def to_json(value: object) -> str:
    """Standard JSON for ``value``; ValueError (never ``NaN``) if it has no such form."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"metadata must be JSON-serializable (finite numbers): {exc}") from None


def check_metadata(metadata: object) -> dict[str, Any]:
    """``metadata`` as a fresh dict, checked to be a JSON object with finite numbers that
    fits in a marker's header (:data:`MAX_METADATA_BYTES` as JSON)."""
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
        if self.checksum is None:
            return {"path": self.path, "size": self.size}
        return {"path": self.path, "size": self.size, "checksum": self.checksum}


# ---------------------------------------------------------------- the manifest


class BodySource(Protocol):
    """Where a lazily read manifest gets its body from (a marker file, re-read on demand)."""

    def read(self) -> bytes:
        """The body's bytes; ManifestError if the marker is gone or no longer the one read."""
        ...


@dataclass(frozen=True)
class _Header:
    """What a version-2 header promises about its body."""

    entries: int
    file_count: int
    total_size: int
    body_bytes: int
    body_crc32: str


class Manifest:
    """The parsed contents of a checkpoint's marker.

    Immutable. ``files`` of a manifest read from a version-2 marker is parsed on
    first access (and kept): it may raise :class:`ManifestError` if the marker's
    body is damaged, or, for a manifest from ``checkpoints()`` or ``entries()``,
    if the marker is gone or was replaced since (look the checkpoint up again
    with ``get()``). ``total_size`` and ``file_count`` come from the header.
    """

    __slots__ = (
        "_body",
        "_files",
        "_header",
        "checksum",
        "created",
        "legacy",
        "library_version",
        "metadata",
        "step",
    )

    step: int | None
    created: float | None
    library_version: str | None
    checksum: str | None
    """Checksum algorithm of the file entries, or None if none was recorded."""
    metadata: Mapping[str, Any]
    legacy: bool
    """True for an empty marker: complete, but nothing to verify against."""
    _files: tuple[FileEntry, ...] | None
    _header: _Header | None
    _body: bytes | BodySource | None

    def __init__(  # noqa: PLR0917 (the positional order of the dataclass it was)
        self,
        step: int | None,
        files: Iterable[FileEntry] = (),
        created: float | None = None,
        library_version: str | None = None,
        checksum: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        legacy: bool = False,
    ) -> None:
        _set = object.__setattr__
        _set(self, "step", step)
        _set(self, "created", created)
        _set(self, "library_version", library_version)
        _set(self, "checksum", checksum)
        _set(self, "metadata", {} if metadata is None else metadata)
        _set(self, "legacy", legacy)
        _set(self, "_files", tuple(files))
        _set(self, "_header", None)
        _set(self, "_body", None)

    @classmethod
    def _lazy(
        cls,
        fields: dict[str, Any],
        header: _Header,
        body: bytes | BodySource,
    ) -> Manifest:
        manifest = cls(**fields)
        object.__setattr__(manifest, "_files", None)
        object.__setattr__(manifest, "_header", header)
        object.__setattr__(manifest, "_body", body)
        return manifest

    # ------------------------------------------------------------ the file list

    @property
    def files(self) -> tuple[FileEntry, ...]:
        """Every entry (file, directory, symlink), sorted by path.

        Parsed on first access for a version-2 marker (ManifestError if its body
        is damaged, or its marker is gone or replaced since it was listed).
        """
        files = self._files
        if files is None:
            assert self._header is not None
            assert self._body is not None
            body = self._body if isinstance(self._body, bytes) else self._body.read()
            files = _parse.parse_body(body, self._header)
            object.__setattr__(self, "_files", files)
        return files

    @property
    def parsed(self) -> bool:
        """Whether ``files`` is known without reading or parsing anything more."""
        return self._files is not None

    @property
    def total_size(self) -> int:
        """Sum of the sizes of the regular files."""
        if self._files is None and self._header is not None:
            return self._header.total_size
        return sum(e.size for e in self.files if e.type == "file")

    @property
    def file_count(self) -> int:
        """The number of regular files (directories and symlinks left out)."""
        if self._files is None and self._header is not None:
            return self._header.file_count
        return sum(1 for e in self.files if e.type == "file")

    # ------------------------------------------------------------ value semantics

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.step,
            self.created,
            self.library_version,
            self.checksum,
            dict(self.metadata),
            self.legacy,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return self is other or (self._fields() == other._fields() and self.files == other.files)

    def __hash__(self) -> int:
        return hash((self.step, self.created, self.library_version, self.checksum, self.legacy))

    def __repr__(self) -> str:
        if self._files is not None:
            files = f"<{len(self._files)} entries>"
        else:
            assert self._header is not None
            files = f"<{self._header.entries} entries, not yet parsed>"
        return (
            f"Manifest(step={self.step!r}, files={files}, created={self.created!r}, "
            f"library_version={self.library_version!r}, checksum={self.checksum!r}, "
            f"metadata={dict(self.metadata)!r}, legacy={self.legacy!r})"
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        fields = dict(zip(_FIELD_NAMES, self._fields(), strict=True))
        return (_rebuild, (fields, self._files, self._header, self._body))

    # ------------------------------------------------------------ bytes

    def to_bytes(self) -> bytes:
        """The marker for this manifest, in the current format (version 2)."""
        files = self.files
        items = json.dumps([e._compact() for e in files], separators=(",", ":"))
        # One entry a line: a '{"' outside a string only starts an entry (inside a
        # JSON string every quote is escaped), so this split is exact.
        body = (
            '"files":[\n' + items[1:-1].replace('},{"', '},\n{"') + "\n]}\n"
            if files
            else '"files":[]}\n'
        ).encode()
        header = {
            "format": FORMAT,
            "version": VERSION,
            "step": self.step,
            "created": self.created,
            "library_version": self.library_version,
            "checksum": self.checksum,
            "metadata": dict(self.metadata),
            "entries": len(files),
            "file_count": sum(1 for e in files if e.type == "file"),
            "total_size": sum(e.size for e in files if e.type == "file"),
            "body_bytes": len(body),
            "body_crc32": f"{zlib.crc32(body):08x}",
        }
        # The header in json.dumps' default style: a script that edits a marker with
        # json.loads/json.dumps leaves one line, which is then parsed whole.
        line = json.dumps(header, allow_nan=False).encode()[:-1] + b",\n"
        if len(line) > MAX_HEADER_BYTES:
            raise ValueError(
                f"the manifest header would be {len(line)} bytes, more than a marker's "
                f"{MAX_HEADER_BYTES}: the metadata is too large"
            )
        return line + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse a marker's bytes; raise ManifestError if it is not a valid manifest.

        A version-2 marker's body is kept and parsed when ``files`` is first asked for.
        """
        if len(data) > MAX_MARKER_BYTES:
            raise ManifestError(f"marker is larger than {MAX_MARKER_BYTES} bytes")
        n = _parse.header_length(data)
        if n is not None:
            fields, header = _parse.parse_header(data[:n], len(data))
            return cls._lazy(fields, header, data[n:])
        if not data.strip():
            return cls(step=None, legacy=True)
        return _parse.parse_whole(data)


_FIELD_NAMES = ("step", "created", "library_version", "checksum", "metadata", "legacy")


def _rebuild(
    fields: dict[str, Any],
    files: tuple[FileEntry, ...] | None,
    header: _Header | None,
    body: bytes | BodySource | None,
) -> Manifest:
    if header is None or body is None:
        return Manifest(**fields, files=files or ())
    manifest = Manifest._lazy(fields, header, body)
    if files is not None:
        object.__setattr__(manifest, "_files", files)
    return manifest


from . import _parse  # noqa: E402  (it builds Manifests: imported once they exist)
