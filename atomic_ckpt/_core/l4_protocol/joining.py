"""Blocks that join an open commit (``join=True``): the counting that keeps a commit
unpublished while any is open (:class:`JoinedBlocks`, mixed into
:class:`~atomic_ckpt.Commit`), :func:`joined`, and the rules a join follows.

The rules (PROTOCOL.md): a joined block is part of the commit it joins. While any joined
block is open (in any thread) the commit is not published; an error leaving a joined
block, or a join that cannot be made (an option contradicting the commit's), aborts the
whole commit, whose publish then raises CommitStateError; a join with no open commit
over a checkpoint already committed is refused (:func:`refuse_rejoin`), never a silent
replacement of the whole checkpoint by one part. A joined block's options merge into the
commit it joins (:func:`merge_options`).

This process's open commits are registered here (:func:`open_commit`), and so are the
ones that ended: a join is bound to the process that began the commit (a child forked
inside it is refused), a join from another thread naming a commit that ended (published
or aborted) is refused rather than committed alone (:func:`find_join`), and a second
commit of a step open in the same thread (its ``with`` block, or a handle of ``begin`` not
yet ended), without ``join=True``, is refused before it stages anything
(:func:`refuse_nested`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import weakref
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from atomic_ckpt._core.l1_names.errors import CommitStateError
from atomic_ckpt._core.l1_names.names import TAG_STAGING, parse_tmp
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l2_syscalls.forksafe import ProcessLock
from atomic_ckpt._core.l3_formats.manifest import check_metadata
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import stage as _stage
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy

# The Commit these functions take: commit.py builds Commit on JoinedBlocks and imports this
# module, so the type is not imported back (no import circle, TYPE_CHECKING included).
Commit = Any

JOIN_TIMEOUT = 1800.0
"""Default :attr:`Commit.join_timeout`: seconds :meth:`Commit.publish` waits for blocks
joined from other threads to end (as long as a distributed commit waits for a rank)."""


class JoinedBlocks:
    """The joined-block half of :class:`~atomic_ckpt.Commit` (see its documentation)."""

    name: str
    path: Path
    join_timeout: float
    _step: int | None
    _state: str  # commit.State
    _cond: threading.Condition
    _joiners: dict[int, int]
    _sealed: bool
    _why: BaseException | None

    def _require_open(self, what: str) -> None:
        raise NotImplementedError

    def abort(self, exc: BaseException | None = None) -> None:
        raise NotImplementedError

    def seal(self) -> None:
        """Wait for the joined blocks to end, then refuse new ones: the first step of
        publishing (idempotent). CommitStateError, aborting the commit, if one is still
        open after :attr:`join_timeout` or is open in this very thread; CommitStateError
        chained from its error if a joined block failed. An exception interrupting the
        wait (KeyboardInterrupt) aborts the commit and propagates: nothing stays open."""
        self._require_open("publish")
        me = threading.get_ident()
        with self._cond:
            if self._sealed:
                return
            inside = bool(self._joiners.get(me))
            interrupted: BaseException | None = None
            if not inside:
                try:
                    self._cond.wait_for(
                        lambda: not self._joiners or self._state != "open", self.join_timeout
                    )
                except BaseException as exc:  # Ctrl-C, a signal handler's error
                    interrupted = exc
            still = sum(self._joiners.values())
            if interrupted is None and self._state == "open" and not still:
                self._sealed = True
                return
        if interrupted is not None:  # an interrupted publish aborts, as a failed block does
            self.abort(interrupted)
            raise interrupted
        self._require_open("publish")  # aborted meanwhile by a failed joined block
        why = (
            "a block that joined it in this thread is still open (the commit's block "
            "ended inside it, or it is suspended: a generator not run to its end, an "
            "asyncio task not awaited). End every joined block before the commit's own "
            "block ends (exhaust or close the generator, await the tasks)"
            if inside
            else f"{still} block(s) that joined it are still open after "
            f"{self.join_timeout:g} s (join_timeout): end the threads that write into a "
            "commit before its own block ends"
        )
        error = CommitStateError(
            f"cannot publish the commit of {self.name}: {why}. Nothing was published",
            path=self.path,
            step=self._step,
        )
        self.abort(error)
        raise error

    def enter_join(self) -> None:
        """Count a joined block opening (``join=True``); CommitStateError if the commit
        ended or is being published (a part joined now would not be in it)."""
        self._require_open("join")
        with self._cond:
            if self._sealed or self._state != "open":
                raise CommitStateError(
                    f"cannot join the commit of {self.name}: it is being published, and a "
                    "part joined now would not be in it. Add files to a committed step "
                    "with amend()",
                    path=self.path,
                    step=self._step,
                )
            me = threading.get_ident()
            self._joiners[me] = self._joiners.get(me, 0) + 1

    @contextlib.contextmanager
    def _adding(self, what: str) -> Iterator[None]:
        """Count a call adding to the commit from any thread (a carry) as a joined block
        while it runs, so that a publish begun meanwhile waits for it; CommitStateError
        (``cannot <what> ...``) if the commit ended or is being published. Its error
        propagates without aborting the commit (a refused carry changes nothing)."""
        self._require_open(what)
        me = threading.get_ident()
        with self._cond:
            if self._sealed or self._state != "open":
                raise CommitStateError(
                    f"cannot {what} the commit of {self.name}: it is being published, and "
                    "what is added now would not be in it",
                    path=self.path,
                    step=self._step,
                )
            self._joiners[me] = self._joiners.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._joiners.get(me, 0) - 1
                if left > 0:
                    self._joiners[me] = left
                else:
                    self._joiners.pop(me, None)
                self._cond.notify_all()

    def leave_join(self, exc: BaseException | None) -> None:
        """Count a joined block ending; ``exc``, its error, aborts the commit. Leaving
        normally a commit that was aborted meanwhile raises CommitStateError (the part
        written is not going to be published)."""
        me = threading.get_ident()
        with self._cond:
            left = self._joiners.get(me, 0) - 1
            if left > 0:
                self._joiners[me] = left
            else:
                self._joiners.pop(me, None)
            if exc is not None and self._state == "open" and self._why is None:
                self._why = exc
            self._cond.notify_all()
        if exc is not None:
            self.abort(exc)
        elif self._state != "published":
            self._require_open("add to")


def check_own_aliases(name: str, aliases: Collection[str]) -> None:
    """ValueError if one of ``aliases`` is ``name``, the checkpoint's own directory (the
    promotion would put the checkpoint there, and then the alias could not be made)."""
    if name in aliases:
        raise ValueError(
            f"alias {name!r} is the checkpoint's own name: an alias is another name for "
            "it. Drop it from aliases="
        )


def describe(commit: Commit) -> str:
    """``step 5`` or ``'interrupted'``: the commit, for messages."""
    return f"step {commit._step}" if commit._step is not None else repr(commit.name)


def merge_options(
    commit: Commit,
    *,
    metadata: Mapping[str, Any] | None = None,
    aliases: Collection[str] = (),
    replace_aliases: bool = False,
    retain: RetentionPolicy | None = None,
) -> None:
    """Merge a joined block's options into the commit it joins, the documented rule:
    ``metadata`` keys are added (a key the commit has with another value is a
    ValueError), ``aliases`` appended, ``replace_aliases`` or-ed, ``retain`` taken if the
    commit has none (another policy is a ValueError). Every ValueError names the commit."""
    if isinstance(aliases, str):
        raise TypeError("aliases must be a collection of names, not one string")
    where = f"the commit of {describe(commit)} it joins"
    for key, value in check_metadata(metadata).items():
        if key in commit.metadata and _json(commit.metadata[key]) != _json(value):
            raise ValueError(
                f"a joined block sets metadata {key!r} to {value!r}, but {where} has "
                f"{commit.metadata[key]!r}: set it in one place"
            )
    new = [_delete.check_alias(commit._root, a) for a in aliases]
    check_own_aliases(commit.name, new)
    if retain is not None and commit.retain is not None and retain != commit.retain:
        raise ValueError(
            f"a joined block asks for retain={retain!r}, but {where} has "
            f"retain={commit.retain!r}: give the policy in one place"
        )
    commit.metadata.update(check_metadata(metadata))
    commit.aliases.extend(a for a in dict.fromkeys(new) if a not in commit.aliases)
    commit.replace_aliases = commit.replace_aliases or replace_aliases
    if retain is not None:
        commit.retain = retain


@contextlib.contextmanager
def joined(commit: Commit, **options: Any) -> Iterator[Path]:
    """A block that adds to the open ``commit`` (``join=True``): it yields the staging dir
    and publishes nothing; ``options`` merge by :func:`merge_options`. An exception
    leaving it (or raised merging the options) aborts the commit, whose publish then
    raises CommitStateError, so a half-written part is never published (a full disk is
    raised from the block as DiskFullError, and named in that CommitStateError). Leaving
    it normally when the commit was aborted meanwhile raises CommitStateError."""
    commit.enter_join()
    try:
        merge_options(commit, **options)
        yield commit.path
    except BaseException as exc:
        ended = commit.state != "open"  # aborted while this block ran (its staging removed)
        commit.leave_join(exc)
        commit._raise_disk_full(exc)  # as an ordinary commit's block would
        if ended and isinstance(exc, Exception):  # its write failed because of that
            raise CommitStateError(
                f"the commit of {describe(commit)} this block joined was aborted while the "
                f"block ran (its own block ended with an error, or another joined block "
                f"failed), and its staging directory removed; this block then failed "
                f"({type(exc).__name__}: {exc}). Nothing was published: save the step again",
                path=commit.final,
                step=commit._step,
            ) from exc
        raise
    commit.leave_join(None)


def refuse_rejoin(final: Path, step: int | None) -> None:
    """For ``join=True`` with no open commit: CommitStateError if ``final`` already holds a
    committed checkpoint (the block would replace all of it with its one part)."""
    if not (final.is_dir() and _stage.read_marker_or_none(final) is not None):
        return
    what = f"step {step}" if step is not None else f"the named checkpoint {final.name!r}"
    remedy = (
        f"add files to it with amend({step})"
        if step is not None
        else "write the whole checkpoint in one commit_named block"
    )
    raise CommitStateError(
        f"join=True found no open commit of {what} in this process, and {final} is "
        f"already committed: committing this block alone would replace the whole "
        f"checkpoint with only its part. To {remedy}; to replace it, commit without "
        "join=True",
        path=final,
        step=step,
    )


# ---------------------------------------------------------------- the registry

_LOCK = ProcessLock()
_OPEN: dict[tuple[Path, str], list[weakref.ref[Any]]] = {}
"""This process's open commits, by (root, directory name), oldest first. Every one is kept,
so that a nested commit of a step ending leaves the outer one findable. After a fork the
child holds its parent's: each commit records the process that began it."""

