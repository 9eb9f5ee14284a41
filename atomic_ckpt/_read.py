"""The read-only view of a checkpoint root: scan, classify, read a marker, verify.

Nothing here writes: the scanner does not rename, delete or repair anything
(that is ``clean()``'s job), and a missing root simply has no checkpoints. A
root is untrusted input: no directory's contents can make a reader raise
anything but a verdict on that directory.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._errors import ManifestError, VerificationError
from ._manifest import CHECKSUMS, MAX_MARKER_BYTES, FileEntry, Manifest, checksum_file
from ._names import MARKER, TMP_INFIX, is_marker_name, parse_step, parse_tmp
from ._tree import run, walk

log = logging.getLogger(__name__)

Status = Literal["complete", "unmarked", "invalid", "staging"]


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
    """

    name: str
    path: Path
    step: int | None
    status: Status
    manifest: Manifest | None = None
    problem: str | None = None


def read_marker(directory: Path) -> Manifest | None:
    """The manifest in ``directory``'s marker; None if there is no marker.

    Raises ManifestError if the marker is not a regular file, is too large, or is
    not a valid manifest.
    """
    marker = directory / MARKER
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(marker, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # ELOOP: the marker is a symlink; EISDIR; ...
        raise ManifestError(
            f"marker {marker} cannot be read: {exc.strerror}", path=marker
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"marker {marker} is not a regular file", path=marker)
        if st.st_size > MAX_MARKER_BYTES:
            raise ManifestError(
                f"marker {marker} is {st.st_size} bytes, more than any manifest "
                f"({MAX_MARKER_BYTES})",
                path=marker,
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_MARKER_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return Manifest.from_bytes(data)
    except ManifestError as exc:
        raise ManifestError(f"marker {marker}: {exc}", path=marker) from None


def classify(path: Path, step: int) -> Entry:
    """Classify one step directory: complete, unmarked or invalid."""
    try:
        manifest = read_marker(path)
    except ManifestError as exc:
        return Entry(path.name, path, step, "invalid", problem=str(exc))
    except OSError as exc:
        return Entry(path.name, path, step, "invalid", problem=f"cannot read marker: {exc}")
    if manifest is None:
        return Entry(path.name, path, step, "unmarked")
    return Entry(path.name, path, step, "complete", manifest=manifest)


def scan(root: Path, prefix: str, *, include_staging: bool = False) -> list[Entry]:
    """Every step directory of ``root`` (and staging dirs if asked), sorted by step.

    Names containing ``.tmp-`` are never steps; symlinks and plain files are
    never steps; names that are not canonical step names are ignored. A
    directory that disappears while it is being looked at (a concurrent prune)
    is left out.
    """
    try:
        it = os.scandir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out: list[Entry] = []
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
            entry = classify(Path(de.path), step)
            if entry.status == "unmarked" and not os.path.isdir(entry.path):
                continue  # deleted since the listing
            out.append(entry)
    out.sort(key=lambda e: (e.step if e.step is not None else -1, e.status != "staging", e.name))
    return out


def complete(root: Path, prefix: str, warned: set[Path]) -> list[Checkpoint]:
    """The complete checkpoints of ``root``, ascending; warn once per skipped directory."""
    result: list[Checkpoint] = []
    for e in scan(root, prefix):
        if e.status == "complete" and e.step is not None and e.manifest is not None:
            result.append(Checkpoint(e.step, e.path, e.manifest))
        elif e.path not in warned:
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
    return result


def verify(ckpt: Checkpoint, *, workers: int) -> None:
    """Check every entry of ``ckpt``'s manifest against the disk, and that nothing was added.

    Raises one :class:`VerificationError` listing every problem (missing, wrong
    type, size or checksum, unexpected entries). A legacy (empty) marker has
    nothing to check against.
    """
    m = ckpt.manifest
    if m.legacy:
        return
    found: list[tuple[Path, str]] = []  # (the path at fault, what is wrong)
    if m.step is not None and m.step != ckpt.step:
        found.append(
            (ckpt.path, f"manifest records step {m.step}, but the directory is step {ckpt.step}")
        )
    algorithm = m.checksum
    if algorithm is not None and algorithm not in CHECKSUMS:
        found.append((ckpt.path, f"cannot check checksums of algorithm {algorithm!r} here"))
        algorithm = None
    jobs = [functools.partial(check_entry, ckpt.path, e, algorithm) for e in m.files]
    for entry, problem in zip(m.files, run(jobs, workers), strict=True):
        if problem is not None:
            found.append((ckpt.path / entry.path, problem))
    listed = {e.path for e in m.files}
    try:
        extra = [rel for rel, _ in walk(ckpt.path, is_marker_name) if rel not in listed]
    except OSError as exc:
        extra = []
        found.append((ckpt.path, f"cannot list the checkpoint: {exc}"))
    found += [(ckpt.path / rel, "not in the manifest (added after the commit)") for rel in extra]
    if found:
        problems = tuple(f"{path}: {why}" for path, why in found)
        more = f" (and {len(found) - 1} more: see .problems)" if len(found) > 1 else ""
        raise VerificationError(
            problems[0] + more, path=found[0][0], step=ckpt.step, problems=problems
        )


def check_entry(top: Path, entry: FileEntry, algorithm: str | None) -> str | None:
    """Why ``entry`` does not match what is on disk under ``top``, or None if it does."""
    current = top
    for part in entry.path.split("/")[:-1]:  # never follow a symlink on the way
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return "missing (its directory is gone)"
        if not stat.S_ISDIR(st.st_mode):
            return f"{part} on its path is not a directory"
    target = top / entry.path
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if entry.type == "dir":
        return None if stat.S_ISDIR(st.st_mode) else "should be a directory"
    if entry.type == "symlink":
        if not stat.S_ISLNK(st.st_mode):
            return "should be a symlink"
        actual = os.readlink(target)
        return (
            None
            if actual == entry.target
            else f"symlink points to {actual!r}, not {entry.target!r}"
        )
    if not stat.S_ISREG(st.st_mode):
        return "should be a regular file"
    if st.st_size != entry.size:
        return f"size is {st.st_size}, manifest says {entry.size}"
    if algorithm is not None and entry.checksum is not None:
        try:
            actual = checksum_file(target, algorithm)
        except OSError as exc:
            return f"cannot be read: {exc.strerror}"
        if actual != entry.checksum:
            return f"{algorithm} checksum is {actual}, manifest says {entry.checksum}"
    return None
