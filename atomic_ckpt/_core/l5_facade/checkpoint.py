"""``CheckpointDir``: the facade over one checkpoint root.

Reading is :mod:`._read`; the commit protocol is :mod:`._commit` (its order in
one function, ``Commit._protocol``); cleanup, deletion, retention and the best
pointer are :mod:`._repair`; retention plans are :mod:`._retention`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, SupportsIndex, overload

from atomic_ckpt._core.l1_names.errors import CheckpointNotFoundError, InvalidRootError
from atomic_ckpt._core.l1_names.names import check_prefix, is_marker_name, not_one_string
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS, checksum_file
from atomic_ckpt._core.l2_syscalls.sync import NoSync, SyncPolicy
from atomic_ckpt._core.l3_formats.contents import FileCheck, check_contents
from atomic_ckpt._core.l3_formats.manifest import FileEntry
from atomic_ckpt._core.l3_formats.read import Checkpoint
from atomic_ckpt._core.l3_formats.tree import DEFAULT_WORKERS, list_tree, sync_files, sync_tree
from atomic_ckpt._core.l4_protocol import adopt as _adopt
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol import dedup as _dedup
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import joining as _joining
from atomic_ckpt._core.l4_protocol import repair as _repair
from atomic_ckpt._core.l4_protocol.commit import Commit
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l4_protocol.root import Root, check_step, resolve
from atomic_ckpt._core.l4_protocol.trainer_ops import TrainerOps
from atomic_ckpt._core.l5_facade.reading import PathLike, Reading

log = logging.getLogger(__name__)


class CheckpointDir(Reading, TrainerOps):
    """A directory of checkpoints, one subdirectory per step, committed atomically.

    ``root`` is created at the first commit; reading a missing root means "no
    checkpoints". With ``prefix="checkpoint-"`` the step directories are
    ``checkpoint-N``. ``durable=False`` skips every fsync (safe against process
    crashes, not against power loss). ``checksum`` names the algorithm recorded
    per file in the manifest (``"xxh3_128"``, the default, ``"crc32"``,
    ``"sha256"``) or None for sizes only. ``lock_timeout`` bounds the wait for
    the root lock, in seconds (negative: wait forever). ``workers`` is the
    number of threads that fsync, hash and verify files (default 32: fsync
    waits in the kernel, so many in flight let the disk merge work).
    ``sync`` replaces the durability steps with another
    :class:`~atomic_ckpt.SyncPolicy` (the crash tests switch single steps off
    this way); it overrides ``durable``.
    """

    def __init__(
        self,
        root: PathLike,
        *,
        prefix: str = "",
        durable: bool = True,
        checksum: str | None = "xxh3_128",
        lock_timeout: float = 300.0,
        workers: int | None = None,
        sync: SyncPolicy | None = None,
    ) -> None:
        check_prefix(prefix)
        if checksum is not None and checksum not in CHECKSUMS:
            raise ValueError(f"unknown checksum {checksum!r}; choose one of {sorted(CHECKSUMS)}")
        if workers is not None and (
            isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
        ):
            raise ValueError(f"workers must be an int >= 1 or None, got {workers!r}")
        if sync is not None and not isinstance(sync, SyncPolicy):
            raise TypeError(f"sync must be a SyncPolicy, got {type(sync).__name__}")
        policy = sync if sync is not None else (SyncPolicy() if durable else NoSync())
        self._root = Root(
            path=resolve(root),
            prefix=prefix,
            checksum=checksum,
            sync=policy,
            lock_timeout=lock_timeout,
            workers=workers if workers is not None else DEFAULT_WORKERS,
        )
        if self._root.path.exists() and not self._root.path.is_dir():
            raise InvalidRootError(
                f"checkpoint root {self._root.path} exists but is not a directory; "
                "pass a directory path (it is created if missing)",
                path=self._root.path,
            )

    def __repr__(self) -> str:
        return f"CheckpointDir({str(self.root)!r}, prefix={self.prefix!r}, durable={self.durable})"

    @property
    def root(self) -> Path:
        """The root directory (absolute, symlinks resolved)."""
        return self._root.path

    @property
    def prefix(self) -> str:
        """The step directories' name prefix (``""`` or e.g. ``"checkpoint-"``)."""
        return self._root.prefix

    @property
    def durable(self) -> bool:
        """False when no fsync reaches the disk (``durable=False``)."""
        return self._root.sync.durable

    @property
    def checksum(self) -> str | None:
        """The checksum algorithm recorded in new manifests, or None."""
        return self._root.checksum

    @property
    def sync(self) -> SyncPolicy:
        """The durability steps commits perform."""
        return self._root.sync

    @property
    def workers(self) -> int:
        """Threads that fsync, hash and verify files."""
        return self._root.workers

    def path_of(self, step: SupportsIndex) -> Path:
        """Where ``step``'s checkpoint lives (whether or not it exists)."""
        return self.root / self._root.name_of(check_step(step))

    def sync_tree(self, directory: PathLike, *, hash: bool = True) -> list[FileEntry]:
        """Step 3 of the protocol on ``directory``, for code that assembles a commit itself.

        fsyncs every regular file and subdirectory below it (as this root's
        :attr:`sync` policy says; never ``directory`` itself, never through a
        symlink), hashes the files with :attr:`checksum` when ``hash``, and returns
        their manifest entries sorted by path (the marker's names left out). An entry
        no manifest can record (a FIFO, socket or device; a name that is not valid
        UTF-8) raises :class:`~atomic_ckpt.ManifestError` naming it.
        """
        return sync_tree(
            Path(directory),
            policy=self.sync,
            checksum=self.checksum if hash else None,
            workers=self.workers,
            skip=is_marker_name,
        )

    def sync_files(
        self, directory: PathLike, paths: Collection[str], *, hash: bool = True
    ) -> list[FileEntry]:
        """Step 3 of the protocol for the named entries of ``directory`` only.

        For a rank of a multi-rank commit, which fsyncs (and hashes) exactly what it
        wrote, so each file is flushed once, by its writer. ``paths`` are relative
        POSIX paths below ``directory``: files are fsynced and, when ``hash``, hashed
        with :attr:`checksum`; directories are fsynced (not their contents); symlinks
        are recorded, never followed. Returns their manifest entries sorted by path.
        """
        not_one_string("paths", paths)
        return sync_files(
            Path(directory),
            paths,
            policy=self.sync,
            checksum=self.checksum if hash else None,
            workers=self.workers,
        )

    def list_tree(self, directory: PathLike) -> list[FileEntry]:
        """Every entry below ``directory`` with its type and size, sorted by path (the
        marker's names left out): no fsync and no file read, a listing and a stat each.
        What a multi-rank commit checks its ranks' declared files against."""
        return list_tree(Path(directory), skip=is_marker_name)

    def checksum_file(self, path: PathLike) -> str | None:
        """The checksum of one regular file with this root's algorithm (None if it has none)."""
        return None if self.checksum is None else checksum_file(Path(path), self.checksum)

    # ------------------------------------------------------------------ writing

    def begin(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        retain: RetentionPolicy | None = None,
        aliases: Collection[str] = (),
        replace_aliases: bool = False,
        replace_unusable: bool = False,
        dedup: bool | int | str = False,
    ) -> Commit:
        """Start a commit of ``step`` and return its handle (steps 1-2 of the protocol).

        Write into ``commit.path``, then ``commit.publish()`` (or ``commit.abort()``);
        or use it as a context manager. For code that cannot wrap its save in one
        ``with`` block; :meth:`commit` is built on it. Until it ends, another commit of
        ``step`` in this thread is refused unless it joins (see :meth:`commit`).
        ``replace_unusable``, ``dedup``: as for :meth:`commit` (linked: ``commit.deduped``).
        """
        return _begin.begin(
            self._root,
            step,
            metadata=metadata,
            retain=retain,
            aliases=aliases,
            replace_aliases=replace_aliases,
            replace_unusable=replace_unusable,
            dedup=dedup,
        )

    @contextlib.contextmanager
    def commit(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        retain: RetentionPolicy | None = None,
        aliases: Collection[str] = (),
        replace_aliases: bool = False,
        join: bool = False,
        carry: Mapping[str, int | str] | None = None,
        replace_unusable: bool = False,
        dedup: bool | int | str = False,
    ) -> Iterator[Path]:
        """Stage a checkpoint of ``step`` and commit it atomically on a normal exit.

        Yields the staging directory; write anything inside it. On a normal
        exit it is made durable and promoted to ``root/<step>``, atomically
        replacing an existing one. On an exception the staging directory is
        removed, nothing else is touched, and the exception propagates.
        ``metadata`` (a JSON object) is stored in the manifest. ``retain`` is
        applied once the new checkpoint is durable. ``aliases`` are symlinks in the
        root (``epoch3_step1200 -> 1200``) pointed at the checkpoint with its
        promotion; deleting the step removes them. ``replace_aliases=True`` makes them
        the step's only aliases: those naming the step's older save are removed
        (durably, just before the promotion), so no label outlives the save it named.

        A step directory that holds a checkpoint this release must not lose is refused
        (:class:`~atomic_ckpt.StepConflictError`, before anything is written): one a
        newer atomic_ckpt wrote (a newer marker format version), or a complete checkpoint
        moved or copied there by hand (``mv interrupted 5``: make it the step with
        ``atomic-ckpt promote`` instead). ``replace_unusable=True`` replaces it knowingly
        (logged). A directory without a marker is replaced with a warning, as before.

        ``join=True``: if this process already has an open commit of ``step`` (an outer
        ``commit``/``begin`` further up the stack, or in another thread), yield its
        staging directory and publish nothing here: the joined block is part of that
        commit, which the outermost block publishes. The rules:

        * while any joined block is open the commit is not published: its ``publish``
          waits for blocks open in other threads (``Commit.join_timeout`` seconds at
          most, then it aborts with :class:`~atomic_ckpt.CommitStateError`);
        * an exception leaving a joined block aborts the whole commit: the outer block
          (even if the caller swallowed the error) gets CommitStateError chained from
          it, and no half-written part is ever published; a joined block that ends
          normally after its commit was aborted raises CommitStateError too;
        * ``metadata``, ``aliases``, ``replace_aliases`` and ``retain`` merge into the
          commit joined: metadata keys are added, aliases appended, ``replace_aliases``
          or-ed, ``retain`` taken if the commit has none. A metadata key it already holds
          with another value, or another retain policy, is a ValueError naming that
          commit, and aborts it like any failed joined block;
        * a join once the commit is being published, from another thread once it ended
          (published or aborted), in a child forked inside it, or while another process
          commits the step, is refused (CommitStateError): never committed alone.

        With no open commit, ``join=True`` commits as usual, unless ``step`` is committed
        (CommitStateError naming :meth:`amend`) or is a late part as above;
        commit without ``join`` to save the step whole. Without ``join``, a commit of a
        step open in this thread (its ``with`` block, or a handle of :meth:`begin` this
        thread made and has not published or aborted) is refused (CommitStateError
        naming ``join=True``). (:meth:`staging` tells whether a commit is open.)

        ``carry``: files or subtrees of committed checkpoints put into the staging
        directory before it is yielded, without writing them again: ``{"tokenizer/": 4,
        "frozen.safetensors": "interrupted"}`` maps each relative path to the step or checkpoint
        name it comes from (see :meth:`Commit.carry <atomic_ckpt.Commit.carry>`, which
        also says how each was carried).

        ``dedup=True``: at the publish, each written file whose size and checksum equal
        the file at the same path in the newest complete checkpoint at or below ``step``
        (a step or checkpoint name instead of True names another) becomes a reflink or
        hard link to that file, if it is still the file its manifest describes (see
        ``docs/guides/incremental.md``); what was linked is logged at INFO.
        """
        if join:
            number = check_step(step)
            outer = _joining.find_join(self._root, self._root.name_of(number), number)
            if outer is not None:
                options = {"metadata": metadata, "aliases": aliases, "retain": retain}
                with _joining.joined(outer, replace_aliases=replace_aliases, **options) as path:
                    _carry.carry_all(outer, carry)
                    _dedup.join(outer, _dedup.check(dedup, self._root))
                    yield path
                return
            _joining.refuse_rejoin(self.path_of(step), check_step(step))
        with self.begin(
            step,
            metadata=metadata,
            retain=retain,
            aliases=aliases,
            replace_aliases=replace_aliases,
            replace_unusable=replace_unusable,
            dedup=dedup,
        ) as handle:
            _carry.carry_all(handle, carry)
            yield handle.path

    def mark_complete(
        self, step: SupportsIndex, *, check: bool = True, require: Collection[str] = ()
    ) -> Checkpoint:
        """Adopt an existing directory written without this library.

        ``require`` names the files (or directories; paths relative to the step's) that
        a complete save of its writer holds: a directory missing one is refused with a
        :class:`~atomic_ckpt.VerificationError` listing each missing path (always, also
        with ``check=False``, and also where the directory is already marked).
        Checks what can be checked without the writer (see :meth:`check_contents`)
        and refuses a directory whose files fail, with a
        :class:`~atomic_ckpt.VerificationError` naming each (``check=False`` adopts it
        anyway). Then fsyncs its files, writes a manifest marker (replacing a legacy
        empty one), and fsyncs the directory. A directory that already has a manifest
        is returned unchanged.
        """
        return _adopt.adopt(self._root, step, check=check, require=require)

    def check_contents(self, step: SupportsIndex) -> list[FileCheck]:
        """What can be checked of step ``step``'s files without their writer: safetensors
        headers against the file's length, torch zip archives' central directories, JSON
        that parses. One :class:`~atomic_ckpt.FileCheck` per regular file; ``format`` None
        for a file of a format not known here (not checked). The temporary of a one-file
        write that never finished (``.model.pt.tmp-<hex>``) is a problem. Read-only."""
        path = self.path_of(step)
        if not path.is_dir():
            why = f"no directory for step {step} in {self.root}: nothing to check (see ls)"
            raise CheckpointNotFoundError(why, path=path)
        return check_contents(path)

    def clean(self, *, dry_run: bool = False, force: bool = False) -> list[Path]:
        """Remove what crashed or killed saves left behind; return what was (or would be) removed.

        Removes orphaned staging dirs, old copies and their lock files: only
        entries this library made (whatever the prefix). A staging dir whose
        writer is alive (it holds the lock) is never touched. An old copy moved
        aside by the fallback replace whose step is now missing is renamed back
        instead (logged, not returned). ``force`` also removes entries of the
        library's forms (``<name>.tmp-<32 hex>``, or the hidden ``.tmp-<name>.<32 hex>``)
        that carry no evidence that it made them, such as a staging dir whose lock
        file a power loss dropped; use it only where no other tool names files
        that way.
        """
        return _repair.clean(self._root, dry_run=dry_run, force=force)

    def prune(self, *, keep_last: int) -> list[Path]:
        """Delete all but the ``keep_last`` newest complete checkpoints; return their paths.

        ``retain(RetentionPolicy(keep_last=keep_last))``: each is first renamed
        out of sight (``N.tmp-del-…``) and the rename made durable, so an
        interrupted deletion never leaves a complete-looking directory. The
        latest checkpoint, and the one ``checkpoint_best`` names, are never deleted.
        """
        return self.retain(RetentionPolicy.last(keep_last))

    def retain(
        self,
        policy: RetentionPolicy | None = None,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Literal["min", "max"] = "min",
    ) -> list[Path]:
        """Apply a :class:`RetentionPolicy` (given, or made of these options); return the
        deleted paths.

        Keeps the last ``keep_last``, every step divisible by ``keep_every`` and
        the ``keep_best`` best by the manifest metadata key ``metric`` (``mode``
        min or max), always the latest and the best; with ``metric`` it first
        points the ``checkpoint_best`` symlink at the best checkpoint (durably).
        The plan is made and carried out under the root lock.
        """
        policy = RetentionPolicy.of(
            policy,
            keep_last=keep_last,
            keep_every=keep_every,
            keep_best=keep_best,
            metric=metric,
            mode=mode,
        )
        return _delete.retain(self._root, policy)

    def best(self) -> Checkpoint | None:
        """The complete checkpoint the ``checkpoint_best`` symlink names, or None."""
        return _delete.read_best(self._root)

    def set_best(self, step: SupportsIndex) -> Checkpoint:
        """Point ``checkpoint_best`` at the complete checkpoint of ``step``, atomically and
        durably (CheckpointNotFoundError if it is not complete)."""
        return _delete.set_best(self._root, check_step(step))

    @overload
    def delete(
        self, step: SupportsIndex | str, *, force: bool = False, missing_ok: Literal[False] = False
    ) -> Path: ...
    @overload
    def delete(
        self, step: SupportsIndex | str, *, force: bool = False, missing_ok: bool
    ) -> Path | None: ...
    def delete(
        self, step: SupportsIndex | str, *, force: bool = False, missing_ok: bool = False
    ) -> Path | None:
        """Delete the complete checkpoint of ``step`` (or the named checkpoint ``step``,
        a string that is not a step) durably; return its path.

        It disappears at once (renamed out of sight, the rename made durable), then
        its files are removed, the marker first; its aliases go too. The step
        ``checkpoint_best`` names is refused (StepConflictError) unless ``force``,
        which removes the pointer as well. The latest step may be deleted.
        Nothing there is CheckpointNotFoundError, or with ``missing_ok=True`` (as for
        ``Path.unlink``) returns None; a directory there that is not a complete
        checkpoint is CheckpointNotFoundError either way.
        """
        number, name = self._target(step)
        try:
            if number is None:
                return _delete.delete_named(self._root, name)
            return _delete.delete(self._root, number, force=force)
        except CheckpointNotFoundError:
            if missing_ok and not os.path.lexists(self.root / name):
                return None
            raise

    def aliases(self, step: SupportsIndex | str) -> list[str]:
        """The aliases (symlinks in the root) naming ``step``'s checkpoint (or the named
        checkpoint ``step``), sorted. Read-only."""
        _, name = self._target(step)
        if not self.root.is_dir():
            return []
        return [p.name for p in _delete.aliases_of(self._root, {name})]

    def remove_alias(self, alias: str, *, missing_ok: bool = False) -> None:
        """Remove the alias ``alias``, durably (CheckpointNotFoundError if there is none,
        unless ``missing_ok``; a name there that is not a symlink is refused either way);
        the checkpoint it named is left alone."""
        try:
            _delete.remove_alias(self._root, alias)
        except CheckpointNotFoundError:
            if missing_ok and not os.path.lexists(self.root / alias):
                return
            raise
