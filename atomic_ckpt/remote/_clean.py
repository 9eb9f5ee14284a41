"""Removing things from a remote root: one checkpoint (its manifest first, so the step
disappears at once, then its data), and what crashed, killed or losing commits left,
once it is older than the grace period (``clean()``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from atomic_ckpt import CheckpointNotFoundError, ManifestError, parse_step
from atomic_ckpt.remote import _protocol
from atomic_ckpt.remote._protocol import ATTEMPT_RE, PROBE_DIR
from atomic_ckpt.remote._store import Store

log = logging.getLogger(__name__)


def delete(store: Store, name: str, step: int) -> str:
    """Delete the checkpoint in the step folder ``name``: the manifest, then its attempt's
    objects. Returns its URL; CheckpointNotFoundError if it has no manifest."""
    got = store.get(_protocol.manifest_key(name))
    if got is None:
        raise CheckpointNotFoundError(f"no checkpoint for step {step} in {store.url}", step=step)
    try:
        _, attempt = _protocol.parse(store.url_of(name), step, got[0])
    except ManifestError:
        attempt = None
    store.delete([_protocol.manifest_key(name)])
    if attempt is not None:
        _protocol.discard(store, _protocol.data_prefix(name, attempt))
    return store.url_of(name)


def clean(store: Store, prefix: str, cutoff: float, *, dry_run: bool) -> list[str]:
    """Remove the attempts no manifest references whose newest object (or unfinished
    multipart upload) is older than ``cutoff``, unfinished multipart uploads older than
    that, and probe leftovers; return the URLs removed (with ``dry_run``: that would be)."""
    # Listed before the manifests are read: an attempt committed in between is
    # then seen as referenced.
    objects = store.find("")
    live = store.live_uploads("")
    referenced: set[str] = set()
    unreadable: set[str] = set()  # step folders whose manifest may reference any attempt
    for step, name in _protocol.step_names(store, prefix):
        got = store.get(_protocol.manifest_key(name))
        if got is None:
            continue
        try:
            referenced.add(_protocol.data_prefix(name, _protocol.parse(name, step, got[0])[1]))
        except ManifestError as exc:
            # A newer release's format, or a manifest copied from another step: its data
            # may be a checkpoint this release cannot read. Never remove it.
            log.warning("clean: every attempt under %s is kept: %s", store.url_of(name), exc)
            unreadable.add(f"{name}/")
    groups: dict[str, list[str]] = {}
    newest: dict[str, float] = {}
    for key, info in list(objects.items()) + [(k, _Live(t)) for k, t in live.items()]:
        group = _group(key, prefix)
        if group is None or _kept(group, referenced, unreadable):
            continue
        if not isinstance(info, _Live):
            groups.setdefault(group, []).append(key)
        newest[group] = max(newest.get(group, 0.0), info.mtime)
    removed = []
    for group in sorted(newest):
        if newest[group] >= cutoff:
            continue
        removed.append(store.url_of(group))
        if not dry_run:
            store.delete(groups.get(group, []))
    stale = [
        (k, u)
        for k, u in store.stale_uploads("", cutoff)
        if not _kept(_group(k, prefix), referenced, unreadable)
    ]
    if stale and not dry_run:
        store.abort_uploads(stale)
    return removed


def _kept(group: str | None, referenced: set[str], unreadable: set[str]) -> bool:
    """Whether the attempt folder ``group`` may hold a checkpoint's data: a readable
    manifest references it, or it sits under a step whose manifest cannot be read."""
    if group is None:
        return False
    return group in referenced or any(group.startswith(u) for u in unreadable)


def _group(key: str, prefix: str) -> str | None:
    """The attempt folder (``7/<attempt>/``) or probe object ``key`` belongs to."""
    head, _, rest = key.partition("/")
    if head == PROBE_DIR:
        return key
    step = parse_step(head, prefix)
    attempt = rest.partition("/")[0]
    if step is None or ATTEMPT_RE.fullmatch(attempt) is None or "/" not in rest:
        return None
    return f"{head}/{attempt}/"


@dataclass(frozen=True)
class _Live:
    """An unfinished multipart upload, as old as its start."""

    mtime: float