_ENDED: collections.OrderedDict[tuple[Path, str], tuple[int, int, str]] = collections.OrderedDict()
"""The commits that ended, by (root, directory name): (the process and the thread that
began it, ``published`` or ``aborted``). A new commit of the name drops its entry; the oldest go
beyond :data:`ENDED_KEPT` (a late joiner is late by one save, not by thousands)."""

ENDED_KEPT = 4096


def register(commit: Commit) -> None:
    """Record ``commit`` as open (its constructor calls this): a new commit of a name
    starts it over, so the record of an earlier one's end goes."""
    key = (commit._root.path, commit.name)
    with _LOCK:
        _ENDED.pop(key, None)
        refs = _OPEN.setdefault(key, [])
        refs[:] = [r for r in refs if r() is not None]  # commits dropped without ending
        refs.append(weakref.ref(commit))


def unregister(commit: Commit) -> None:
    """Record ``commit`` as ended (published if it was promoted, else aborted)."""
    key = (commit._root.path, commit.name)
    with _LOCK:
        refs = [r for r in _OPEN.get(key, ()) if (c := r()) is not None and c is not commit]
        if refs:
            _OPEN[key] = refs
        else:
            _OPEN.pop(key, None)
        how = "published" if commit._promoted else "aborted"
        _ENDED[key] = (commit._pid, commit._opener, how)
        _ENDED.move_to_end(key)
        while len(_ENDED) > ENDED_KEPT:
            _ENDED.popitem(last=False)


