"""Downloading a remote checkpoint into a local directory and checking every file against
its manifest: what ``fetch`` (into a new directory, renamed into place) and ``verify``
(into a temporary one) do."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from atomic_ckpt import (
    MARKER,
    Checkpoint,
    CheckpointDir,
    CheckpointNotFoundError,
    FileEntry,
    VerificationError,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS
from atomic_ckpt.remote import _protocol
from atomic_ckpt.remote._protocol import RemoteCheckpoint
from atomic_ckpt.remote._store import Store


def fetch(
    store: Store, ckpt: RemoteCheckpoint, name: str, dest: str | os.PathLike[str], *, durable: bool
) -> Checkpoint:
    """Download ``ckpt`` (the step folder ``name``) into the new local directory ``dest``,
    through a staging directory beside it that is renamed to ``dest`` once it all matches."""
    dest = Path(os.path.abspath(dest))
    if os.path.lexists(dest):
        raise FileExistsError(f"{dest} exists: fetch into a new directory")
    staging = dest.parent / f"{dest.name}.tmp-{uuid.uuid4().hex}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir()
    try:
        download(store, ckpt, name, staging, durable=durable)
        _fs.rename_noreplace(staging, dest)
        if durable:
            _fs.fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Checkpoint(ckpt.step, dest, ckpt.manifest)


def verify(store: Store, ckpt: RemoteCheckpoint, name: str, staging_dir: Path) -> None:
    """Download ``ckpt`` into a temporary directory in ``staging_dir`` (removed after) and
    check it: VerificationError listing every mismatch."""
    staging_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="atomic_ckpt-verify-", dir=staging_dir) as tmp:
        into = Path(tmp) / str(ckpt.step)
        into.mkdir()
        download(store, ckpt, name, into, durable=False)


def download(store: Store, ckpt: RemoteCheckpoint, name: str, into: Path, *, durable: bool) -> None:
    """Download ``ckpt``'s files into the empty directory ``into``, write its marker, and
    check every file against the manifest (type, size, checksum)."""
    m = ckpt.manifest
    if m.checksum is not None and m.checksum not in CHECKSUMS:  # before any byte moves
        why = (
            f"its manifest's checksums are {m.checksum!r}, which this Python cannot compute "
            f"(it has {', '.join(sorted(CHECKSUMS))}): install what provides it to fetch it"
        )
        raise VerificationError(
            f"{ckpt.url}: cannot check a download against it: {why}",
            step=ckpt.step,
            problems=(f"{ckpt.url}: {why}",),
        )
    # An upload leaves the marker out: an entry under its name (a foreign or hand-edited
    # manifest) would collide with the marker written below, or be overwritten by it.
    for e in m.files:
        if e.path.split("/", 1)[0] == MARKER:
            why = f"its manifest records {e.path!r}, under the name of the marker a fetch writes"
            raise VerificationError(
                f"{ckpt.url}: {why}. No upload of atomic_ckpt writes that: nothing was "
                "downloaded; commit the checkpoint again from a good copy",
                step=ckpt.step,
                problems=(f"{ckpt.url}: {why}",),
            )
    prefix = _protocol.data_prefix(name, ckpt.attempt)
    files = [e for e in m.files if e.type == "file"]
    for e in m.files:
        if e.type == "dir":
            (into / e.path).mkdir(parents=True, exist_ok=True)
    for e in files:
        (into / e.path).parent.mkdir(parents=True, exist_ok=True)
    try:
        store.download([(prefix + e.path, into / e.path) for e in files])
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"{ckpt.url}: an object of the checkpoint vanished while it was downloaded "
            f"(the step was replaced or deleted meanwhile: fetch again): {exc}",
            step=ckpt.step,
        ) from None
    for e in m.files:  # last: nothing is ever written through a link
        if e.type == "symlink" and e.target is not None:
            _fs.symlink(e.target, into / e.path)
    (into / MARKER).write_bytes(m.to_bytes())
    checker = CheckpointDir(into.parent, checksum=m.checksum, durable=durable)
    found = checker.sync_tree(into, hash=m.checksum is not None)
    problems = _compare(list(m.files), found)
    if problems:
        raise VerificationError(
            f"{ckpt.url}: the downloaded files do not match the manifest: {problems[0]}"
            + (f" (and {len(problems) - 1} more: see .problems)" if problems[1:] else ""),
            step=ckpt.step,
            problems=tuple(problems),
        )


def _compare(expected: list[FileEntry], found: list[FileEntry]) -> list[str]:
    want = {e.path: e for e in expected}
    have = {e.path: e for e in found}
    problems = []
    for path, e in sorted(want.items()):
        got = have.get(path)
        if got is None:
            problems.append(f"{path}: missing")
        elif got.type != e.type:
            problems.append(f"{path}: is a {got.type}, manifest says {e.type}")
        elif got.size != e.size:
            problems.append(f"{path}: size is {got.size}, manifest says {e.size}")
        elif e.checksum is not None and got.checksum != e.checksum:
            problems.append(f"{path}: checksum is {got.checksum}, manifest says {e.checksum}")
        elif got.target != e.target:
            problems.append(f"{path}: symlink points to {got.target!r}, not {e.target!r}")
    problems += [f"{p}: not in the manifest" for p in sorted(set(have) - set(want))]
    return problems
