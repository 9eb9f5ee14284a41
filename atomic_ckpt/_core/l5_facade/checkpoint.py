"""``CheckpointDir``: the facade over one checkpoint root.

Reading is :mod:`._read`; the commit protocol is :mod:`._commit` (its order in
one function, ``Commit._protocol``); cleanup, deletion, retention and the best
pointer are :mod:`._repair`; retention plans are :mod:`._retention`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple, SupportsIndex

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    InvalidRootError,
    NewerCheckpointsError,
    UnmarkedCheckpointsError,
    UnusableCheckpointsError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import MARKER, check_prefix, is_marker_name
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS, checksum_file
from atomic_ckpt._core.l2_syscalls.sync import NoSync, SyncPolicy
from atomic_ckpt._core.l3_formats import read as _read
from atomic_ckpt._core.l3_formats import verify as _verify
from atomic_ckpt._core.l3_formats.contents import FileCheck, check_contents
from atomic_ckpt._core.l3_formats.manifest import FileEntry
from atomic_ckpt._core.l3_formats.read import Checkpoint, Entry
from atomic_ckpt._core.l3_formats.tree import DEFAULT_WORKERS, list_tree, sync_files, sync_tree
from atomic_ckpt._core.l4_protocol import adopt as _adopt
from atomic_ckpt._core.l4_protocol import commit as _commit
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import repair as _repair
from atomic_ckpt._core.l4_protocol.commit import Commit
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l4_protocol.root import Root, check_step, resolve
from atomic_ckpt._core.l4_protocol.trainer_ops import TrainerOps

log = logging.getLogger(__name__)


class VerifiedCheckpoint(NamedTuple):
    """A checkpoint that verified, and the bytes of the files asked for, as read to verify it."""

    checkpoint: Checkpoint
    files: Mapping[str, memoryview]


PathLike = str | os.PathLike[str]
Verifier = Callable[[Checkpoint, Collection[str]], Mapping[str, memoryview]]
"""``verifier(checkpoint, read)`` of :meth:`CheckpointDir.resume_verified`: the views of
``read``, or VerificationError to pass the candidate over."""


class CheckpointDir(TrainerOps):
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

    # ------------------------------------------------------------------ reading

    def checkpoints(self) -> list[Checkpoint]:
        """Every complete checkpoint, by ascending step.

        Each marker's header is read, not its file list: a manifest's ``files``
        is read when first used, and raises ManifestError if that checkpoint was
        removed or replaced meanwhile (:meth:`get` it again).
        """
        return _read.complete(self.root, self.prefix, self._root.warned)

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""
        return [c.step for c in self.checkpoints()]

    def latest(self, *, verify: bool = False) -> Checkpoint | None:
        """The complete checkpoint with the highest step, or None.

        Step directories are examined from the highest down, and the search stops
        at the first complete one: usually one marker is read, however many
        checkpoints the root holds. With ``verify=True``, the newest one whose
        files match its manifest: a newer one that does not is skipped with a
        warning naming it and why.
        """
        found = self._newest(verify=verify, read=(), rejected=[])
        return None if found is None else found.checkpoint

    def resume_point(self, *, verify: bool = False, fresh: bool = False) -> Checkpoint | None:
        """The checkpoint a restarted job resumes from: :meth:`latest` (``verify`` as
        there), or None for a fresh start.

        A fresh start is refused where the root holds step directories but none to
        resume from, since the job would train from step 0 and commit over them:
        :class:`~atomic_ckpt.UnmarkedCheckpointsError` when they have no marker
        (written before atomic_ckpt: adopt them with ``atomic-ckpt mark-complete``),
        :class:`~atomic_ckpt.UnusableCheckpointsError` (its parent) when some are
        unusable otherwise: a marker this version cannot read (a newer format
        version, a non-empty legacy marker, a step moved by hand), or, with
        ``verify=True``, files that do not verify. Each error's message lists what is
        there, why it cannot be used and the remedies, in words an application can pass
        on to its user; ``paths`` and ``problems`` carry the same for an application
        that words its own (and names its own switch for ``fresh=True``, which starts
        over deliberately).

        Resuming from an older checkpoint below ones a newer atomic_ckpt wrote (a newer
        marker format version) is refused too, ``fresh`` or not:
        :class:`~atomic_ckpt.NewerCheckpointsError` (upgrade, or move them away), since
        the job would train over them and replace them at their step. Other incomplete
        steps above the one found are skipped with a warning, as by :meth:`latest`.
        """
        found = self._resume(verify=verify, fresh=fresh, read=())
        return None if found is None else found.checkpoint

    def resume_verified(
        self, read: Collection[str], *, fresh: bool = False, verifier: Verifier | None = None
    ) -> VerifiedCheckpoint | None:
        """:meth:`resume_point` with ``verify=True``, and the bytes of the files named in
        ``read`` (paths relative to the checkpoint) as they were mapped to verify it.

        A loader that deserializes from those views instead of opening the files again
        fetches each byte of the checkpoint from storage once
        (``atomic_ckpt.torch.resume(verify=True)`` works this way; ``benchmarks/resume.py``
        measures what it costs). A file of ``read`` that the checkpoint does not hold is
        simply absent from ``files``. A newest checkpoint that does not verify is skipped
        with a warning, as in :meth:`latest`; the same refusals as :meth:`resume_point`.

        ``verifier(checkpoint, read)``, if given, verifies each candidate (newest first,
        its marker read whole) instead of this process checking all of it: it returns
        the views of the files of ``read`` or raises :class:`~atomic_ckpt.VerificationError`
        to pass the candidate over (other errors propagate).
        :func:`atomic_ckpt.distributed.resume_verified` splits the work among ranks so.
        """
        return self._resume(verify=True, fresh=fresh, read=frozenset(read), verifier=verifier)

    def _newest(
        self,
        *,
        verify: bool,
        read: Collection[str],
        rejected: list[tuple[Path, str]],
        verifier: Verifier | None = None,
        skipped: list[Entry] | None = None,
    ) -> VerifiedCheckpoint | None:
        """The newest checkpoint (that verifies, with ``verify``), with the kept views of
        ``read``; each one passed over for not verifying is added to ``rejected``, each
        step directory above it that is not complete to ``skipped``."""
        for ckpt in _read.newest(self.root, self.prefix, self._root.warned, skipped):
            if not verify:
                return VerifiedCheckpoint(ckpt, {})
            try:
                checked = self.get(ckpt.step)  # its marker read whole, as verify() does
                files: Mapping[str, memoryview]
                if verifier is None:
                    files = _verify.verify(checked, workers=self.workers, keep=read)
                else:
                    files = verifier(checked, read)
            except (VerificationError, CheckpointNotFoundError) as exc:
                log.warning("skipping checkpoint %s: it does not verify: %s", ckpt.path, exc)
                problems = getattr(exc, "problems", ())
                why = "; ".join(problems) if problems else str(exc)
                rejected.append((ckpt.path, f"it does not verify: {why}"))
                continue
            return VerifiedCheckpoint(checked, files)
        return None

    def _resume(
        self, *, verify: bool, fresh: bool, read: Collection[str], verifier: Verifier | None = None
    ) -> VerifiedCheckpoint | None:
        rejected: list[tuple[Path, str]] = []
        skipped: list[Entry] = []
        found = self._newest(
            verify=verify, read=read, rejected=rejected, verifier=verifier, skipped=skipped
        )
        newer = [e for e in skipped if e.newer_format]
        if found is not None and newer:
            raise self._newer_error(found.checkpoint, newer)
        if found is not None or fresh:
            return found
        reasons = dict(rejected)  # passed over by the verify
        listed: list[tuple[Path, str]] = []
        unmarked: list[Path] = []
        for e in self.entries():  # by step
            if e.path in reasons:
                listed.append((e.path, reasons.pop(e.path)))
            elif e.status == "invalid":
                listed.append((e.path, e.problem or "its marker cannot be read"))
            elif e.status == "unmarked":
                how = f"`atomic-ckpt mark-complete {e.path}`"
                listed.append((e.path, f"no {MARKER} marker (if complete, adopt it: {how})"))
                unmarked.append(e.path)
        listed += reasons.items()  # (gone since: still, none of them could be used)
        if len(unmarked) == len(listed):
            if unmarked:
                raise self._unmarked_error(tuple(unmarked))
            return None
        problems = tuple(f"{p}: {reason}" for p, reason in listed)
        raise UnusableCheckpointsError(
            f"{self.root} holds {len(listed)} step directories but none to resume from; "
            "starting from scratch would train over them and replace them:\n  "
            + "\n  ".join(problems)
            + "\nRepair them (a newer atomic_ckpt reads newer markers) or move them away; "
            "or start the run from scratch deliberately, which trains over them",
            path=self.root,
            paths=tuple(p for p, _ in listed),
            problems=problems,
        )

    def _newer_error(self, found: Checkpoint, newer: list[Entry]) -> NewerCheckpointsError:
        problems = tuple(f"{e.path}: {e.problem}" for e in newer)
        return NewerCheckpointsError(
            f"{self.root} holds {len(newer)} checkpoint(s) newer than step {found.step} that "
            "a newer atomic_ckpt wrote:\n  "
            + "\n  ".join(problems)
            + f"\nResuming from step {found.step} would train over them and replace them. "
            "Upgrade atomic_ckpt (pip install -U atomic_ckpt) to resume from the newest, or "
            "move them out of the root to resume from the older one",
            path=self.root,
            paths=tuple(e.path for e in newer),
            problems=problems,
        )

    def _unmarked_error(self, unmarked: tuple[Path, ...]) -> UnmarkedCheckpointsError:
        shown = ", ".join(p.name for p in unmarked[:5]) + (", ..." if len(unmarked) > 5 else "")
        return UnmarkedCheckpointsError(
            f"{self.root} holds {len(unmarked)} step directories without a {MARKER} "
            f"marker ({shown}) and no complete checkpoint. If they were written "
            f"completely, adopt them (each one): `atomic-ckpt mark-complete {unmarked[-1]}`; "
            "or start the run from scratch deliberately, which trains over them",
            path=self.root,
            paths=unmarked,
        )

    def get(self, step: SupportsIndex) -> Checkpoint:
        """The complete checkpoint of ``step``; CheckpointNotFoundError if absent or incomplete.

        Reads that step's marker only (whole: its manifest is a snapshot, unaffected
        by a later replace or delete).
        """
        step = check_step(step)
        path = self.root / f"{self.prefix}{step}"
        try:
            st = os.lstat(path)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENAMETOOLONG, errno.ENOTDIR):
                raise
            raise CheckpointNotFoundError(
                f"no checkpoint for step {str(step)[:40]} in {self.root}", path=path, step=step
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise CheckpointNotFoundError(
                f"{path} is not a checkpoint directory (it is a file or a symlink)",
                path=path,
                step=step,
            )
        entry = _read.classify(path, step)
        if entry.status == "unmarked":
            raise CheckpointNotFoundError(
                f"checkpoint {path} is incomplete: it has no {MARKER} marker. If it was "
                f"written completely before atomic_ckpt, adopt it with "
                f"`atomic-ckpt mark-complete {path}`",
                path=path,
                step=step,
            )
        if entry.manifest is None:
            raise CheckpointNotFoundError(
                f"checkpoint {path} is incomplete: {entry.problem}", path=path, step=step
            )
        return Checkpoint(step, path, entry.manifest)

    def verify(
        self, step: SupportsIndex, *, progress: Callable[[int, int], None] | None = None
    ) -> Checkpoint:
        """Check the checkpoint's files against its manifest; return it if they match.

        Every entry is checked (present, type, size, checksum; files in parallel
        on :attr:`workers` threads, each read once) and the directory must hold
        nothing the manifest does not list. Raises one
        :class:`~atomic_ckpt.VerificationError` whose ``problems`` list every
        mismatch; a damaged marker (its file list fails its CRC-32) is one too.
        A legacy (empty) marker verifies presence only.

        ``progress(done, total)`` is called in this thread with the bytes checked
        so far and the total: at the start, about ten times a second, and at the
        end with ``done == total``.
        """
        ckpt = self.get(step)
        _verify.verify(ckpt, workers=self.workers, progress=progress)
        return ckpt

    def entries(self, *, include_staging: bool = False) -> list[Entry]:
        """Every step directory of the root, complete or not (and staging dirs if asked),
        sorted by step: what ``atomic-ckpt ls`` shows. Never writes, never warns."""
        return _read.scan(self.root, self.prefix, include_staging=include_staging)

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
    ) -> Commit:
        """Start a commit of ``step`` and return its handle (steps 1-2 of the protocol).

        Write into ``commit.path``, then call ``commit.publish()`` (or
        ``commit.abort()``); or use the handle as a context manager. For code that
        cannot wrap its save in one ``with`` block; :meth:`commit` is built on it.
        """
        return _commit.begin(
            self._root,
            step,
            metadata=metadata,
            retain=retain,
            aliases=aliases,
            replace_aliases=replace_aliases,
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

        ``join=True``: if this process already has an open commit of ``step`` (an outer
        ``commit``/``begin`` further up the stack, or in another thread), yield its
        staging directory and publish nothing here: the outermost commit publishes.
        An exception leaving a joined block aborts that outer commit too (its
        ``publish`` then raises :class:`~atomic_ckpt.CommitStateError`), so a
        half-written part is never published. With no open commit, ``join`` commits
        as usual. (:meth:`staging` answers the same question without committing.)
        """
        if join:
            outer = _commit.open_commit(self._root, self._root.name_of(check_step(step)))
            if outer is not None:
                with _commit.joined(outer) as path:
                    yield path
                return
        with self.begin(
            step,
            metadata=metadata,
            retain=retain,
            aliases=aliases,
            replace_aliases=replace_aliases,
        ) as handle:
            yield handle.path

    def mark_complete(self, step: SupportsIndex, *, check: bool = True) -> Checkpoint:
        """Adopt an existing directory written without this library.

        Checks what can be checked without the writer first (see :meth:`check_contents`)
        and refuses a directory whose files fail, with a
        :class:`~atomic_ckpt.VerificationError` naming each (``check=False`` adopts it
        anyway). Then fsyncs its files, writes a manifest marker (replacing a legacy
        empty one), and fsyncs the directory. A directory that already has a manifest
        is returned unchanged.
        """
        return _adopt.adopt(self._root, step, check=check)

    def check_contents(self, step: SupportsIndex) -> list[FileCheck]:
        """What can be checked of step ``step``'s files without their writer: safetensors
        headers against the file's length, torch zip archives' central directories, JSON
        that parses. One :class:`~atomic_ckpt.FileCheck` per regular file; ``format`` None
        for a file of a format not known here (not checked). Read-only."""
        return check_contents(self.path_of(step))

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

    def delete(self, step: SupportsIndex | str, *, force: bool = False) -> Path:
        """Delete the complete checkpoint of ``step`` (or the named checkpoint ``step``,
        a string that is not a step) durably; return its path.

        It disappears at once (renamed out of sight, the rename made durable), then
        its files are removed, the marker first; its aliases go too. The step
        ``checkpoint_best`` names is refused (StepConflictError) unless ``force``,
        which removes the pointer as well. The latest step may be deleted.
        """
        number, name = self._target(step)
        if number is None:
            return _delete.delete_named(self._root, name)
        return _delete.delete(self._root, number, force=force)

    def aliases(self, step: SupportsIndex | str) -> list[str]:
        """The aliases (symlinks in the root) naming ``step``'s checkpoint (or the named
        checkpoint ``step``), sorted. Read-only."""
        _, name = self._target(step)
        if not self.root.is_dir():
            return []
        return [p.name for p in _delete.aliases_of(self._root, {name})]

    def remove_alias(self, alias: str) -> None:
        """Remove the alias ``alias``, durably (CheckpointNotFoundError if there is none);
        the checkpoint it named is left alone."""
        _delete.remove_alias(self._root, alias)
