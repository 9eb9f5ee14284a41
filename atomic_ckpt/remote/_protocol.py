"""The object-store commit protocol, in the order
docs/guides/object-storage-protocol.md numbers it.

Layout under one root (keys relative to it)::

    7/checkpoint_complete              the manifest: the commit point of step 7
    7/<attempt>/model.safetensors      the data of the attempt the manifest names
    7/<attempt'>/...                   another attempt's data: a loser's, a crashed one's
    .atomic_ckpt-probe/<hex>           the conditional-write probe (deleted after use)

An attempt is 32 lowercase hex digits (a uuid4), fresh for each commit, so no
object is ever overwritten. The manifest is a marker in the local format
(:class:`atomic_ckpt.Manifest`, version 2) whose metadata names its attempt under
:data:`ATTEMPT_KEY`: a fetched checkpoint holds the same bytes as its marker and
verifies like a local one.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomic_ckpt import (
    MARKER,
    CheckpointError,
    FileEntry,
    Manifest,
    ManifestError,
    NewerFormatError,
    StepConflictError,
    __version__,
    parse_step,
)
from atomic_ckpt.remote._store import (
    ObjectInfo,
    PreconditionFailed,
    Store,
    UnsupportedStoreError,
    Upload,
)

log = logging.getLogger(__name__)

ATTEMPT_KEY = "atomic_ckpt.attempt"
"""The manifest metadata key naming the attempt whose objects the manifest lists."""
PROBE_DIR = ".atomic_ckpt-probe"
"""Where the conditional-write probe writes (never a step name)."""
ATTEMPT_RE = re.compile(r"[0-9a-f]{32}", re.ASCII)


def carried_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` for a new commit, without the attempt a fetched checkpoint's manifest
    names (the source store's bookkeeping; the commit names its own). A value under
    :data:`ATTEMPT_KEY` that no store wrote is refused: it would be silently replaced."""
    meta = dict(metadata)
    attempt = meta.pop(ATTEMPT_KEY, None)
    if attempt is not None and not (isinstance(attempt, str) and ATTEMPT_RE.fullmatch(attempt)):
        raise ValueError(
            f"metadata key {ATTEMPT_KEY!r} is reserved: a commit records its own attempt "
            f"there (a fetched checkpoint's 32-hex value is dropped), not {attempt!r}"
        )
    return meta


def manifest_key(name: str) -> str:
    """The key of the manifest of the step named ``name`` (``prefix + step``)."""
    return f"{name}/{MARKER}"


def data_prefix(name: str, attempt: str) -> str:
    """The folder of one attempt's objects."""
    return f"{name}/{attempt}/"


@dataclass(frozen=True)
class RemoteCheckpoint:
    """A committed checkpoint in an object store."""

    step: int
    url: str
    """Where its objects live: ``<root>/<step>`` (the manifest) and ``<root>/<step>/<attempt>/``."""
    manifest: Manifest
    attempt: str
    """The attempt whose objects the manifest lists."""
    etag: str
    """The manifest object's ETag (what a replace is conditional on)."""


class RemoteIncompleteError(CheckpointError, FileNotFoundError):
    """A manifest whose objects are not all there (a damaged or half-deleted checkpoint)."""


# ---------------------------------------------------------------- reading


def parse(name: str, step: int, data: bytes) -> tuple[Manifest, str]:
    """The manifest of step ``step`` and its attempt; ManifestError if it is not one."""
    manifest = Manifest.from_bytes(data)
    if manifest.legacy:
        raise ManifestError(f"{name}: the manifest is empty")
    if manifest.step != step:
        raise ManifestError(
            f"{name}: its manifest records step {manifest.step}: it was copied here by hand"
        )
    attempt = manifest.metadata.get(ATTEMPT_KEY)
    if not isinstance(attempt, str) or ATTEMPT_RE.fullmatch(attempt) is None:
        raise ManifestError(f"{name}: the manifest names no attempt ({ATTEMPT_KEY})")
    return manifest, attempt


