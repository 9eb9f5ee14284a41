"""The manifest: what the marker ``checkpoint_complete`` records about a checkpoint.

The format itself (the layout of version 2, the limits, the file entry) is described in
:mod:`.marker`; this module holds :class:`Manifest`, which serializes and lazily parses it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import FrozenInstanceError
from typing import Any

from atomic_ckpt._core.l1_names.errors import ManifestError
from atomic_ckpt._core.l3_formats import parse as _parse
from atomic_ckpt._core.l3_formats.marker import (
    FORMAT,
    MAGIC,
    MAX_FILE_SIZE,
    MAX_HEADER_BYTES,
    MAX_MARKER_BYTES,
    MAX_METADATA_BYTES,
    VERSION,
    BodySource,
    FileEntry,
    check_metadata,
    encode_floats,
    to_json,
)
from atomic_ckpt._core.l3_formats.marker import Header as _Header

__all__ = [
    "FORMAT",
    "MAGIC",
    "MAX_FILE_SIZE",
    "MAX_HEADER_BYTES",
    "MAX_MARKER_BYTES",
    "MAX_METADATA_BYTES",
    "VERSION",
    "BodySource",
    "FileEntry",
    "Manifest",
    "check_metadata",
    "to_json",
]


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
        """The marker for this manifest, in the current format (version 2).

        Never a marker its own reader refuses: a path the reader would reject (not
        valid UTF-8, absolute, not normalized, climbing out) is a ManifestError
        naming it, whoever built the entries (a walk refuses such names earlier), and
        so is a marker larger than :data:`MAX_MARKER_BYTES`.
        """
        files = self.files
        _check_paths(files)
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
            "metadata": encode_floats(dict(self.metadata)),
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
        if len(line) + len(body) > MAX_MARKER_BYTES:
            raise ManifestError(
                f"the manifest of {len(files)} entries would be {len(line) + len(body)} "
                f"bytes, more than a marker may be ({MAX_MARKER_BYTES}, the most its reader "
                "reads): commit fewer files (pack small ones into archives or shards)"
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
        fields, files = _parse.parse_whole(data)
        return cls(files=files, **fields)


def _check_paths(files: tuple[FileEntry, ...]) -> None:
    """What the reader's :func:`~.parse.check_relative` checks, over all paths at once (a
    few C-level passes; one call per path only to name the culprit)."""
    joined = "\0".join(e.path for e in files)
    try:
        joined.encode("utf-8")
        # Every component between separators (NUL between paths, / inside one): none
        # empty, "." or ".."; and no NUL inside a path.
        parts = "\0" + joined.replace("/", "\0") + "\0"
        clean = joined.count("\0") == max(len(files) - 1, 0) and not (
            files and ("\0\0" in parts or "\0.\0" in parts or "\0..\0" in parts)
        )
    except UnicodeEncodeError:
        clean = False
    if clean:
        return
    for entry in files:
        try:
            _parse.check_relative(entry.path)
        except ManifestError as exc:
            raise ManifestError(
                f"cannot write a manifest recording {entry.path!r}: {exc}", path=entry.path
            ) from None
        if entry.path == "":  # pragma: no cover - check_relative refuses it
            raise ManifestError("cannot write a manifest recording an empty path")


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
