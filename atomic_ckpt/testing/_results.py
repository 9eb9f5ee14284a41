"""The simulator's data types: recorded operations, crash states, and what a check found."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

from atomic_ckpt import CheckpointDir, SyncPolicy
from atomic_ckpt.testing._sparse import Data
from atomic_ckpt.testing._writes import Write

Model: TypeAlias = Literal["strict", "ext4", "subset"]
MODELS: tuple[Model, ...] = ("strict", "ext4", "subset")
"""Every crash model, in the order :func:`explore` tries them at each crash point."""

AuditModel: TypeAlias = Literal["kill", "power"]
AUDIT_MODELS: tuple[AuditModel, ...] = ("kill", "power")
"""The models of :func:`~atomic_ckpt.testing.audit`, the same state model seen as a user
sees it: ``kill`` (a process crash: every completed operation is there, the last write
possibly half done) and ``power`` (a power loss: ``strict``, and names kept as at the
crash with unsynced data empty, zero-filled or torn, the ext4 ``data=ordered`` window)."""

ALL_INODES = -1
"""The inode of a ``sync`` op that makes everything durable (``sync()``, ``syncfs()``)."""

DataFate: TypeAlias = Literal["lost", "kept", "zero", "torn"]
"""What a crash does to data written but not fsynced: dropped, kept, zero-filled
at full length, or truncated to half its length."""


class InvariantViolation(AssertionError):
    """A crash state breaks one of the invariants of PROTOCOL.md (``I1`` to ``I4``)."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.detail = message


@dataclass(frozen=True)
class Tree:
    """What one checkpoint directory holds, its marker aside."""

    files: Mapping[str, bytes]
    dirs: frozenset[str]
    links: Mapping[str, str]

    def summary(self) -> str:
        parts = [f"{p} ({len(b)} bytes)" for p, b in sorted(self.files.items())]
        parts += [f"{d}/" for d in sorted(self.dirs)]
        parts += [f"{p} -> {t}" for p, t in sorted(self.links.items())]
        return ", ".join(parts) or "(empty)"


@dataclass(frozen=True)
class Version:
    """The contents one save (or the initial state) gave a step."""

    step: int
    label: str
    """``initial``, ``commit #i`` or ``mark_complete #i`` (i counts the recorded saves)."""
    tree: Tree
    marker: bytes | None
    """The marker's bytes (empty: legacy), or None when unknown (the save raised)."""

    def matches(self, tree: Tree, marker: bytes | None) -> bool:
        return self.tree == tree and (self.marker is None or self.marker == marker)


@dataclass(frozen=True)
class Expectation:
    """What a step may show at one crash point."""

    step: int
    allowed: tuple[Version, ...]
    """The contents it may hold: the last save that returned (or the initial
    contents) and every save of it in flight."""
    stale: tuple[Version, ...]
    """Older saves: showing one of these loses a commit that returned (I2)."""
    required: bool
    """A save of it returned (or it was complete at the start) and no deletion began."""
    replacing: bool
    """A save that replaces a required version is in flight."""


@dataclass(frozen=True)
class CrashState:
    """One state a crash could leave, rebuilt on disk for a checker."""

    root: Path
    """The rebuilt checkpoint root (it may be missing: a crash can lose it)."""
    prefix: str
    sync: SyncPolicy
    """The durability steps the recorded commits performed."""
    model: str
    crash_point: int
    """How many recorded operations ran before the crash."""
    expected: Mapping[int, Expectation]
    description: str
    moved_aside: bool = False
    """The move-aside replace ran (RENAME_EXCHANGE unsupported, or ``replace="aside"``):
    its one documented window may hide a step until ``clean()``."""

    def checkpoints(self) -> CheckpointDir:
        """A non-durable CheckpointDir on the rebuilt root (checks never need fsync), hashing
        inline (one worker: a crash state's files are few and small, a thread per file costs
        more than hashing them)."""
        return CheckpointDir(self.root, prefix=self.prefix, durable=False, workers=1)


Checker: TypeAlias = Callable[[CrashState], object]
"""Raises (``AssertionError``, or anything) to reject a crash state."""


@dataclass(frozen=True)
class Op:
    """One recorded filesystem operation."""

    index: int
    kind: Literal["entry", "data", "sync"]
    """``entry``: directory entries change (create, mkdir, rename, unlink);
    ``data``: a file's contents change; ``sync``: an fsync."""
    inode: int
    """The directory (entry), file (data) or fsynced inode (sync)."""
    description: str
    effects: tuple[tuple[str, int | None], ...] = ()
    """entry ops: (name, inode or None for removed), applied atomically."""
    data: Data = b""
    by: Literal["library", "observed", "traced"] = "library"
    """``library``: a hooked call into ``atomic_ckpt._core.l2_syscalls.fs``; ``observed``: found by
    comparing the tree with the model (the save function's writes, ``mkdir``);
    ``traced``: a system call of an audited process (``atomic_ckpt.testing.audit``)."""
    torn: Data | None = None
    """data ops: the contents half-way through the writes this op stands for (None:
    the first half of ``data``, as when a new file is written in one go)."""
    writes: tuple[Write, ...] | None = None
    """Traced data ops: the writes this op stands for (:mod:`._writes`), applied to the
    file as a crash state has it; None: ``data`` is the file's contents whatever came
    before (the library's hooks)."""
    covers: int | None = None
    """sync ops: only the operations before this index are made durable (those that
    completed before the fsync began; one completing while it ran is not covered); None:
    every earlier one."""
    began: int | None = None
    """Traced ops whose call began before earlier ops completed: how many ops had completed
    when it began (a crash after any of the later ones may find it half done); None: it
    began after every earlier op completed."""
    commits: bool = True
    """sync ops: whether it commits the ext4 journal (every earlier name kept); False: one
    ext4 completes without a commit (an fdatasync after in-place overwrites only, an fsync
    of a file nothing changed since the last commit)."""


@dataclass(frozen=True)
class Failure:
    """A crash state the checker rejected."""

    model: str
    crash_point: int
    invariant: str | None
    """``I1``..``I4`` for an :class:`InvariantViolation`, else None."""
    message: str
    description: str

    def __str__(self) -> str:
        return f"{self.message}\n{self.description}"


@dataclass(frozen=True)
class Report:
    """The outcome of :func:`explore`."""

    ops: tuple[Op, ...]
    states_generated: int
    """Crash states generated, duplicates included."""
    states_checked: int
    """Distinct crash states the checker ran on (distinct tree and expectations)."""
    checked_by_model: Mapping[str, int]
    failures: tuple[Failure, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failure(self) -> Failure | None:
        """The first rejected state (earliest crash point), or None."""
        return self.failures[0] if self.failures else None

    def __str__(self) -> str:
        head = (
            f"{len(self.ops)} operations recorded, {self.states_checked} distinct crash "
            f"states checked ({self.states_generated} generated)"
        )
        if self.ok:
            return head + ": all passed"
        return f"{head}: {len(self.failures)} rejected; the first:\n{self.failures[0]}"
