"""``CheckpointDir``: commit, scan, verify, adopt, clean and prune one checkpoint root.

The commit protocol is :meth:`CheckpointDir._publish`; its steps are numbered
as in ``PROTOCOL.md``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import operator
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout

from . import _fs, _locks
from ._errors import (
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    InvalidRootError,
    InvalidStepError,
    ManifestError,
    NotDurableError,
    RootNotWritableError,
    StagingLostError,
    StepConflictError,
    VerificationError,
)
from ._manifest import FileEntry, Manifest
from ._names import (
    MARKER,
    ROOT_LOCK,
    TAG_DELETE,
    TAG_OLD,
    TMP_INFIX,
    lock_name,
    new_token,
    parse_step,
    parse_tmp,
    step_name,
    tmp_name,
)
from ._retention import RetentionPolicy, read_best
from ._scan import Checkpoint, classify, complete, read_marker
from ._tree import CHECKSUMS, sync_tree
from ._verify import check_entry
from ._version import __version__

log = logging.getLogger("atomic_ckpt")

PathLike = str | os.PathLike[str]

_MARKER_TMP_PREFIX = MARKER + TMP_INFIX
_NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


@dataclass(frozen=True)
class Protocol:
    """Which durability steps a commit performs.

    The default is the full protocol. ``durable=False`` switches every fsync
    off but keeps the atomic rename. The crash tests switch single steps off
    (protocol mutants) to show that the simulation notices.
    """

    fsync_files: bool = True
    fsync_dirs: bool = True
    """Subdirectories of the checkpoint (the checkpoint dir itself is ``fsync_staging``)."""
    fsync_marker: bool = True
    marker_via_tmp: bool = True
    fsync_staging: bool = True
    fsync_root: bool = True
    replace: Literal["exchange", "aside", "delete"] = "exchange"
    """How an existing step is replaced: RENAME_EXCHANGE, the move-aside fallback,
    or (a mutant only) delete-then-rename."""


FULL = Protocol()
NOT_DURABLE = Protocol(
    fsync_files=False,
    fsync_dirs=False,
    fsync_marker=False,
    fsync_staging=False,
    fsync_root=False,
)


@dataclass
class _Stage:
    """A commit in progress: its staging directory, and (multi-rank) the gathered entries."""

    path: Path
    files: list[FileEntry] | None = None


def _check_step(raw: object) -> int:
    # Any integer type (numpy, torch) is accepted through __index__; bool is not.
    try:
        step = operator.index(raw)  # type: ignore[arg-type]
    except TypeError:
        step = None
    if isinstance(raw, bool) or step is None:
        raise InvalidStepError(
            f"step must be a non-negative int, got {type(raw).__name__} {raw!r}", step=None
        )
    if step < 0:
        raise InvalidStepError(f"step must be non-negative, got {step}", step=step)
    return step


class CheckpointDir:
    """A directory of checkpoints, one subdirectory per step, committed atomically.

    ``root`` is created at the first commit; reading a missing root means "no
    checkpoints". With ``prefix="checkpoint-"`` the step directories are
    ``checkpoint-N``. ``durable=False`` skips every fsync (safe against process
    crashes, not against power loss). ``checksum`` names the algorithm recorded
    per file in the manifest (``"xxh3_128"``, the default, ``"crc32"``,
    ``"sha256"``) or None for sizes only. ``lock_timeout`` bounds the wait for
    the root lock, in seconds (negative: wait forever).
    """

    def __init__(
        self,
        root: PathLike,
        *,
        prefix: str = "",
        durable: bool = True,
        checksum: str | None = "xxh3_128",
        lock_timeout: float = 300.0,
    ) -> None:
        # Symlinks resolved: fsync_dir never follows a link (O_NOFOLLOW), so a root
        # reached through one (`ckpts -> /scratch/ckpts`) must be fsynced by its real
        # path; resolving once also keeps one commit in one directory if the link moves.
        self._root = Path(os.path.realpath(os.fspath(root)))
        if "/" in prefix or os.sep in prefix or TMP_INFIX in prefix:
            raise ValueError(f"prefix {prefix!r} must be a plain name fragment")
        if checksum is not None and checksum not in CHECKSUMS:
            raise ValueError(f"unknown checksum {checksum!r}; choose one of {sorted(CHECKSUMS)}")
        self._prefix = prefix
        self._durable = durable
        self._checksum = checksum
        self._lock_timeout = lock_timeout
        self._protocol = FULL if durable else NOT_DURABLE
        self._warned: set[Path] = set()
        if self._root.exists() and not self._root.is_dir():
            raise InvalidRootError(
                f"checkpoint root {self._root} exists but is not a directory; "
                "pass a directory path (it is created if missing)",
                path=self._root,
            )

    def __repr__(self) -> str:
        return (
            f"CheckpointDir({str(self._root)!r}, prefix={self._prefix!r}, durable={self._durable})"
        )

    @property
    def root(self) -> Path:
        """The root directory (absolute, symlinks resolved)."""
        return self._root

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def durable(self) -> bool:
        return self._durable

    def path_of(self, step: int) -> Path:
        """Where ``step``'s checkpoint lives (whether or not it exists)."""
        return self._root / step_name(self._prefix, _check_step(step))

    # ------------------------------------------------------------------ reading

    def checkpoints(self) -> list[Checkpoint]:
        """Every complete checkpoint, by ascending step."""
        return complete(self._root, self._prefix, self._warned)

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""
        return [c.step for c in self.checkpoints()]

    def latest(self) -> Checkpoint | None:
        """The complete checkpoint with the highest step, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    def get(self, step: int) -> Checkpoint:
        """The complete checkpoint of ``step``; CheckpointNotFoundError if absent or incomplete."""
        path = self.path_of(step)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"no checkpoint for step {step} in {self._root}", path=path, step=step
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise CheckpointNotFoundError(
                f"{path} is not a checkpoint directory (it is a file or a symlink)",
                path=path,
                step=step,
            )
        entry = classify(path, step)
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

    def verify(self, step: int) -> Checkpoint:
        """Check that every file in the manifest is present with its size and checksum.

        Raises VerificationError naming the first bad file. A legacy (empty)
        marker verifies presence only.
        """
        ckpt = self.get(step)
        m = ckpt.manifest
        if m.legacy:
            return ckpt
        if m.step is not None and m.step != step:
            raise VerificationError(
                f"{ckpt.path}: manifest records step {m.step}, but the directory is step {step}",
                path=ckpt.path,
                step=step,
            )
        if m.checksum is not None and m.checksum not in CHECKSUMS:
            raise VerificationError(
                f"{ckpt.path}: cannot check checksums of algorithm {m.checksum!r} here",
                path=ckpt.path,
                step=step,
            )
        for entry in m.files:
            problem = check_entry(ckpt.path, entry, m.checksum)
            if problem is not None:
                bad = ckpt.path / entry.path
                raise VerificationError(f"{bad}: {problem}", path=bad, step=step)
        return ckpt

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def commit(self, step: int, *, metadata: Mapping[str, Any] | None = None) -> Iterator[Path]:
        """Stage a checkpoint of ``step`` and commit it atomically on a normal exit.

        Yields the staging directory; write anything inside it. On a normal
        exit it is made durable and promoted to ``root/<step>``, atomically
        replacing an existing one. On an exception the staging directory is
        removed, nothing else is touched, and the exception propagates.
        ``metadata`` (JSON-serializable) is stored in the manifest.
        """
        with self._staged(step, metadata) as stage:
            yield stage.path

    @contextlib.contextmanager
    def _staged(self, step: int, metadata: Mapping[str, Any] | None) -> Iterator[_Stage]:
        """:meth:`commit`, yielding a :class:`_Stage`.

        A multi-rank commit (``atomic_ckpt.distributed``) sets ``stage.files``
        before a normal exit: the entries every rank listed after fsyncing the
        tree, so step 3 is not repeated here.
        """
        step = _check_step(step)
        name = step_name(self._prefix, step)
        final = self._root / name
        meta = dict(metadata or {})
        _ensure_json(meta)
        self._ensure_root()
        self._check_target(final, step)
        token = new_token()
        staging = self._root / tmp_name(name, token)
        with self._staging_lock(name, token):
            try:
                fd = self._make_staging(staging)
                try:
                    stage = _Stage(staging)
                    yield stage
                    self._check_staging(staging, fd, step)
                finally:
                    os.close(fd)
                self._publish(step, staging, final, meta, files=stage.files)
            except BaseException as exc:
                self._discard(staging, exc)
                raise

    def _publish(
        self,
        step: int,
        staging: Path,
        final: Path,
        metadata: dict[str, Any],
        *,
        files: list[FileEntry] | None = None,
    ) -> None:
        """The commit protocol (PROTOCOL.md, steps 3 to 7), in order."""
        p = self._protocol
        # 3. fsync every regular file and subdirectory of the tree. (The staging
        #    dir itself is fsynced once, after the marker is in place: that one
        #    fsync makes every entry of it durable.) A multi-rank commit passes
        #    ``files``: every rank has already done this step for what it wrote.
        if files is None:
            files = self._sync_tree(staging)
        # 4. The marker: the manifest, via a temporary name, fsynced, renamed;
        #    then fsync the staging dir.
        self._write_marker(staging, self._manifest(step, files, metadata))
        if p.fsync_staging:
            _fs.fsync_dir(staging)
        # 5. Promote, under the root lock: rename (new step) or exchange (replace).
        with self._root_lock():
            self._restore_asides()
            self._check_target(final, step)
            old = self._promote(staging, final)
            # 6. fsync the root: this makes the rename itself durable.
            if p.fsync_root:
                try:
                    _fs.fsync_dir(self._root)
                except OSError as exc:
                    raise NotDurableError(
                        f"checkpoint {final} was promoted and is visible, but fsync of "
                        f"{self._root} failed ({exc}): it may not survive a power loss. "
                        "Check the disk, then commit this step again",
                        path=final,
                        step=step,
                    ) from exc
        # 7. Remove the old copy, if any (it sits under a name the scanner ignores;
        #    clean() never restores it, since its staging dir is gone).
        if old is not None:
            try:
                _fs.remove_tree(old)
            except OSError as exc:
                log.warning("could not remove old copy %s (%s); clean() will", old, exc)

    def _promote(self, staging: Path, final: Path) -> Path | None:
        """Move ``staging`` to ``final``. Returns where the old copy went, if there was one."""
        try:
            _fs.rename_noreplace(staging, final)
            return None
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
        mode = self._protocol.replace
        if mode == "exchange":
            try:
                _fs.rename_exchange(staging, final)
                return staging
            except OSError as exc:
                if exc.errno not in _fs.EXCHANGE_UNSUPPORTED:
                    raise
                log.info("RENAME_EXCHANGE unsupported here (%s); replacing by moving aside", exc)
                mode = "aside"
        if mode == "delete":  # a protocol mutant: never the library's choice
            _fs.remove_tree(final)
            _fs.rename(staging, final)
            return None
        # The fallback: move the old copy aside under a .tmp-old- name, then
        # promote. Between the two renames there is no N/; a crash there leaves
        # the aside copy *and* this staging dir, which is how clean() knows to
        # rename the old copy back (see _is_restorable).
        token = parse_tmp(staging.name)
        assert token is not None
        aside = self._root / tmp_name(final.name, token.token, TAG_OLD)
        if self._protocol.fsync_root:
            # The staging dir's entry must be durable before the old copy moves:
            # without it, a power loss could keep the move and lose the staging
            # dir, and the old copy would not be recognized as restorable.
            _fs.fsync_dir(self._root)
        _fs.rename(final, aside)
        try:
            _fs.rename_noreplace(staging, final)
        except BaseException as exc:
            try:
                _fs.rename(aside, final)
            except OSError as undo:
                exc.add_note(
                    f"atomic_ckpt: moving the old copy back to {final} also failed ({undo!r}); "
                    f"it is intact at {aside}, and clean() renames it back"
                )
            raise
        return aside

    def _sync_tree(self, directory: Path) -> list[FileEntry]:
        """Step 3 on ``directory`` (as far as the protocol says): fsync its files and subdirs."""
        return sync_tree(
            directory,
            fsync_files=self._protocol.fsync_files,
            fsync_dirs=self._protocol.fsync_dirs,
            checksum=self._checksum,
            skip=_is_marker_name,
        )

    def _manifest(self, step: int, files: list[FileEntry], metadata: Mapping[str, Any]) -> Manifest:
        return Manifest(
            step=step,
            files=tuple(files),
            created=time.time(),
            library_version=__version__,
            checksum=self._checksum,
            metadata=metadata,
        )

    def _write_marker(self, directory: Path, manifest: Manifest) -> None:
        p = self._protocol
        tmp = directory / (_MARKER_TMP_PREFIX + new_token()) if p.marker_via_tmp else None
        _fs.write_file_durable(
            directory / MARKER, manifest.to_bytes(), tmp=tmp, sync=p.fsync_marker
        )

    def mark_complete(self, step: int) -> Checkpoint:
        """Adopt an existing directory written without this library.

        Fsyncs its files, writes a manifest marker (replacing a legacy empty
        one), and fsyncs the directory. A directory that already has a
        manifest is returned unchanged.
        """
        path = self.path_of(step)
        if not os.path.lexists(path):  # (also: no root, so no root lock to take)
            raise CheckpointNotFoundError(
                f"{path} does not exist: nothing to mark complete", path=path, step=step
            )
        with self._root_lock():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                raise CheckpointNotFoundError(
                    f"{path} does not exist: nothing to mark complete", path=path, step=step
                ) from None
            if not stat.S_ISDIR(st.st_mode):
                raise StepConflictError(
                    f"{path} is not a directory: only a checkpoint directory can be marked",
                    path=path,
                    step=step,
                )
            try:
                existing = read_marker(path)
            except ManifestError:
                existing = None  # an unreadable marker is replaced by a valid one
            if existing is not None and not existing.legacy:
                return Checkpoint(step, path, existing)
            p = self._protocol
            manifest = self._manifest(step, self._sync_tree(path), {"adopted": True})
            # No rename follows: the marker is the commit point, so the entries
            # of the directory must be durable before the marker's rename is.
            if p.fsync_staging:
                _fs.fsync_dir(path)
            self._write_marker(path, manifest)
            if p.fsync_staging:
                _fs.fsync_dir(path)
            # The directory's own entry in the root: a legacy writer may have
            # just created it.
            if p.fsync_root:
                _fs.fsync_dir(self._root)
        return Checkpoint(step, path, manifest)

    def clean(self, *, dry_run: bool = False) -> list[Path]:
        """Remove what crashed or killed saves left behind; return what was (or would be) removed.

        Removes orphaned staging dirs, old copies and their lock files. A staging
        dir whose writer is alive (it holds the lock) is never touched. An old
        copy moved aside by the fallback replace whose step is now missing is
        renamed back instead (logged, not returned).
        """
        if not self._root.is_dir():
            return []
        if dry_run:
            # Only reads: takes no lock of its own, so it works on a read-only
            # root (and may list a save that finishes meanwhile).
            return [path for path, _ in self._orphans(dry_run=True)]
        # Claim the orphans (their token locks) under the root lock, then delete
        # them outside it, so a slow deletion never stalls a commit's promotion.
        with self._root_lock():
            orphans = self._orphans(dry_run=False)
        removed: list[Path] = []
        try:
            for path, lock in orphans:
                if lock is None or Path(lock.lock_file) != path:
                    _fs.remove_tree(path)
                removed.append(path)
        finally:
            for lock in {id(lock): lock for _, lock in orphans if lock is not None}.values():
                _locks.drop(lock)
        return removed

    def _orphans(self, *, dry_run: bool) -> list[tuple[Path, FileLock | None]]:
        """Entries left by dead writers, each with its claimed token lock (call under the root
        lock unless ``dry_run``). Restores the fallback's interrupted replaces first."""
        self._restore_asides(dry_run=dry_run)
        groups: dict[str, list[Path]] = {}
        for name in sorted(os.listdir(self._root)):
            tmp = parse_tmp(name)
            if tmp is not None:
                groups.setdefault(tmp.token, []).append(self._root / name)
        found: list[tuple[Path, FileLock | None]] = []
        for token, paths in groups.items():
            tmp = parse_tmp(paths[0].name)
            assert tmp is not None
            lock_path = self._root / lock_name(tmp.name, token)
            had_lock = lock_path.exists()
            if dry_run:
                if not _locks.is_held(lock_path):
                    found += [(p, None) for p in paths if not self._is_restorable(p)]
                continue
            lock = _locks.try_acquire(lock_path)
            if lock is None:
                continue  # a live writer holds it
            found += [(p, lock) for p in paths if p != lock_path]
            if had_lock:
                found.append((lock_path, lock))
        return found

    def prune(self, *, keep_last: int) -> list[Path]:
        """Delete all but the ``keep_last`` newest complete checkpoints; return their paths.

        Each is first renamed out of sight (``N.tmp-del-…``) and the rename made
        durable, so an interrupted deletion never leaves a complete-looking
        directory. The latest checkpoint, and the one ``checkpoint_best`` names
        (see :meth:`retain`), are never deleted.
        """
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(
                f"keep_last must be an int >= 1 (the latest checkpoint is never deleted), "
                f"got {keep_last!r}"
            )
        best = self.best()
        victims = self.checkpoints()[:-keep_last]
        return self._delete([c.path for c in victims if best is None or c.step != best.step])

    def retain(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Literal["min", "max"] = "min",
    ) -> list[Path]:
        """Apply a :class:`RetentionPolicy` with these options; return the deleted paths.

        Keeps the last ``keep_last``, every step divisible by ``keep_every`` and
        the ``keep_best`` best by the manifest metadata key ``metric`` (``mode``
        min or max), always the latest and the best; with ``metric`` it first
        points the ``checkpoint_best`` symlink at the best checkpoint (durably).
        """
        policy = RetentionPolicy(
            keep_last=keep_last,
            keep_every=keep_every,
            keep_best=keep_best,
            metric=metric,
            mode=mode,
        )
        return policy.apply(self)

    def best(self) -> Checkpoint | None:
        """The complete checkpoint the ``checkpoint_best`` symlink names, or None."""
        return read_best(self)

    def _delete(self, paths: list[Path]) -> list[Path]:
        """Delete checkpoint directories: move each aside durably, then remove it."""
        if not paths:
            return []
        moved: list[tuple[Path, Path, FileLock]] = []
        try:
            with self._root_lock():
                for path in paths:
                    token = new_token()
                    lock = _locks.new(self._root / lock_name(path.name, token), timeout=0)
                    lock.acquire()
                    aside = self._root / tmp_name(path.name, token, TAG_DELETE)
                    try:
                        _fs.rename(path, aside)
                    except FileNotFoundError:
                        _locks.drop(lock)
                        continue
                    except BaseException:
                        _locks.drop(lock)  # nothing was moved: leave no lock file behind
                        raise
                    moved.append((path, aside, lock))
                if self._protocol.fsync_root:
                    _fs.fsync_dir(self._root)
            for _, aside, _ in moved:
                _fs.remove_tree(aside)
        finally:
            for _, _, lock in moved:
                _locks.drop(lock)
        return [path for path, _, _ in moved]

    # ------------------------------------------------------------------ helpers

    def _ensure_root(self) -> None:
        try:
            _fs.makedirs(self._root, sync=self._protocol.fsync_root)
        except FileExistsError:
            raise InvalidRootError(
                f"checkpoint root {self._root} exists but is not a directory", path=self._root
            ) from None
        except NotADirectoryError:
            raise InvalidRootError(
                f"checkpoint root {self._root} cannot be created: a parent is a file",
                path=self._root,
            ) from None
        except OSError as exc:
            raise self._wrap(exc) from exc

    def _wrap(self, exc: OSError) -> BaseException:
        if exc.errno in _NOT_WRITABLE:
            why = "the filesystem is read-only" if exc.errno == errno.EROFS else "permission denied"
            return RootNotWritableError(
                f"cannot write to checkpoint root {self._root}: {why}. Choose a writable "
                "directory or fix its permissions; existing checkpoints are untouched",
                path=self._root,
            )
        return exc

    def _check_target(self, final: Path, step: int) -> None:
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise StepConflictError(
                f"{final} exists and is {kind}, so step {step} cannot be committed there; "
                "move it away first",
                path=final,
                step=step,
            )

    def _make_staging(self, staging: Path) -> int:
        """Create the staging dir; return a descriptor that pins its identity.

        Holding the directory open for the whole save keeps its inode from being
        reused, so a save that deletes it and makes a new one is always noticed.
        """
        try:
            os.mkdir(staging)  # mode 0o777 & ~umask, like any mkdir
        except OSError as exc:
            raise self._wrap(exc) from exc
        return os.open(staging, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

    def _check_staging(self, staging: Path, fd: int, step: int) -> None:
        try:
            st: os.stat_result | None = os.lstat(staging)
        except FileNotFoundError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode) or not os.path.samestat(st, os.fstat(fd)):
            raise StagingLostError(
                f"the staging directory {staging} was removed or replaced during the save; "
                "the save function must write inside it, not move or delete it. "
                "Nothing was committed",
                path=staging,
                step=step,
            )

    def _discard(self, staging: Path, exc: BaseException) -> None:
        """Remove a failed commit's staging dir; attach (never swallow) a cleanup failure.

        Except when a fallback replace failed to move its old copy back: then the
        staging dir is what tells clean() that the old copy must be restored.
        """
        tmp = parse_tmp(staging.name)
        assert tmp is not None
        if (self._root / tmp_name(tmp.name, tmp.token, TAG_OLD)).is_dir() and not os.path.lexists(
            self._root / tmp.name
        ):
            return
        try:
            _fs.remove_tree(staging)
        except OSError as cleanup:
            exc.add_note(f"atomic_ckpt: removing {staging} also failed: {cleanup!r}")

    @contextlib.contextmanager
    def _root_lock(self) -> Iterator[None]:
        # The root exists here: commit() creates it once, on entry; every other
        # caller works on a root that already holds something.
        lock = _locks.new(self._root / ROOT_LOCK, self._lock_timeout)
        try:
            lock.acquire()
        except Timeout:
            raise CheckpointTimeoutError(
                f"timed out after {self._lock_timeout}s waiting for the lock of {self._root}; "
                "another process holds it (a commit, clean or prune)",
                path=self._root,
            ) from None
        except OSError as exc:
            raise self._wrap(exc) from exc
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def _staging_lock(self, name: str, token: str) -> Iterator[None]:
        # Taken under the root lock and before the staging dir exists, so
        # clean() (which holds the root lock) never sees a live save unlocked.
        with self._root_lock():
            lock = _locks.new(self._root / lock_name(name, token), timeout=0)
            try:
                lock.acquire()
            except OSError as exc:
                raise self._wrap(exc) from exc
        try:
            yield
        except BaseException as exc:
            # The save's (or the protocol's) error is the one to raise; a failure
            # to remove the lock file is attached to it, never raised instead.
            try:
                _locks.drop(lock)
            except OSError as cleanup:
                exc.add_note(f"atomic_ckpt: removing {lock.lock_file} also failed: {cleanup!r}")
            raise
        _locks.drop(lock)

    def _is_restorable(self, path: Path) -> bool:
        """Is ``path`` the old copy of a fallback replace that crashed in its window?

        That is: a complete ``N.tmp-old-<t>`` copy, no ``N/``, no live writer,
        and the same writer's staging dir ``N.tmp-<t>`` still there. Once the
        staging dir has been renamed to ``N/`` its old copy is garbage, even if
        ``N/`` is later pruned: it must never come back.
        """
        tmp = parse_tmp(path.name)
        if tmp is None or tmp.tag != TAG_OLD or parse_step(self._prefix, tmp.name) is None:
            return False
        if (
            os.path.lexists(self._root / tmp.name)
            or not (self._root / tmp_name(tmp.name, tmp.token)).is_dir()
            or _locks.is_held(self._root / lock_name(tmp.name, tmp.token))
        ):
            return False
        try:
            return read_marker(path) is not None
        except (ManifestError, OSError):
            return False

    def _restore_asides(self, *, dry_run: bool = False) -> None:
        """Undo the crash window of the fallback replace (call under the root lock).

        The fallback moves ``N/`` aside to ``N.tmp-old-…`` before renaming the
        new copy to ``N/``; a crash between the two leaves no ``N/``. A live
        writer is never in that window outside the root lock, so here every
        such copy is a crashed one: rename it back.
        """
        restored = False
        old_tag = TMP_INFIX + TAG_OLD
        # Runs at every commit: filter on the name before touching the disk.
        for name in sorted(n for n in os.listdir(self._root) if old_tag in n):
            path = self._root / name
            if self._is_restorable(path):
                tmp = parse_tmp(name)
                assert tmp is not None
                log.warning(
                    "%s %s to %s (a replace was interrupted)",
                    "would restore" if dry_run else "restoring",
                    path,
                    tmp.name,
                )
                if not dry_run:
                    _fs.rename_noreplace(path, self._root / tmp.name)
                    restored = True
        if restored and self._protocol.fsync_root:
            _fs.fsync_dir(self._root)


def _is_marker_name(name: str) -> bool:
    return name == MARKER or name.startswith(_MARKER_TMP_PREFIX)


def _ensure_json(metadata: dict[str, Any]) -> None:
    import json

    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serializable: {exc}") from None
