"""The reading half of :class:`~atomic_ckpt.CheckpointDir`: listing, resuming and verifying
complete checkpoints (reading never writes)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import NamedTuple, SupportsIndex, cast, overload

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    UnusableCheckpointsError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import MARKER, not_one_string, step_of
from atomic_ckpt._core.l3_formats import read as _read
from atomic_ckpt._core.l3_formats import verify as _verify
from atomic_ckpt._core.l3_formats.read import Checkpoint, Entry
from atomic_ckpt._core.l4_protocol import named as _named
from atomic_ckpt._core.l4_protocol.named import NamedCheckpoint
from atomic_ckpt._core.l4_protocol.root import Root, check_step
from atomic_ckpt._core.l5_facade import refusals as _refusals

# The logger the facade has always used (a log filter may name it).
log = logging.getLogger("atomic_ckpt._core.l5_facade.checkpoint")


class VerifiedCheckpoint(NamedTuple):
    """A checkpoint that verified, and the bytes of the files asked for, as read to verify it."""

    checkpoint: Checkpoint
    files: Mapping[str, memoryview]


class ResumePlan(NamedTuple):
    """What a resume found, scanned once (:meth:`CheckpointDir.resume_plan`), and the
    decision to resume or to start over, taken later, where the resume happens.

    ``checkpoint``: the one to resume from, or None. ``refusal``: the error a resume
    raises there (:class:`~atomic_ckpt.UnusableCheckpointsError` or a subclass), or None.
    """

    checkpoint: Checkpoint | None
    refusal: UnusableCheckpointsError | None

    def resume(self, *, fresh: bool = False) -> Checkpoint | None:
        """The checkpoint to resume from, or None to start from scratch: what
        :meth:`CheckpointDir.resume_point` with the same ``fresh`` returns or raises.
        ``fresh=True`` starts over deliberately where nothing can be resumed from, over
        step directories that are unusable; it never skips a checkpoint that is there
        (a newer or a moved one above it is refused, ``fresh`` or not)."""
        if self.refusal is not None and (self.checkpoint is not None or not fresh):
            raise self.refusal
        return self.checkpoint


PathLike = str | os.PathLike[str]

REPLACED_RETRIES = 3
"""How many times a verify that failed on a step directory replaced meanwhile (by another
commit of the step) verifies the new one before its failure is raised."""


def _identity(path: Path) -> tuple[int, ...] | None:
    """What changes when ``path``'s checkpoint is replaced: the directory's and its marker's
    inode and times (a new save's directory and marker are new files), None if absent."""
    try:
        top, marker = os.lstat(path), os.lstat(path / MARKER)
    except OSError:
        return None
    return (top.st_dev, top.st_ino, top.st_ctime_ns, marker.st_ino, marker.st_ctime_ns)


Verifier = Callable[[Checkpoint, Collection[str]], Mapping[str, memoryview]]
"""``verifier(checkpoint, read)`` of :meth:`CheckpointDir.resume_verified`: the views of
``read``, or VerificationError to pass the candidate over."""


class Reading:
    """Mixed into :class:`~atomic_ckpt.CheckpointDir`; see its documentation."""

    _root: Root

    def checkpoints(self) -> list[Checkpoint]:
        """Every complete checkpoint, by ascending step.

        Each marker's header is read, not its file list: a manifest's ``files``
        is read when first used, and raises ManifestError if that checkpoint was
        removed or replaced meanwhile (:meth:`get` it again).
        """
        return _read.complete(self._root.path, self._root.prefix, self._root.warned)

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
        the job would train over them and replace them at their step; so is resuming below
        a complete checkpoint moved or copied by hand to a step's name (``mv interrupted
        5``: :class:`~atomic_ckpt.UnusableCheckpointsError` naming ``atomic-ckpt promote``,
        the supported way to make a named checkpoint a step). Other incomplete steps
        above the one found are skipped with a warning, as by :meth:`latest`.
        """
        found = self._resume(verify=verify, fresh=fresh, read=())
        return None if found is None else found.checkpoint

    def resume_plan(self, *, verify: bool = False) -> ResumePlan:
        """:meth:`resume_point`, its decision left to the caller: the root is scanned now
        (``verify`` as there), and nothing is raised until ``plan.resume(fresh=...)``,
        which returns or raises what ``resume_point(fresh=...)`` would have.

        For a trainer that looks at its checkpoints when it is built (to log what it
        will resume from, say) and learns only later whether this run resumes or starts
        over: the refusal to train over unusable checkpoints then comes from the call
        that decides, with the switch it was given.
        """
        found, refusal = self._scan(verify=verify, read=())
        return ResumePlan(None if found is None else found.checkpoint, refusal)

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
        not_one_string("read", read)
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
        for ckpt in _read.newest(self._root.path, self._root.prefix, self._root.warned, skipped):
            if not verify:
                return VerifiedCheckpoint(ckpt, {})
            try:
                checked: Checkpoint
                files: Mapping[str, memoryview]
                if verifier is None:
                    checked, files = self._verify_current(ckpt.step, keep=read)
                else:
                    checked = self.get(ckpt.step)  # its marker read whole, as verify() does
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
        found, refusal = self._scan(verify=verify, read=read, verifier=verifier)
        if refusal is not None and (found is not None or not fresh):
            raise refusal
        return found

    def _scan(
        self, *, verify: bool, read: Collection[str], verifier: Verifier | None = None
    ) -> tuple[VerifiedCheckpoint | None, UnusableCheckpointsError | None]:
        """The checkpoint to resume from, and the error a resume raises (with it, always;
        without one, unless ``fresh``)."""
        rejected: list[tuple[Path, str]] = []
        skipped: list[Entry] = []
        found = self._newest(
            verify=verify, read=read, rejected=rejected, verifier=verifier, skipped=skipped
        )
        self._warn_moved_to_names(None if found is None else found.checkpoint.step)
        newer = [e for e in skipped if e.newer_format]
        if found is not None and newer:
            return found, _refusals.newer_error(self._root, found.checkpoint, newer)
        moved = [e for e in skipped if e.moved or e.marker_dir]  # kept: a commit refuses them
        if found is not None and moved:
            return found, _refusals.moved_error(self._root, found.checkpoint, moved)
        if found is not None:
            return found, None
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
        if not listed:
            return None, _refusals.other_prefix_error(self._root)
        if len(unmarked) == len(listed):
            return None, _refusals.unmarked_error(self._root, tuple(unmarked)) if unmarked else None
        problems = tuple(f"{p}: {reason}" for p, reason in listed)
        return None, UnusableCheckpointsError(
            f"{self._root.path} holds {len(listed)} step directories but none to resume from; "
            "starting from scratch would train over them and replace them:\n  "
            + "\n  ".join(problems)
            + "\nRepair them (a newer atomic_ckpt reads newer markers) or move them away; "
            "or start the run from scratch deliberately, which trains over them",
            path=self._root.path,
            paths=tuple(p for p, _ in listed),
            problems=problems,
        )

    def _warn_moved_to_names(self, resumed: int | None) -> None:
        """Warn (once per directory) of each step above ``resumed`` (None: any) moved by
        hand under a name: the resume cannot see it, and nothing would replace it."""
        for path, step in _read.steps_under_names(self._root.path, self._root.prefix):
            if (resumed is None or step > resumed) and path not in self._root.warned:
                self._root.warned.add(path)
                back = self._root.path / f"{self._root.prefix}{step}"
                log.warning(
                    "%s holds the complete checkpoint of step %d, moved or copied there by "
                    "hand under a name: this resume does not see it (it %s); to resume from "
                    "it, move it back: mv %s %s",
                    path,
                    step,
                    "starts from scratch" if resumed is None else f"resumes from step {resumed}",
                    path,
                    back,
                )

    def get(self, step: SupportsIndex) -> Checkpoint:
        """The complete checkpoint of ``step``; CheckpointNotFoundError if absent or incomplete.

        Reads that step's marker only (whole: its manifest is a snapshot, unaffected
        by a later replace or delete).
        """
        step = check_step(step)
        path = self._root.path / f"{self._root.prefix}{step}"
        try:
            st = os.lstat(path)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENAMETOOLONG, errno.ENOTDIR):
                raise
            raise CheckpointNotFoundError(
                f"no checkpoint for step {str(step)[:40]} in {self._root.path}",
                path=path,
                step=step,
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

    @overload
    def verify(
        self, step: SupportsIndex, *, progress: Callable[[int, int], None] | None = None
    ) -> Checkpoint: ...
    @overload
    def verify(
        self, step: str, *, progress: Callable[[int, int], None] | None = None
    ) -> Checkpoint | NamedCheckpoint: ...
    def verify(
        self, step: SupportsIndex | str, *, progress: Callable[[int, int], None] | None = None
    ) -> Checkpoint | NamedCheckpoint:
        """Check the checkpoint's files against its manifest; return it if they match.

        ``step`` is a step, a step as ``ls`` shows it (``"5"``, ``"checkpoint-5"``), or a
        named checkpoint's name (``"base"``: a carry source is checked like a step; its
        :class:`~atomic_ckpt.NamedCheckpoint` is returned).

        Every entry is checked (present, type, size, checksum; files in parallel
        on :attr:`workers` threads, each read once) and the directory must hold
        nothing the manifest does not list. Raises one
        :class:`~atomic_ckpt.VerificationError` whose ``problems`` list every
        mismatch; a damaged marker (its file list fails its CRC-32) is one too.
        A legacy (empty) marker verifies presence only. A step replaced by another
        commit while it is verified (each save whole, this pass reading part of each)
        is verified again, as the new save (a few times at most): the checkpoint
        returned is the one that verified.

        ``progress(done, total)`` is called in this thread with the bytes checked
        so far and the total: at the start, about ten times a second, and at the
        end with ``done == total``.
        """
        if isinstance(step, str):
            number = step_of(step, self._root.prefix)
            if number is None:
                ckpt = self._verify_current(_named.check_name(self._root, step), progress=progress)
                return NamedCheckpoint(step, ckpt[0].path, ckpt[0].manifest)
            step = number
        return self._verify_current(step, progress=progress)[0]

    def _verify_current(
        self,
        step: SupportsIndex | str,
        *,
        keep: Collection[str] = (),
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[Checkpoint, dict[str, memoryview]]:
        """``step``'s checkpoint (its marker read whole) verified, with the kept views.

        A verify that fails where the step's directory was replaced meanwhile (another
        commit of the step: each save is whole, but this pass read part of each) verifies
        the new directory instead, :data:`REPLACED_RETRIES` times at most; a failure on a
        directory nobody replaced is raised as it is."""
        for attempt in range(REPLACED_RETRIES + 1):
            if isinstance(step, str):  # a named checkpoint's (checked) name
                path = self._root.path / step
                before = _identity(path)
                found = _named.get(self._root, step)  # its manifest records no step
                ckpt = Checkpoint(cast(int, None), found.path, found.manifest)
            else:
                path = self._root.path / self._root.name_of(check_step(step))
                before = _identity(path)
                ckpt = self.get(step)
            try:
                return ckpt, _verify.verify(
                    ckpt, workers=self._root.workers, progress=progress, keep=keep
                )
            except VerificationError:
                if attempt == REPLACED_RETRIES or _identity(path) == before:
                    raise
                log.info("%s was replaced while it was verified: verifying the new save", path)
        raise AssertionError("unreachable")  # pragma: no cover

    def entries(self, *, include_staging: bool = False) -> list[Entry]:
        """Every step directory of the root, complete or not (and staging dirs if asked),
        sorted by step: what ``atomic-ckpt ls`` shows. Never writes, never warns."""
        return _read.scan(self._root.path, self._root.prefix, include_staging=include_staging)
