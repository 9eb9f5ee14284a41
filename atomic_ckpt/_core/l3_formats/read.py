"""The read-only view of a checkpoint root: scan, classify, read a marker, verify.

Nothing here writes: the scanner does not rename, delete or repair anything
(that is ``clean()``'s job), and a missing root simply has no checkpoints. A
root is untrusted input: no directory's contents can make a reader raise
anything but a verdict on that directory.

Reading is proportional to what is asked for. A scan (``steps()``,
``checkpoints()``, ``ls``) reads each marker's first line and checks the
marker's size against it, never the per-file list; :func:`newest` (``latest()``)
looks at step directories from the highest down and stops at the first complete
one; a manifest's file list is parsed only when it is used (``verify``).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from atomic_ckpt._core.l1_names.errors import (
    ManifestError,
    MarkerIsDirectoryError,
    NewerFormatError,
)
from atomic_ckpt._core.l1_names.names import MARKER, TMP_INFIX, parse_step, parse_tmp
from atomic_ckpt._core.l3_formats.manifest import (
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_MARKER_BYTES,
    Manifest,
)
from atomic_ckpt._core.l3_formats.parse import header_length, parse_header

log = logging.getLogger(__name__)

Status = Literal["complete", "unmarked", "invalid", "staging"]

Progress = Callable[[int, int], None]
"""``progress(done, total)``: bytes of the checkpoint's files checked so far, of all."""

PROGRESS_INTERVAL = 0.1
"""Seconds between two calls of a verify progress callback."""

_PROBE = 4096
"""The first read of a marker: a version-2 header (without large metadata) fits in it."""

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
"""How a marker is opened: never through a symlink, never blocking on a FIFO."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step, its directory and its manifest."""

    step: int
    path: Path
    manifest: Manifest


@dataclass(frozen=True)
class Entry:
    """One entry of a root as ``atomic-ckpt ls`` shows it.

    ``status`` is ``complete`` (a valid marker), ``unmarked`` (no marker: legacy
    or broken), ``invalid`` (a marker that is not a manifest, see ``problem``) or
    ``staging`` (a save in progress or its leftovers; ``step`` may be None).
    ``newer_format``: invalid only because a newer atomic_ckpt wrote its marker.
    ``moved``: invalid only because its complete manifest records another step (or
    none: a named checkpoint), as a checkpoint moved or copied there by hand has.
    ``marker_dir``: invalid because a directory sits where its marker goes (kept: a
    commit over it is refused, and a resume stops at it, as at a moved one).
    """

    name: str
    path: Path
    step: int | None
    status: Status
    manifest: Manifest | None = None
    problem: str | None = None
    newer_format: bool = False
    moved: bool = False
    marker_dir: bool = False


# ---------------------------------------------------------------- one marker