def replaced_attempt(name: str, step: int, data: bytes, *, replace: bool) -> str | None:
    """The attempt a commit of ``step`` replaces, given the manifest ``data`` at ``name``.

    A manifest this release must not lose is refused (StepConflictError) unless
    ``replace``: one a newer atomic_ckpt wrote, or a complete checkpoint copied there by
    hand from another step, as a local commit refuses them. Any other unreadable
    manifest (empty, naming no attempt) holds nothing usable and is replaced, logged."""
    try:
        return parse(name, step, data)[1]
    except NewerFormatError as exc:
        what = f"a checkpoint a newer atomic_ckpt wrote: its manifest is {exc}"
    except ManifestError as exc:
        try:
            recorded = Manifest.from_bytes(data)
        except ManifestError:
            recorded = None
        if recorded is None or recorded.legacy or recorded.step == step:
            log.warning("committing over %s, whose manifest cannot be used: %s", name, exc)
            return None
        what = f"a complete checkpoint copied there by hand: {exc}"
    if not replace:
        raise StepConflictError(
            f"refusing to commit step {step} over {what}. Nothing was uploaded. Read it with "
            "the release that wrote it, move it, or pass replace_unusable=True to replace it."
        )
    log.warning("committing over %s (replace_unusable=True): it held %s", name, what)
    return None


def missing(manifest: Manifest, listing: Mapping[str, ObjectInfo], prefix: str) -> list[str]:
    """What of ``manifest``'s regular files ``listing`` lacks (or holds at another size)."""
    problems = []
    for entry in manifest.files:
        if entry.type != "file":
            continue
        found = listing.get(prefix + entry.path)
        if found is None:
            problems.append(f"{entry.path}: missing")
        elif found.size != entry.size:
            problems.append(f"{entry.path}: size is {found.size}, manifest says {entry.size}")
    return problems


_READS = 3
"""How many times a reader looks again when a step's manifest changed while it checked it."""


def read(store: Store, name: str, step: int) -> RemoteCheckpoint | None:
    """Step ``step``'s checkpoint if it is complete, else None (with the reason logged).

    Complete means: a manifest that parses, records this step, names an attempt,
    and every regular file it lists exists under that attempt with the listed size.
    If objects are missing because the step was replaced meanwhile (the old attempt's
    data is deleted after the swap), the new manifest is read and checked instead.
    """
    problems: list[str] = []
    seen: str | None = None
    for _ in range(_READS):
        got = store.get(manifest_key(name))
        if got is None or got[1] == seen:
            break
        data, etag = got
        seen = etag
        try:
            manifest, attempt = parse(store.url_of(name), step, data)
            listing = store.find(data_prefix(name, attempt))
            problems = missing(manifest, listing, data_prefix(name, attempt))
        except ManifestError as exc:
            log.warning("skipping %s: %s", store.url_of(name), exc)
            return None
        if not problems:
            return RemoteCheckpoint(step, store.url_of(name), manifest, attempt, etag)
    if problems:
        log.warning(
            "skipping %s: its manifest lists objects that are not there (%s%s)",
            store.url_of(name),
            problems[0],
            f", and {len(problems) - 1} more" if len(problems) > 1 else "",
        )
    return None


def step_names(store: Store, prefix: str) -> list[tuple[int, str]]:
    """(step, name) of every folder of the root named like a step, ascending."""
    found = []
    for name in store.children(""):
        step = parse_step(name, prefix)
        if step is not None:
            found.append((step, name))
    return sorted(found)


# ---------------------------------------------------------------- committing


def require_conditional_writes(store: Store, token: str, size: int = 0) -> None:
    """Refuse (UnsupportedStoreError) a store that does not honour conditional writes of
    ``size`` bytes: probed once per way the store's client sends them
    (:meth:`Store.conditional_path`)."""
    way = store.conditional_path(size)
    if way in store.probed:
        return
    why = store.probe(f"{PROBE_DIR}/{token}", size)
    if why is not None:
        raise UnsupportedStoreError(
            f"{store.url} does not honour conditional writes"
            f"{f' sent as {way}' if way else ''}: {why}. Without them two "
            "writers can both believe they committed a step, and a retried commit can "
            "replace a newer one, so atomic_ckpt refuses to commit here. Use a store "
            "that enforces them (AWS S3 since 2024 and recent S3-compatible servers: "
            "If-None-Match/If-Match on PutObject; Google Cloud Storage: ifGenerationMatch; "
            "Azure Blob Storage: If-None-Match/If-Match), or a local CheckpointDir",
            path=None,
        )
    store.probed.add(way)