def _live(root: Path, name: str) -> list[Commit]:
    """The registered commits of ``name``, newest first (any process, any state)."""
    with _LOCK:
        refs = list(_OPEN.get((root, name), ()))
    return [c for r in reversed(refs) if (c := r()) is not None]


def open_commit(root: Any, name: str) -> Commit | None:
    """This process's newest open commit of the checkpoint ``name`` in ``root``, or None."""
    for commit in _live(root.path, name):
        if commit.state == "open" and commit._pid == os.getpid():
            return commit
    return None


def find_join(root: Any, name: str, step: int | None) -> Commit | None:
    """The commit a ``join=True`` block of ``name`` joins: this process's newest open one
    (or one ending right now, which :meth:`JoinedBlocks.enter_join` refuses), or None if
    there is none to join and the block may commit alone. CommitStateError where it must
    not: a commit open in the parent of this forked process, or one that ended (published
    or aborted) and was begun by another thread or process: the block is a late part of
    it, and would be committed alone. (The thread that began it may commit alone again:
    the save function called by itself, as on a retry.)"""
    me = os.getpid()
    live = _live(root.path, name)
    mine = [c for c in live if c._pid == me]
    for commit in mine:
        if commit.state == "open":
            return commit
    if mine:
        return mine[0]
    what = f"step {step}" if step is not None else repr(name)
    final = root.path / name
    if any(c.state == "open" for c in live):
        raise CommitStateError(
            f"cannot join the commit of {what}: it belongs to process {live[0]._pid}, and "
            f"this is process {me} (forked inside the commit). A forked child's part would "
            "be committed alone: write into the parent's staging directory and let the "
            "parent's commit publish it, or commit a whole checkpoint without join=True",
            path=final,
            step=step,
        )
    with _LOCK:
        ended = _ENDED.get((root.path, name))
    if ended is None or ended[:2] == (me, threading.get_ident()):
        refuse_foreign(root, name, step)
        return None
    refuse_rejoin(final, step)  # committed: the message names amend
    pid, _, how = ended
    by = "another thread" if pid == me else f"process {pid} (this one was forked from it)"
    raise CommitStateError(
        f"cannot join the commit of {what}: the one {by} opened has ended ({how}), and a "
        "block joining it now would be committed alone, holding only its part. Join "
        f"while the commit is open; to save {what} again, commit it whole without join=True",
        path=final,
        step=step,
    )