def read_marker(directory: Path, *, body: bool = True) -> Manifest | None:
    """The manifest in ``directory``'s marker; None if there is no marker.

    Raises ManifestError if the marker is not a regular file (MarkerIsDirectoryError for
    a directory), is too large, or is not a valid manifest. A version-2 marker is judged
    by its header and size; its file list is parsed when ``files`` is first used. With
    ``body=True`` its bytes are read now (the manifest is a snapshot of the marker as it
    was); with ``body=False`` (a scan) only the header is read, and ``files`` reads the
    rest later, failing if the marker was replaced or removed meanwhile.
    """
    marker = directory / MARKER
    try:
        fd = os.open(marker, _FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # ELOOP: the marker is a symlink; EISDIR; ...
        raise ManifestError(
            f"marker {marker} cannot be read: {exc.strerror}", path=marker
        ) from None
    try:
        return _read_open(fd, marker, body=body)
    except MarkerIsDirectoryError:
        raise
    except ManifestError as exc:  # the same kind (NewerFormatError stays one), with the path
        raise type(exc)(f"marker {marker}: {exc}", path=marker) from None
    finally:
        os.close(fd)


def _read_open(fd: int, marker: Path, *, body: bool) -> Manifest:
    size = _regular_size(fd, marker)
    head = _pread(fd, min(size, _PROBE), 0)
    if head.startswith(MAGIC) and b"\n" not in head and len(head) < size:
        head += _pread(fd, min(size, MAX_HEADER_BYTES) - len(head), len(head))
    n = header_length(head)
    if n is None:  # version 1, legacy, hand-edited or invalid: parsed whole
        return Manifest.from_bytes(head if len(head) == size else _pread(fd, size, 0))
    line = head[:n]
    fields, header = parse_header(line, size)  # judged before any of the body is read
    if body or len(head) == size:
        # One read into one buffer (the few bytes of the first read again, from the
        # page cache): a megabyte copied twice over costs more than the read.
        rest = head[n:] if len(head) == size else _pread(fd, size - n, n)
        return Manifest._lazy(fields, header, rest)
    return Manifest._lazy(fields, header, _MarkerBody(marker, line))


def _regular_size(fd: int, marker: Path) -> int:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise marker_is_directory(marker)
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError("it is not a regular file")
    if st.st_size > MAX_MARKER_BYTES:
        raise ManifestError(
            f"it is {st.st_size} bytes, more than any manifest ({MAX_MARKER_BYTES})"
        )
    return st.st_size


def marker_is_directory(marker: Path) -> MarkerIsDirectoryError:
    """The error for a directory found where ``marker`` (a step directory's marker) goes."""
    step = marker.parent
    return MarkerIsDirectoryError(
        f"{marker} is a directory, not the {MARKER} file atomic_ckpt writes, so {step} is "
        "not a usable checkpoint (nothing was changed or deleted). Move that directory out "
        f"of {step} (what it holds is not part of the checkpoint); then, if the save was "
        f"complete, adopt it with `atomic-ckpt mark-complete {step}`, or move {step} away",
        path=marker,
    )


def _pread(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes at ``offset`` (fewer only at the end of the file)."""
    parts: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class _MarkerBody:
    """The body of a version-2 marker that a scan judged by its header alone."""

    marker: Path
    header: bytes
    """The header line as the scan read it."""

    def read(self) -> bytes:
        try:
            fd = os.open(self.marker, _FLAGS)
        except OSError as exc:
            raise ManifestError(
                f"marker {self.marker} cannot be read ({exc.strerror}): the checkpoint was "
                "removed or replaced since it was listed; look it up again",
                path=self.marker,
            ) from None
        try:
            size = _regular_size(fd, self.marker)
            if _pread(fd, len(self.header), 0) != self.header:
                raise ManifestError("it was replaced since it was listed; look it up again")
            return _pread(fd, size - len(self.header), len(self.header))
        except ManifestError as exc:
            raise type(exc)(f"marker {self.marker}: {exc}", path=self.marker) from None
        finally:
            os.close(fd)


def classify(path: Path, step: int, *, body: bool = True) -> Entry:
    """Classify one step directory: complete, unmarked or invalid (``body``: see
    :func:`read_marker`)."""
    try:
        manifest = read_marker(path, body=body)
    except ManifestError as exc:
        newer, folder = isinstance(exc, NewerFormatError), isinstance(exc, MarkerIsDirectoryError)
        return Entry(
            path.name,
            path,
            step,
            "invalid",
            problem=str(exc),
            newer_format=newer,
            marker_dir=folder,
        )
    except OSError as exc:
        return Entry(path.name, path, step, "invalid", problem=f"cannot read marker: {exc}")
    if manifest is None:
        return Entry(path.name, path, step, "unmarked")
    if not manifest.legacy and manifest.step != step:
        # Moved or copied here by hand: not what was committed as this step. A hand copy
        # cut short may hold the marker and only some files, so only a manifest recording
        # this very step makes it complete (an empty legacy marker records nothing).
        why = moved_by_hand(manifest, step)
        return Entry(path.name, path, step, "invalid", problem=why, moved=True)
    return Entry(path.name, path, step, "complete", manifest=manifest)


def moved_by_hand(manifest: Manifest, step: int | None) -> str:
    """Why a directory whose manifest records ``manifest.step`` is not complete as ``step``
    (None: as a named checkpoint), and what to do."""
    if manifest.step is None:
        return (
            "its manifest records no step: it is a named checkpoint moved or copied here "
            "by hand; move it back to its name (mv it to NAME, e.g. interrupted) and run "
            f"`atomic-ckpt promote ROOT NAME {step}` (promote_named()), which makes it "
            f"step {step} atomically"
        )
    if step is None:
        return (
            f"its manifest records step {manifest.step}: it is a step moved or copied here "
            f"by hand; move it back to step {manifest.step}, or commit it again under a name"
        )
    return (
        f"its manifest records step {manifest.step}: it was moved or copied here by hand; "
        f"move it back, or commit it again as step {step}"
    )


# ---------------------------------------------------------------- a root


_LISTINGS = 3
"""How many times a scan lists the root when entries vanish while it looks at them."""


def scan(root: Path, prefix: str, *, include_staging: bool = False) -> list[Entry]:
    """Every step directory of ``root`` (and staging dirs if asked), sorted by step.

    Names containing ``.tmp-`` are never steps; symlinks and plain files are
    never steps; names that are not canonical step names are ignored. Each
    marker's header is read, not its file list. A directory that disappears
    while it is being looked at (a concurrent prune) is left out, and the root
    is listed again (up to three times in all): the save that such a prune
    follows may have been promoted after the first listing.
    """
    for _ in range(_LISTINGS):
        entries, vanished = _scan_once(root, prefix, include_staging=include_staging)
        if not vanished:
            break
    return entries


def _scan_once(root: Path, prefix: str, *, include_staging: bool) -> tuple[list[Entry], bool]:
    try:
        it = os.scandir(root)
    except (FileNotFoundError, NotADirectoryError):
        return [], False
    out: list[Entry] = []
    vanished = False
    with it:
        for de in it:
            if TMP_INFIX in de.name:
                tmp = parse_tmp(de.name)
                if (
                    include_staging
                    and tmp is not None
                    and not tmp.is_lock
                    and de.is_dir(follow_symlinks=False)
                ):
                    step = parse_step(tmp.name, prefix)
                    out.append(Entry(de.name, Path(de.path), step, "staging"))
                continue
            step = parse_step(de.name, prefix)
            if step is None or not de.is_dir(follow_symlinks=False):
                continue
            entry = classify(Path(de.path), step, body=False)
            if entry.status == "unmarked" and not os.path.isdir(entry.path):
                vanished = True  # deleted since the listing
                continue
            out.append(entry)
    out.sort(key=lambda e: (e.step if e.step is not None else -1, e.status != "staging", e.name))
    return out, vanished


def other_prefixes(root: Path, prefix: str) -> list[tuple[Path, str, int]]:
    """The complete checkpoints of ``root`` named with a prefix other than ``prefix``
    (``checkpoint-3/`` seen by a plain root): (path, its prefix, its step), by path.

    A directory counts if its name is some prefix followed by a canonical step and its
    marker is legacy (empty) or records that step: a named checkpoint (no step), an
    alias (a symlink), an unmarked or unreadable directory never does. Read-only.
    """
    try:
        listing = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[Path, str, int]] = []
    for de in listing:
        digits = len(de.name) - len(de.name.rstrip("0123456789"))
        if not digits or TMP_INFIX in de.name:
            continue
        head, tail = de.name[:-digits], de.name[-digits:]
        keep = tail.lstrip("0") or "0"  # leading zeros belong to the prefix
        other = head + tail[: len(tail) - len(keep)]
        step = parse_step(de.name, other)
        if other == prefix or step is None or not de.is_dir(follow_symlinks=False):
            continue
        try:
            manifest = read_marker(Path(de.path), body=False)
        except (ManifestError, OSError):
            continue
        if manifest is not None and (manifest.legacy or manifest.step == step):
            found.append((Path(de.path), other, step))
    return sorted(found)


def steps_under_names(root: Path, prefix: str) -> list[tuple[Path, int]]:
    """The directories of ``root`` under a name (no step's, no temporary's) whose marker
    records a step: steps moved or copied there by hand (``mv 5 interrupted``), as
    (path, its step), by path. A name ending in the step it records is another prefix's
    step (see :func:`other_prefixes`), not one of these; links never are. Read-only."""
    try:
        listing = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[Path, int]] = []
    for de in listing:
        if TMP_INFIX in de.name or parse_step(de.name, prefix) is not None:
            continue
        try:
            manifest = (
                read_marker(Path(de.path), body=False) if de.is_dir(follow_symlinks=False) else None
            )
        except (ManifestError, OSError):
            continue
        step = None if manifest is None or manifest.legacy else manifest.step
        if step is not None and not de.name.endswith(str(step)):
            found.append((Path(de.path), step))
    return sorted(found)


def complete(root: Path, prefix: str, warned: set[Path]) -> list[Checkpoint]:
    """The complete checkpoints of ``root``, ascending; warn once per skipped directory."""
    result: list[Checkpoint] = []
    for e in scan(root, prefix):
        if e.status == "complete" and e.step is not None and e.manifest is not None:
            result.append(Checkpoint(e.step, e.path, e.manifest))
        else:
            _warn_skipped(e, warned)
    return result


def newest(
    root: Path, prefix: str, warned: set[Path], skipped: list[Entry] | None = None
) -> Iterator[Checkpoint]:
    """The complete checkpoints of ``root``, highest step first, each read when it is due;
    each step directory passed over as incomplete is added to ``skipped`` (if given).

    The root's names are listed and sorted; a candidate is looked at (lstat,
    marker) only when every higher step has been found incomplete (warned once
    each) or was passed over by the caller. Each
    manifest is a snapshot (its marker read whole). If a candidate vanishes
    meanwhile (a concurrent prune), the root is listed again once the listing
    is used up (up to three times in all), for steps it did not show before.
    """
    seen: set[int] = set()
    for _ in range(_LISTINGS):
        try:
            names = os.listdir(root)
        except (FileNotFoundError, NotADirectoryError):
            return
        # Highest step first without parsing every name: canonical step names (no
        # leading zeros, one prefix) order by length, then lexicographically. Two
        # sorts in C; names are parsed one by one only until a complete step is found.
        names.sort(reverse=True)
        names.sort(key=len, reverse=True)
        vanished = False
        for name in names:
            step = parse_step(name, prefix)
            if step is None or step in seen:
                continue
            path = root / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                vanished = True  # (not seen: a fallback replace may bring it back)
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue  # symlinks and files are never steps
            e = classify(path, step)
            if e.status == "unmarked" and not os.path.isdir(path):
                vanished = True
                continue
            seen.add(step)
            if e.status == "complete" and e.manifest is not None:
                yield Checkpoint(step, path, e.manifest)
            else:
                _warn_skipped(e, warned)
                if skipped is not None:
                    skipped.append(e)
        if not vanished:
            return


def _warn_skipped(e: Entry, warned: set[Path]) -> None:
    if e.path in warned:
        return
    warned.add(e.path)
    if e.status == "unmarked":
        log.warning(
            "skipping %s: it has no %s marker, so it may be incomplete; if it was "
            "written completely before atomic_ckpt, adopt it with "
            "`atomic-ckpt mark-complete %s`",
            e.path,
            MARKER,
            e.path,
        )
    else:
        log.warning("skipping %s: %s", e.path, e.problem)
