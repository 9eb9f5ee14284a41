"""Every on-disk name the library uses, defined once, and the parsers for them.

Layout of a plain checkpoint root (no prefix), the names PROTOCOL.md gives::

    root/
      3/                          complete: holds ``checkpoint_complete``
      5.tmp-<hex>/                a save in progress (or the old copy it replaced)
      5.tmp-<hex>.lock            the lock its writer holds for the whole save
      5.tmp-old-<hex>/            fallback replace: the old copy moved aside
      5.tmp-del-<hex>/            prune: a checkpoint being deleted
      .atomic_ckpt.tmp-root.lock  serializes promotion; exists only while held
      checkpoint_best -> 4        symlink to the best checkpoint (``retain(metric=...)``)

A root with a prefix (``checkpoint-N``) writes the same names in the hidden form,
``.tmp-checkpoint-5.<hex>``, ``.tmp-checkpoint-5.<hex>.lock``,
``.tmp-checkpoint-5.old-<hex>``, ...: frameworks list such a root by the glob
``<prefix>*`` (Hugging Face ``Trainer`` globs ``checkpoint-*`` and parses
``.*checkpoint-([0-9]+)``), and an in-flight ``checkpoint-5.tmp-<hex>/`` counted
there as step 5 in its rotation; a name that starts with ``.tmp-`` matches neither
that glob nor any ``<prefix><digits>`` pattern, and it is hidden from ``ls`` and
shell globs. :func:`hidden_tmp` is that rule. Both forms are temporary everywhere
(the scanner, ``clean()``, the crash suite), whichever form the root writes: a root
may hold what another version (or another prefix setting) left.

Anything whose name contains :data:`TMP_INFIX` is never a checkpoint. The names a
user chooses (a prefix, a named checkpoint, an alias) are printable characters
(:func:`check_chars`): a newline would put a name out of reach of the patterns
that recognise its temporary names. The root lock is removed by whoever releases
it (:mod:`..l2_syscalls.locks` makes that safe), so a root at rest holds only
checkpoints: Accelerate's automatic naming, which takes the first digit run of
*every* entry as a step, crashed on its digit-free name.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
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
_HIDDEN_RE = re.compile(rf"{re.escape(TMP_INFIX)}(?P<name>.+)\.{_TAIL}", re.ASCII | re.DOTALL)
"""``.tmp-<name>.[tag]<token>[.lock]``: the hidden form (roots with a prefix)."""
_PLAIN_RE = re.compile(rf"(?P<name>.+?){re.escape(TMP_INFIX)}{_TAIL}", re.ASCII | re.DOTALL)
"""``<name>.tmp-[tag]<token>[.lock]``: the design's form (plain roots; and every root
of 0.1). The two never overlap: a name never contains ``.tmp-``, so an entry of
this form never starts with it. (``DOTALL``: what an older version left for a name
with a newline is still recognised.)"""
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


def step_of(text: str, prefix: str = "") -> int | None:
    """The step a user means by ``text``: a step's directory name (``checkpoint-5``) or
    its number as ``ls`` shows it (``5``), whatever the prefix; None for anything else
    (a checkpoint name: :func:`check_chosen_name` refuses both forms as names)."""
    number = parse_step(text, prefix)
    return number if number is not None or not prefix else parse_step(text)


def not_one_string(what: str, value: object, of: str = "paths") -> None:
    """TypeError if ``value``, given for the collection ``what``, is one string: iterated,
    it would be taken for a set of one-character ``of``; or one path object (a
    ``Path``), which is not a collection at all."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be a collection of {of}, not one string: pass [{value!r}]")
    if isinstance(value, os.PathLike):
        raise TypeError(f"{what} must be a collection of {of}, not one path: pass [{value!r}]")


def not_a_mapping(what: str, value: object, example: str) -> None:
    """TypeError if ``value``, given for the mapping (or None) ``what``, is not a mapping
    (one path, a list of them): the message shows the form it takes (``example``)."""
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{what}= maps {example}, not {type(value).__name__} {value!r}")


def is_marker_name(name: str) -> bool:
    """The marker, or one of its temporary names (left out of a manifest's file list)."""
    return name == MARKER or name.startswith(MARKER_TMP_PREFIX)


def new_token() -> str:
    """A fresh random token for a staging name (uuid4 hex: 32 lowercase hex digits)."""
    return uuid.uuid4().hex


def hidden_tmp(prefix: str) -> bool:
    """Does a root with ``prefix`` write its temporary names in the hidden form?

    A plain root writes the design's ``N.tmp-<hex>``; a prefix means a framework may
    glob ``<prefix>*``, which ``checkpoint-5.tmp-<hex>`` would match.
    """
    return prefix != ""