def refuse_foreign(root: Any, name: str, step: int | None) -> None:
    """For ``join=True`` with no open commit of ``name`` in this process: CommitStateError
    if another process is committing it right now (a staging dir of ``name`` whose lock a
    live process holds: a DataLoader-like worker forked before the trainer began the
    commit, another rank). Committed alone, the block would publish a checkpoint holding
    only its part, which the other commit then replaces without it."""
    try:
        entries = os.listdir(root.path)
    except OSError:  # no root yet: nobody is committing into it
        return
    for entry in entries:
        tmp = parse_tmp(entry)
        if tmp is None or tmp.is_lock or tmp.tag != TAG_STAGING or tmp.name != name:
            continue
        if not _locks.is_held(root.path / tmp.lock()):
            continue  # an orphan a killed save left, for clean()
        what = f"step {step}" if step is not None else repr(name)
        raise CommitStateError(
            f"join=True found no open commit of {what} in this process, but another process "
            f"is committing it (its staging directory {root.path / entry} is locked). A "
            "join cannot reach another process's commit, and committed alone this block "
            "would publish a checkpoint holding only its part: write the part from the "
            "process that opened the commit (or into that staging directory, and let that "
            "process publish it), or commit a whole checkpoint without join=True",
            path=root.path / name,
            step=step,
        )


def refuse_nested(root: Any, name: str, step: int | None) -> None:
    """CommitStateError if this thread of this process holds an open commit of ``name``:
    the commit of a ``with`` block it is inside (``commit``, ``commit_named``, ``amend``,
    ``with begin()``), or a handle of ``begin`` it made and has not yet published or
    aborted (held without a block). A second commit nested in it (without ``join=True``)
    would publish its part alone, and then the outer one replace it. Called before
    anything is staged. (A handle belongs to the thread of its ``with`` block if it has
    one, else to the thread that began it: one begun in another thread is another whole
    save, and the last to promote wins.)"""
    me, thread = os.getpid(), threading.get_ident()
    for commit in _live(root.path, name):
        if commit.state != "open" or commit._pid != me:
            continue
        bare = commit._block is None
        if (commit._opener if bare else commit._block) != thread:
            continue
        what = f"step {step}" if step is not None else repr(name)
        opened = f"begin({step})" if step is not None else f"begin_named({name!r})"
        outer = (
            f"a handle of {opened} made in this thread is not yet published or aborted"
            if bare
            else f"an outer commit or begin of {what}"
        )
        raise CommitStateError(
            f"a commit of {what} is already open in this thread ({outer}): a second one "
            "inside it would publish only its part, and the outer one would then replace "
            "it. Pass join=True to add to the open commit, or end the outer one first "
            "(publish() or abort() a handle). Nothing was staged",
            path=commit.final,
            step=step,
        )


def _json(value: object) -> str:
    """A metadata value as the manifest stores it: NaN equals NaN, ``True`` is not 1."""
    return json.dumps(value, sort_keys=True, allow_nan=True)
