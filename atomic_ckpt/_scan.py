"""Read-only view of a checkpoint root: which entries are steps, and which are complete.

The scanner never writes: it does not rename, delete or repair anything
(that is ``clean()``'s job), and a missing root simply has no checkpoints.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._errors import ManifestError
from ._manifest import Manifest
from ._names import MARKER, TMP_INFIX, parse_step, parse_tmp

log = logging.getLogger("atomic_ckpt")

Status = Literal["complete", "unmarked", "invalid", "staging"]


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step, its directory and its manifest."""

    step: int
    path: Path
    manifest: Manifest


@dataclass(frozen=True)
class Entry:
    """One entry of a root as ``atomic-ckpt ls`` shows it."""

    name: str
    path: Path
    step: int | None
    status: Status
    manifest: Manifest | None = None
    problem: str | None = None


def read_marker(directory: Path) -> Manifest | None:
    """The manifest in ``directory``'s marker; None if there is no marker.

    Raises ManifestError if the marker is not a regular file or not a valid manifest.
    """
    marker = directory / MARKER
    try:
        fd = os.open(
            marker,
            os.O_RDONLY
            | os.O_NONBLOCK
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0),
        )
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: the marker is a symlink; EISDIR; ...
        raise ManifestError(
            f"marker {marker} cannot be read: {exc.strerror}", path=marker
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ManifestError(f"marker {marker} is not a regular file", path=marker)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
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
    never steps; names that are not canonical step names are ignored.
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
                    step = parse_step(prefix, tmp.name)
                    out.append(Entry(de.name, Path(de.path), step, "staging"))
                continue
            step = parse_step(prefix, de.name)
            if step is None or not de.is_dir(follow_symlinks=False):
                continue
            out.append(classify(Path(de.path), step))
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