def publish(
    store: Store,
    *,
    name: str,
    step: int,
    staging: Path,
    entries: Sequence[FileEntry],
    attempt: str,
    base_etag: str | None,
    checksum: str | None,
    metadata: Mapping[str, Any],
) -> RemoteCheckpoint:
    """Commit the files of ``staging`` (listed, hashed, in ``entries``) as step ``step``.

    ``base_etag`` is the manifest's ETag when the commit began (None: the step
    did not exist): the commit replaces exactly that, or fails with
    StepConflictError. On any failure before the commit point the attempt's
    objects are deleted (best effort; ``clean()`` removes what is left).
    """
    prefix = data_prefix(name, attempt)
    manifest = Manifest(
        step=step,
        files=entries,
        created=time.time(),
        library_version=__version__,
        checksum=checksum,
        metadata={**metadata, ATTEMPT_KEY: attempt},
    )
    data = manifest.to_bytes()
    files = [Upload(staging / e.path, prefix + e.path, e.size) for e in entries if e.type == "file"]
    # 0. The probe has checked the request this manifest's write goes through (a large
    # one may go another way than the first probe's).
    require_conditional_writes(store, attempt, len(data))
    try:
        # 1. Upload every file under the attempt's prefix, in parallel.
        uploaded = store.upload(files)
        # 2. Verify the attempt's listing against what was uploaded.
        verify_listing(store, prefix, files, uploaded)
    except BaseException:
        discard(store, prefix)
        raise
    try:
        # 3. The commit point: a conditional write of the manifest (4: a retry that
        # finds its own manifest there is success).
        etag = commit_point(store, name, data, base_etag)
    except StepConflictError:
        discard(store, prefix)  # the loser's attempt is garbage
        raise
    # Any other error: the manifest may have landed (a lost response), so the data
    # stays; if it is not referenced, clean() removes it after the grace period.
    return RemoteCheckpoint(step, store.url_of(name), Manifest.from_bytes(data), attempt, etag)


def verify_listing(
    store: Store, prefix: str, files: Sequence[Upload], uploaded: Mapping[str, str]
) -> None:
    """Step 2: every uploaded object is listed with its size and the ETag its upload
    returned, and nothing else is under the attempt."""
    listing = store.find(prefix)
    problems = []
    for f in files:
        found = listing.get(f.key)
        if found is None:
            problems.append(f"{f.key}: not listed after its upload")
        elif found.size != f.size:
            problems.append(f"{f.key}: listed with {found.size} bytes, uploaded {f.size}")
        elif found.etag.strip('"') != uploaded.get(f.key, "").strip('"'):
            problems.append(f"{f.key}: listed with ETag {found.etag}, upload returned another")
    extra = set(listing) - {f.key for f in files}
    problems += [f"{key}: not uploaded by this attempt" for key in sorted(extra)]
    if problems:
        raise CheckpointError(
            f"{store.url_of(prefix)}: the upload does not match its listing, so it is not "
            f"committed: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
        )


def commit_point(store: Store, name: str, data: bytes, base: str | None) -> str:
    """Steps 3 and 4: write the manifest create-only (``base`` None) or If-Match ``base``.

    A precondition failure is success if the manifest now there is this
    attempt's (a retry of a write that had landed), else StepConflictError. Any
    other failure is looked into the same way once (a timeout may hide a write
    that landed); if the manifest is not ours, the error propagates.
    """
    key = manifest_key(name)
    try:
        if base is None:
            return store.create(key, data)
        return store.replace(key, data, base)
    except PreconditionFailed:
        got = store.get(key)
        if got is not None and got[0] == data:
            log.info("%s: the manifest is already ours (a retried write had landed)", key)
            return got[1]
        theirs = "deleted" if got is None else "written by another commit"
        raise StepConflictError(
            f"{store.url_of(name)}: another writer committed this step first (the manifest "
            f"was {theirs} since this commit began); this attempt is discarded. Commit "
            "again to replace it, or use another step",
            path=None,
        ) from None
    except Exception as exc:
        try:
            got = store.get(key)
        except Exception:
            exc.add_note(
                f"atomic_ckpt: whether the manifest {store.url_of(key)} was written is "
                "unknown; its data is kept (clean() removes it if it is not referenced)"
            )
            raise exc from None
        if got is not None and got[0] == data:
            log.info("%s: the manifest landed despite the error %r", key, exc)
            return got[1]
        raise


def discard(store: Store, prefix: str) -> None:
    """Delete an uncommitted attempt's objects (best effort: clean() does it later)."""
    try:
        store.delete(list(store.find(prefix)))
    except Exception as exc:  # the original error matters more; clean() finishes this
        log.warning("could not delete the uncommitted attempt %s: %r", store.url_of(prefix), exc)
