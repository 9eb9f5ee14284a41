"""Record a save once, then run a checker on every crash state it allows.

:func:`record` runs the save on a scratch root under the recorder and yields a
:class:`Recording`; :func:`explore` does both and returns a :class:`Report`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeAlias

from atomic_ckpt import CheckpointDir, SyncPolicy
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.testing._recorder import _Recorder
from atomic_ckpt.testing._results import (
    MODELS,
    Checker,
    CrashState,
    DataFate,
    Failure,
    InvariantViolation,
    Report,
)
from atomic_ckpt.testing._sparse import all_zero, text
from atomic_ckpt.testing._states import _Candidate, _CrashStates, _Flat
from atomic_ckpt.testing.invariants import check_invariants

_TOKEN_RE = re.compile(r"[0-9a-f]{32}")
_ROOT_NAME = "ckpts"

Replace: TypeAlias = Literal["exchange", "aside", "delete"]
"""How a recorded commit replaces an existing step: ``exchange`` (RENAME_EXCHANGE,
the library's way where the filesystem has it), ``aside`` (the move-aside fallback,
as where it has not), or ``delete`` (a protocol mutant: delete the old step, then
rename the new one, the window with neither that the library exists to avoid)."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the library's log records about the broken directories a crash state is full of.

    Each module logs to its own child of ``atomic_ckpt``, and a child's records go to
    the parent's handlers even when the parent is ``disabled``; levels are inherited,
    though, so the parent's level (and that of any child with a level of its own) is
    raised above CRITICAL for the duration, then restored.
    """
    loggers = [logging.getLogger("atomic_ckpt")] + [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if name.startswith("atomic_ckpt.")
        and isinstance(logger, logging.Logger)
        and logger.level != logging.NOTSET
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class Recording(_CrashStates):
    """A recorded run: its operations, its saves, and the crash states they allow.

    Made by :func:`record` (a context manager); :meth:`explore` checks every
    crash state, :meth:`check` one chosen state.
    """

    def __init__(
        self,
        recorder: _Recorder,
        scratch: Path,
        *,
        prefix: str,
        sync: SyncPolicy,
        replace: Replace,
    ) -> None:
        super().__init__(recorder, scratch)
        self.prefix = prefix
        self.sync = sync
        self.replace = replace

    def describe(self, c: _Candidate, flat: _Flat) -> str:
        """A readable account of a crash state: each operation's fate, and what is on disk."""
        tokens: dict[str, str] = {}

        def short(text: str) -> str:
            return _TOKEN_RE.sub(lambda m: tokens.setdefault(m[0], f"<t{len(tokens) + 1}>"), text)

        last = (
            f": #{c.crash_point - 1} {self.ops[c.crash_point - 1].description}"
            if c.crash_point
            else ""
        )
        lines = [
            f"[{c.model}] crash after {c.crash_point} of {len(self.ops)} operations{last}"
            f" ({c.note})"
        ]
        covered = self.covered(c.crash_point)
        for op in self.ops[: c.crash_point]:
            if op.kind == "sync":
                fate = ""
            elif op.index in covered:
                fate = "durable"
            elif op.index in c.persisted:
                fate = {"zero": "ZERO-FILLED", "torn": "TORN (half)"}.get(
                    c.fates.get(op.index, "kept"), "kept (not fsynced)"
                )
            else:
                fate = "LOST"
            who = "" if op.by == "library" else " [observed]"
            lines.append(f"  #{op.index:<3} {short(op.description)}{who}  {fate}".rstrip())
        lines.append("  on disk after the crash:")
        lines += [
            f"    {short(p)}{'/' if k == 'dir' else ''}"
            + (
                f" ({len(b)} bytes{', all zero' if b and all_zero(b) else ''})"
                if k == "file"
                else ""
            )
            + (f" -> {text(b)}" if k == "symlink" else "")
            for p, k, b in flat
        ] or ["    (nothing)"]
        return "\n".join(lines)

    def _run(self, c: _Candidate, flat: _Flat, checker: Checker) -> Failure | None:
        root = self._materialize(flat)
        description = self.describe(c, flat)
        state = CrashState(
            root=root,
            prefix=self.prefix,
            sync=self.sync,
            model=c.model,
            crash_point=c.crash_point,
            expected=self.expectations(c.crash_point),
            description=description,
            moved_aside=self._rec.moved_aside or self.replace == "aside",
        )
        try:
            with _quiet():
                checker(state)
        except Exception as exc:
            invariant = exc.invariant if isinstance(exc, InvariantViolation) else None
            message = str(exc) if isinstance(exc, AssertionError) else f"checker raised {exc!r}"
            return Failure(c.model, c.crash_point, invariant, message, description)
        return None

    def check(
        self,
        crash_point: int,
        *,
        persisted: Collection[int] = (),
        fates: Mapping[int, DataFate] | None = None,
        checker: Checker | None = None,
    ) -> Failure | None:
        """Check one crash state: the first ``crash_point`` ops ran, the fsynced ones are
        durable, and of the rest exactly ``persisted`` survived (their data with ``fates``)."""
        loose = set(self.uncovered(crash_point))
        if not set(persisted) <= loose:
            raise ValueError(f"ops {sorted(set(persisted) - loose)} are not unsynced at that point")
        fates = dict(fates or {})
        kept = frozenset(persisted) | {i for i, f in fates.items() if f != "lost" and i in loose}
        c = _Candidate(crash_point, "chosen", self.covered(crash_point) | kept, fates, "chosen")
        flat = self._build(c.persisted, c.fates)
        return self._run(c, flat, checker or check_invariants)

    def explore(
        self,
        checker: Checker | None = None,
        *,
        models: Sequence[str] = MODELS,
        samples: int = 16,
        seed: int = 0,
        keep_going: bool = False,
    ) -> Report:
        """Run ``checker`` on every distinct crash state of ``models``; stop at the first
        rejected one unless ``keep_going``."""
        checker = checker or check_invariants
        # A crash state is checked once per (tree, open-handle context, is-the-end): a
        # checker may demand more of the end (the after-state: what returned is durable),
        # so a tree already accepted mid-way must still be checked at the end.
        seen: set[tuple[bytes, tuple[tuple[int, int], ...], bool]] = set()
        end = len(self.ops)
        by_model: dict[str, int] = dict.fromkeys(models, 0)
        failures: list[Failure] = []
        generated = 0
        context_at: dict[int, tuple[tuple[int, int], ...]] = {}
        for c in self.candidates(models, samples=samples, seed=seed):
            generated += 1
            flat = self._build(c.persisted, c.fates)
            ctx = context_at.get(c.crash_point)
            if ctx is None:
                ctx = context_at[c.crash_point] = self._context(c.crash_point)
            digest = hashlib.blake2b(repr(flat).encode(), digest_size=16).digest()
            key = (digest, ctx, c.crash_point == end)
            if key in seen:
                continue
            seen.add(key)
            by_model[c.model] += 1
            failure = self._run(c, flat, checker)
            if failure is not None:
                failures.append(failure)
                if not keep_going:
                    break
        return Report(self.ops, generated, len(seen), by_model, tuple(failures))


