"""Every on-disk name the library uses, defined once, and the parsers for them.

Layout of one checkpoint root::

    root/
      3/                          complete: holds ``checkpoint_complete``
      5.tmp-<hex>/                a save in progress (or the old copy it replaced)
      5.tmp-<hex>.lock            the lock its writer holds for the whole save
      5.tmp-old-<hex>/            fallback replace: the old copy moved aside
      5.tmp-del-<hex>/            prune: a checkpoint being deleted
      .atomic_ckpt.tmp-root.lock  serializes promotion within the root
      checkpoint_best -> 4        symlink to the best checkpoint (``retain(metric=...)``)

Anything whose name contains :data:`TMP_INFIX` is never a checkpoint.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

MARKER = "checkpoint_complete"
"""Completeness marker inside a checkpoint: the JSON manifest, or empty (legacy)."""

TMP_INFIX = ".tmp-"
"""Any name containing this is staging or garbage, never a checkpoint."""

MARKER_TMP_PREFIX = MARKER + TMP_INFIX
"""The marker's temporary names (``mark_complete`` writes through one)."""

ROOT_LOCK = ".atomic_ckpt.tmp-root.lock"
"""Lock file that serializes promotion (and cleanup) within one root."""

BEST_LINK = "checkpoint_best"
"""Symlink in the root naming the best checkpoint by a metric (see ``retain``)."""

LOCK_SUFFIX = ".lock"

TAG_STAGING = ""
TAG_OLD = "old-"
"""Fallback replace without RENAME_EXCHANGE: the old copy, restorable by ``clean()``."""
TAG_DELETE = "del-"
"""Prune: a checkpoint moved out of sight before it is deleted."""

NAME_MAX = 255
"""The longest file name POSIX filesystems take (bytes)."""

_TOKEN_HEX = 32
_STEP_RE = re.compile(r"(?:0|[1-9][0-9]*)", re.ASCII)
_TMP_RE = re.compile(
    rf"(?P<name>.+?){re.escape(TMP_INFIX)}"
    rf"(?P<tag>{re.escape(TAG_OLD)}|{re.escape(TAG_DELETE)})?"
    rf"(?P<token>[0-9a-f]{{{_TOKEN_HEX}}})(?P<lock>{re.escape(LOCK_SUFFIX)})?",
    re.ASCII,
)
_LONGEST_SUFFIX = len(TMP_INFIX) + len(TAG_DELETE) + _TOKEN_HEX + len(LOCK_SUFFIX)


def step_name(prefix: str, step: int) -> str:
    """The directory name of ``step``: the prefix followed by the canonical decimal."""
    return f"{prefix}{step}"


def fits(name: str) -> bool:
    """Can ``name`` and every temporary name derived from it exist on disk?"""
    return len(name.encode("utf-8", "surrogateescape")) + _LONGEST_SUFFIX <= NAME_MAX


def parse_step(name: str, prefix: str = "") -> int | None:
    """The step that the directory name ``name`` names, or None if it is not a step name.

    Canonical means ASCII decimal without leading zeros, after ``prefix``: ``7``,
    not ``007``, ``+7`` or non-ASCII digits. Names containing ``.tmp-`` are never
    steps, nor are names too long to exist on disk.
    """
    if TMP_INFIX in name or not name.startswith(prefix) or len(name) > NAME_MAX:
        return None
    digits = name[len(prefix) :]
    if _STEP_RE.fullmatch(digits) is None:
        return None
    return int(digits)


def is_marker_name(name: str) -> bool:
    """The marker, or one of its temporary names (left out of a manifest's file list)."""
    return name == MARKER or name.startswith(MARKER_TMP_PREFIX)


def new_token() -> str:
    """A fresh random token for a staging name (uuid4 hex: 32 lowercase hex digits)."""
    return uuid.uuid4().hex


def tmp_name(name: str, token: str, tag: str = TAG_STAGING) -> str:
    """The staging (or aside) name for the checkpoint ``name``."""
    return f"{name}{TMP_INFIX}{tag}{token}"


def lock_name(name: str, token: str) -> str:
    """The lock file a writer holds while it owns ``tmp_name(name, token, *)``."""
    return f"{name}{TMP_INFIX}{token}{LOCK_SUFFIX}"


@dataclass(frozen=True)
class TmpName:
    """A parsed ``<name>.tmp-[tag]<token>[.lock]`` entry of a root."""

    name: str
    tag: str
    token: str
    is_lock: bool


def parse_tmp(entry: str) -> TmpName | None:
    """Parse a staging, aside or lock name of this library's form; None otherwise."""
    m = _TMP_RE.fullmatch(entry)
    if m is None:
        return None
    return TmpName(m["name"], m["tag"] or "", m["token"], m["lock"] is not None)
