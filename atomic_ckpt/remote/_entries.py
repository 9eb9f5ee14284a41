"""Every step folder of a remote root and its status, complete or not: :class:`RemoteEntry`,
one row of ``atomic-ckpt ls``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from atomic_ckpt import Manifest, ManifestError
from atomic_ckpt.remote import _protocol
from atomic_ckpt.remote._protocol import ATTEMPT_RE
from atomic_ckpt.remote._store import Store

Status = Literal["complete", "incomplete", "uncommitted"]


@dataclass(frozen=True)
class RemoteEntry:
    """One step folder of a remote root as ``atomic-ckpt ls`` shows it.

    ``status``: ``complete`` (a manifest whose objects are all there),
    ``incomplete`` (a manifest that is invalid or lists missing objects: see
    ``problem``) or ``uncommitted`` (attempts but no manifest: an upload in
    progress, or what a crashed or losing one left; ``clean()`` removes those).
    """

    name: str
    url: str
    step: int
    status: Status
    manifest: Manifest | None = None
    problem: str | None = None
    attempts: int = 0


def entries(store: Store, prefix: str) -> list[RemoteEntry]:
    """Every step folder of ``store`` whose name is ``prefix`` + a step, sorted by step."""
    out = []
    for step, name in _protocol.step_names(store, prefix):
        attempts = sum(1 for n in store.children(name + "/") if ATTEMPT_RE.fullmatch(n))
        url = store.url_of(name)
        got = store.get(_protocol.manifest_key(name))
        if got is None:
            out.append(RemoteEntry(name, url, step, "uncommitted", attempts=attempts))
            continue
        try:
            manifest, attempt = _protocol.parse(url, step, got[0])
            problems = _protocol.missing(
                manifest,
                store.find(_protocol.data_prefix(name, attempt)),
                _protocol.data_prefix(name, attempt),
            )
        except ManifestError as exc:
            out.append(RemoteEntry(name, url, step, "incomplete", problem=str(exc)))
            continue
        if problems:
            out.append(
                RemoteEntry(name, url, step, "incomplete", manifest, problems[0], attempts=attempts)
            )
        else:
            out.append(RemoteEntry(name, url, step, "complete", manifest, attempts=attempts))
    return out