def _default_workdir() -> str | None:
    """A RAM-backed directory where there is one: each crash state is rebuilt on disk,
    and tmpfs creates and removes small trees about ten times faster than a disk."""
    shm = "/dev/shm"
    if sys.platform.startswith("linux") and os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


@contextlib.contextmanager
def _replacing(mode: Replace) -> Iterator[None]:
    """Make the syscall module's ``rename_exchange`` behave as ``mode`` says, for a recording."""
    if mode == "exchange":
        yield
        return
    hooked = _fs.rename_exchange

    def unsupported(a: Path, b: Path) -> None:
        raise OSError(errno.ENOSYS, "RENAME_EXCHANGE switched off by atomic_ckpt.testing", str(a))

    def delete_then_rename(a: Path, b: Path) -> None:
        _fs.remove_tree(b)
        _fs.rename(a, b)

    _fs.rename_exchange = unsupported if mode == "aside" else delete_then_rename
    try:
        yield
    finally:
        _fs.rename_exchange = hooked


@contextlib.contextmanager
def record(
    save: Callable[[CheckpointDir], object],
    *,
    setup: Callable[[CheckpointDir], object] | None = None,
    sync: SyncPolicy | None = None,
    replace: Replace = "exchange",
    prefix: str = "",
    checksum: str | None = "crc32",
    workdir: str | os.PathLike[str] | None = None,
) -> Iterator[Recording]:
    """Run ``save`` on a scratch checkpoint root and record what it does to the filesystem.

    ``setup`` runs first, unrecorded: what it leaves is the durable starting
    state (earlier checkpoints, a legacy directory to adopt). ``sync`` replaces
    the durability steps (the mutation tests switch single steps off, see
    :func:`~atomic_ckpt.testing.mutant`); ``replace`` chooses how an existing
    step is replaced. The scratch directory is made in ``workdir`` (default:
    ``/dev/shm`` where writable, else the system temp dir) and removed
    afterwards. Yields a :class:`Recording`.
    """
    where = workdir if workdir is not None else _default_workdir()
    scratch = Path(tempfile.mkdtemp(prefix="atomic_ckpt-crash-", dir=where)).resolve()
    policy = sync if sync is not None else SyncPolicy()
    try:
        universe = scratch / "fs"
        universe.mkdir()
        # One worker: the tree is fsynced inline, in a reproducible order.
        ckpts = CheckpointDir(
            universe / _ROOT_NAME, prefix=prefix, checksum=checksum, workers=1, sync=policy
        )
        if setup is not None:
            setup(ckpts)
        recorder = _Recorder(universe, ckpts.root, prefix)
        with recorder.hooked(), _replacing(replace):
            save(ckpts)
        recorder.observe()
        yield Recording(recorder, scratch, prefix=prefix, sync=policy, replace=replace)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def explore(
    save: Callable[[CheckpointDir], object],
    checker: Checker | None = None,
    *,
    setup: Callable[[CheckpointDir], object] | None = None,
    models: Sequence[str] = MODELS,
    samples: int = 16,
    seed: int = 0,
    keep_going: bool = False,
    sync: SyncPolicy | None = None,
    replace: Replace = "exchange",
    prefix: str = "",
    checksum: str | None = "crc32",
    workdir: str | os.PathLike[str] | None = None,
) -> Report:
    """Record ``save`` once, then check every crash state it allows; return a :class:`Report`.

    ``save`` gets a :class:`~atomic_ckpt.CheckpointDir` on a scratch root and
    commits through it (``with ckpts.commit(step) as path: ...``).
    ``checker`` (default :func:`check_invariants`) gets each :class:`CrashState`
    and raises ``AssertionError`` to reject it. ``samples`` bounds the random
    subsets tried per crash point (the ``subset`` model) and the random per-file
    data fates (``ext4``); ``seed`` makes them reproducible.
    """
    with record(
        save,
        setup=setup,
        sync=sync,
        replace=replace,
        prefix=prefix,
        checksum=checksum,
        workdir=workdir,
    ) as rec:
        return rec.explore(
            checker, models=models, samples=samples, seed=seed, keep_going=keep_going
        )