def tmp_name(name: str, token: str, tag: str = TAG_STAGING, *, hidden: bool) -> str:
    """The staging (or aside) name for the entry ``name``: ``<name>.tmp-<tag><token>``,
    or with ``hidden`` (see :func:`hidden_tmp`) ``.tmp-<name>.<tag><token>``."""
    if hidden:
        return f"{TMP_INFIX}{name}.{tag}{token}"
    return f"{name}{TMP_INFIX}{tag}{token}"


def lock_name(name: str, token: str, *, hidden: bool) -> str:
    """The lock file a writer holds while it owns ``tmp_name(name, token, *, hidden)``."""
    return tmp_name(name, token, hidden=hidden) + LOCK_SUFFIX


@dataclass(frozen=True)
class TmpName:
    """A parsed staging, aside or lock entry of a root (either form)."""

    name: str
    tag: str
    token: str
    is_lock: bool
    hidden: bool
    """Of the hidden form (``.tmp-<name>.…``): its siblings have that form too."""

    def sibling(self, tag: str = TAG_STAGING) -> str:
        """The entry of the same writer (token) and name with ``tag``, in the same form."""
        return tmp_name(self.name, self.token, tag, hidden=self.hidden)

    def lock(self) -> str:
        """The lock file of this entry's writer, in the same form."""
        return lock_name(self.name, self.token, hidden=self.hidden)


def parse_tmp(entry: str) -> TmpName | None:
    """Parse a staging, aside or lock name of this library's form (either form); None
    otherwise."""
    m = _HIDDEN_RE.fullmatch(entry)
    hidden = m is not None
    if m is None:
        m = _PLAIN_RE.fullmatch(entry)
        if m is None:
            return None
    return TmpName(m["name"], m["tag"] or "", m["token"], m["lock"] is not None, hidden)


def check_chars(what: str, text: str) -> str:
    """``text`` if every character of it is printable; ValueError naming ``what`` otherwise.

    The one rule for the names a user chooses (a prefix, a named checkpoint, an
    alias): letters, digits, punctuation, symbols and the space, in any script
    (:meth:`str.isprintable`), never a newline, tab or other control character, whose
    temporary names no pattern would match (``clean()`` could never remove them).
    """
    if not text.isprintable():
        bad = next(c for c in text if not c.isprintable())
        raise ValueError(
            f"{what} {text!r} contains {bad!r}: names may hold printable characters only "
            "(letters, digits, punctuation, symbols and spaces; no newline, tab or other "
            "control character)"
        )
    return text


_RESERVED = (".", "..", BEST_LINK, ROOT_LOCK, MARKER)
"""Entry names of a root that no chosen name may take."""


def check_prefix(prefix: object) -> str:
    """``prefix`` if it can start every step directory's name; ValueError otherwise.

    A name fragment: no path separator, no ``.tmp-``, printable (:func:`check_chars`),
    at most half of a name's 255 bytes.
    """
    if not isinstance(prefix, str) or "/" in prefix or os.sep in prefix or TMP_INFIX in prefix:
        raise ValueError(f"prefix {prefix!r} must be a plain name fragment")
    check_chars("prefix", prefix)
    if len(prefix) > NAME_MAX // 2:
        raise ValueError(f"prefix {prefix[:20]!r}... is too long for a directory name")
    return prefix


def check_chosen_name(what: str, name: object, prefix: str, *, hidden: bool) -> str:
    """``name`` if it can name an entry of a root with ``prefix`` (a named checkpoint, an
    alias); ValueError starting with ``what`` otherwise.

    A plain name: not empty, no path separator, not a step name (digits, or the
    prefix and digits), no ``.tmp-``, not a name the library reserves, not too long,
    printable (:func:`check_chars`); ``hidden=False`` refuses a leading dot too.
    """
    if (
        not isinstance(name, str)
        or not name
        or "/" in name
        or os.sep in name
        or name in _RESERVED
        or TMP_INFIX in name
        or (not hidden and name.startswith("."))
        or parse_step(name, prefix) is not None
        or parse_step(name) is not None
        or not fits(name)
    ):
        raise ValueError(
            f"{what} {name!r} must be a plain name that is not a step name (digits, or the "
            f"prefix and digits), a .tmp- name, {BEST_LINK!r}, {MARKER!r}"
            + ("" if hidden else ", hidden")
            + " or too long"
        )
    return check_chars(what, name)
