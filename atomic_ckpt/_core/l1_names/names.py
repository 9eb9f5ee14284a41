"""Every on-disk name the library uses, defined once, and the parsers for them.

Layout of one checkpoint root::

    root/
      3/                          complete: holds ``checkpoint_complete``
      .tmp-5.<hex>/               a save in progress (or the old copy it replaced)
      .tmp-5.<hex>.lock           the lock its writer holds for the whole save
      .tmp-5.old-<hex>/           fallback replace: the old copy moved aside
      .tmp-5.del-<hex>/           prune: a checkpoint being deleted
      .atomic_ckpt.tmp-root.lock  serializes promotion; exists only while held
      checkpoint_best -> 4        symlink to the best checkpoint (``retain(metric=...)``)

Anything whose name contains :data:`TMP_INFIX` is never a checkpoint.

Why the temporary names *start* with ``.tmp-`` (0.1 wrote ``5.tmp-<hex>``, which
:func:`parse_tmp` still reads, so ``clean()`` removes what an older version left):
tools that list a root by name must not take them for checkpoints. Hugging Face
``Trainer`` globs ``checkpoint-*`` and parses ``.*checkpoint-([0-9]+)``, so an
in-flight ``checkpoint-5.tmp-<hex>/`` counted as step 5 in its rotation; a name
that starts with ``.tmp-`` matches neither that glob nor any ``<prefix><digits>``
pattern, and it is hidden from ``ls`` and shell globs. The root lock is removed
by whoever releases it (:mod:`._locks` makes that safe), so a root at rest holds
only checkpoints: Accelerate's automatic naming, which takes the first digit run
of *every* entry as a step, crashed on its digit-free name.
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
_TAIL = (
    rf"(?P<tag>{re.escape(TAG_OLD)}|{re.escape(TAG_DELETE)})?"
    rf"(?P<token>[0-9a-f]{{{_TOKEN_HEX}}})(?P<lock>{re.escape(LOCK_SUFFIX)})?"
)
_TMP_RE = re.compile(rf"{re.escape(TMP_INFIX)}(?P<name>.+)\.{_TAIL}", re.ASCII)
"""``.tmp-<name>.[tag]<token>[.lock]``: what this version writes."""
_LEGACY_TMP_RE = re.compile(rf"(?P<name>.+?){re.escape(TMP_INFIX)}{_TAIL}", re.ASCII)
"""``<name>.tmp-[tag]<token>[.lock]``: what 0.1 wrote; still parsed, never written.
The two never overlap: a name never contains ``.tmp-``, so a legacy entry never
starts with it."""
_LONGEST_SUFFIX = len(TMP_INFIX) + len(".") + len(TAG_DELETE) + _TOKEN_HEX + len(LOCK_SUFFIX)


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


def tmp_name(name: str, token: str, tag: str = TAG_STAGING, *, legacy: bool = False) -> str:
    """The staging (or aside) name for the checkpoint ``name``: ``.tmp-<name>.<tag><token>``
    (``legacy``: 0.1's ``<name>.tmp-<tag><token>``, to find the siblings of such an entry)."""
    if legacy:
        return f"{name}{TMP_INFIX}{tag}{token}"
    return f"{TMP_INFIX}{name}.{tag}{token}"


def lock_name(name: str, token: str, *, legacy: bool = False) -> str:
    """The lock file a writer holds while it owns ``tmp_name(name, token, *)``."""
    return tmp_name(name, token, legacy=legacy) + LOCK_SUFFIX


@dataclass(frozen=True)
class TmpName:
    """A parsed staging, aside or lock entry of a root (either form)."""

    name: str
    tag: str
    token: str
    is_lock: bool
    legacy: bool = False
    """Written by 0.1 (``<name>.tmp-…``): its siblings have that form too."""

    def sibling(self, tag: str = TAG_STAGING) -> str:
        """The entry of the same writer (token) and name with ``tag``, in the same form."""
        return tmp_name(self.name, self.token, tag, legacy=self.legacy)

    def lock(self) -> str:
        """The lock file of this entry's writer, in the same form."""
        return lock_name(self.name, self.token, legacy=self.legacy)


def parse_tmp(entry: str) -> TmpName | None:
    """Parse a staging, aside or lock name of this library's form (this version's or
    0.1's); None otherwise."""
    m = _TMP_RE.fullmatch(entry)
    legacy = m is None
    if m is None:
        m = _LEGACY_TMP_RE.fullmatch(entry)
        if m is None:
            return None
    return TmpName(m["name"], m["tag"] or "", m["token"], m["lock"] is not None, legacy)
