"""The crash states a recording allows: which operations each crash model (strict, ext4,
subset; and the audit's kill and power) lets survive at each crash point, the tree that
results, and what each step may hold there.

One model, two recorders: :class:`_CrashModel` knows only operations on inodes, so the
library's own hooks (:mod:`._recorder`) and a system-call trace of any process
(:mod:`.audit`) feed the same crash states."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from atomic_ckpt.testing._mirror import _UNIVERSE, _Inode
from atomic_ckpt.testing._recorder import _Recorder, _Save
from atomic_ckpt.testing._results import (
    ALL_INODES,
    AUDIT_MODELS,
    MODELS,
    DataFate,
    Expectation,
    Op,
    Version,
)
from atomic_ckpt.testing._sparse import Data, prefix, text, write_to, zeros
from atomic_ckpt.testing._writes import WriteFates, replay


@dataclass(frozen=True)
class _Candidate:
    crash_point: int
    model: str
    persisted: frozenset[int]
    fates: Mapping[int, DataFate]
    note: str
    writes: Mapping[int, WriteFates] = field(default_factory=dict)
    """Traced data ops whose writes each have their own fate (in place of ``fates``)."""


_Flat: TypeAlias = tuple[tuple[str, str, Data], ...]

FULL_WRITES = 8
"""The separate writes of one traced run whose own fates are built in full (of a longer
run: the first and the last half as many); the random mixes draw from all of them."""


def _picked(n: int) -> list[int]:
    half = FULL_WRITES // 2
    return list(range(n)) if n <= FULL_WRITES else [*range(half), *range(n - half, n)]


def _prefixes(n: int) -> list[int]:
    """How many of a run's ``n`` separate writes a crash between two of them has done."""
    return [p for p in _picked(n + 1) if 0 < p < n]


def _per_write(n: int) -> Iterator[tuple[WriteFates, str]]:
    """One run of ``n`` separate writes: each alone lost, zero-filled or torn (the rest
    kept), each the only one kept, and each prefix kept with the rest lost."""
    for w in _picked(n):
        for f in ("lost", "zero", "torn"):
            yield tuple(f if v == w else "kept" for v in range(n)), f"write {w + 1} {f} (of {n})"
        yield tuple("kept" if v == w else "lost" for v in range(n)), f"only write {w + 1} kept"
    for p in _prefixes(n):
        yield ("kept",) * p + ("lost",) * (n - p), f"writes after the first {p} of {n} lost"


class _CrashModel:
    """The operations of a recorded run on a tree of inodes, and the crash states they
    allow: what each model lets survive at each crash point, and the tree that results."""

    def __init__(self, ops: Sequence[Op], inodes: Sequence[_Inode]) -> None:
        self.ops: tuple[Op, ...] = tuple(ops)
        self._inodes = inodes
        # For each op: the index of the first later fsync of its inode (or of everything).
        never = len(self.ops) + 1
        self._next_sync = [never] * len(self.ops)
        pending: dict[int, list[int]] = {}
        for op in self.ops:
            if op.kind == "sync":
                synced = list(pending) if op.inode == ALL_INODES else [op.inode]
                bound = op.index if op.covers is None else op.covers
                for inode in synced:
                    waiting = pending.pop(inode, [])
                    for i in waiting:
                        if i < bound:
                            self._next_sync[i] = op.index
                    later = [i for i in waiting if i >= bound]  # completed while it ran
                    if later:
                        pending[inode] = later
            else:
                pending.setdefault(op.inode, []).append(op.index)
        # For each traced data op: its file's contents just before it, when every earlier
        # op was kept (a state where they were, the op's own snapshots stand for it)
        last = {i: n.base_data for i, n in enumerate(inodes)}
        self._prior: dict[int, Data] = {}
        for op in self.ops:
            if op.kind == "data":
                self._prior[op.index] = last[op.inode]
                last[op.inode] = op.data
        self._replayed: dict[tuple[int, object, int], tuple[Data, Data]] = {}

    def _journal_bound(self, k: int) -> int:
        """The ops before the last fsync among the first ``k`` began (an fsync commits the
        journal with every earlier name; one made while it ran may miss that commit)."""
        return max(
            (
                op.index if op.covers is None else op.covers
                for op in self.ops[:k]
                if op.kind == "sync" and op.commits
            ),
            default=-1,
        )

    def covered(self, k: int) -> frozenset[int]:
        """Operations among the first ``k`` that an fsync among them made durable."""
        return frozenset(
            op.index for op in self.ops[:k] if op.kind != "sync" and self._next_sync[op.index] < k
        )

    def uncovered(self, k: int) -> tuple[int, ...]:
        """Operations among the first ``k`` that a crash after them may or may not keep,
        and the later ones in progress then (:meth:`in_flight`)."""
        return tuple(
            op.index for op in self.ops[:k] if op.kind != "sync" and self._next_sync[op.index] >= k
        ) + self.in_flight(k)

    def in_flight(self, k: int) -> tuple[int, ...]:
        """Traced operations after the first ``k`` whose call had begun by then (another
        thread's long write while this thread's rename completed): a crash at ``k`` may
        find them done, or a write half done."""
        return tuple(
            op.index
            for op in self.ops[k + 1 :]
            if op.began is not None and op.began <= k and op.kind != "sync"
        )

    def _data(self, op: Op, base: Data, fate: DataFate | WriteFates) -> Data:
        """What data op ``op`` leaves in a file holding ``base``, with ``fate``. A traced
        op zero-filled reads as zeros over the ranges it wrote only: what the file held
        before (an fsynced record an append follows) is not zeroed with it."""
        if fate == "zero" and op.writes is not None:
            fate = ("zero",) * len(op.writes)
        if op.writes is None or (base is self._prior[op.index] and isinstance(fate, str)):
            if fate == "zero":
                return zeros(len(op.data))
            if fate == "torn":
                return op.torn if op.torn is not None else prefix(op.data, len(op.data) // 2)
            return op.data
        key = (op.index, fate, id(base))
        known = self._replayed.get(key)
        if known is None or known[0] is not base:  # the base held: its id stays its own
            known = self._replayed[key] = (base, replay(base, op.writes, op.data, fate))
        return known[1]

    def _build(
        self,
        persisted: Collection[int],
        fates: Mapping[int, DataFate],
        writes: Mapping[int, WriteFates] | None = None,
    ) -> _Flat:
        entries = {i: dict(n.base_entries) for i, n in enumerate(self._inodes) if n.kind == "dir"}
        data = {i: n.base_data for i, n in enumerate(self._inodes) if n.kind != "dir"}
        for i in sorted(persisted):
            op = self.ops[i]
            if op.kind == "entry":
                d = entries[op.inode]
                for name, child in op.effects:
                    if child is None:
                        d.pop(name, None)
                    else:
                        d[name] = child
            elif op.kind == "data":
                fate: DataFate | WriteFates = fates.get(i, "kept")
                if writes and i in writes:
                    fate = writes[i]
                if fate != "lost":
                    data[op.inode] = self._data(op, data[op.inode], fate)
        flat: list[tuple[str, str, Data]] = []
        seen: set[int] = set()

        def walk(ino: int, rel: str) -> None:
            for name in sorted(entries[ino]):
                child = entries[ino][name]
                kind = self._inodes[child].kind
                if kind == "dir":  # a directory hangs in one place only (a file may
                    if child in seen:  # have several names: hard links)
                        continue
                    seen.add(child)
                path = f"{rel}{name}"
                if kind == "dir":
                    flat.append((path, "dir", b""))
                    walk(child, path + "/")
                else:
                    flat.append((path, kind, data[child]))

        walk(_UNIVERSE, "")
        return tuple(flat)

    # ---- the crash models

    def candidates(
        self, models: Sequence[str] = MODELS, *, samples: int = 16, seed: int = 0
    ) -> Iterator[_Candidate]:
        """Every crash state of the models, crash point by crash point."""
        unknown = set(models) - set(MODELS) - set(AUDIT_MODELS)
        if unknown:
            raise ValueError(
                f"unknown crash models {sorted(unknown)}; choose from {MODELS + AUDIT_MODELS}"
            )
        rng = random.Random(seed)
        for k in range(len(self.ops) + 1):
            covered = self.covered(k)
            loose = self.uncovered(k)
            for model in models:
                if model == "strict":
                    yield _Candidate(k, "strict", covered, {}, "everything not fsynced lost")
                elif model == "ext4":
                    yield from self._ext4(k, covered, loose, rng, samples)
                elif model == "subset":
                    yield from self._subset(k, covered, loose, rng, samples)
                elif model == "kill":
                    yield from self._kill(k)
                else:  # its own draws per crash point: what is sampled at k does not
                    # shift with the operations before it (a different interleaving of a
                    # workload's threads elsewhere leaves k's states as they were)
                    own = random.Random(f"{seed}:{k}")
                    yield from self._power(k, covered, loose, own, samples)

    def _kill(self, k: int) -> Iterator[_Candidate]:
        """A process crash: the page cache survives, so every completed operation is
        there; the last one, if it writes data, may have been cut half-way."""
        done = frozenset(range(k))
        yield _Candidate(k, "kill", done, {}, "process killed: every completed operation kept")
        if k and self.ops[k - 1].kind == "data":
            yield _Candidate(k, "kill", done, {k - 1: "torn"}, "process killed mid-write")
            n = len(self.ops[k - 1].writes or ())
            for p in _prefixes(n):  # between two separate writes of the run
                said = f"process killed after write {p} of {n} of the last operation"
                per = ("kept",) * p + ("lost",) * (n - p)
                yield _Candidate(k, "kill", done, {}, said, {k - 1: per})
        for j in self.in_flight(k):  # begun before the crash, done after it (audit5 11)
            said = f"process killed while #{j + 1} (begun earlier) was in progress"
            yield _Candidate(k, "kill", done | {j}, {}, said + ", done")
            if self.ops[j].kind == "data":
                yield _Candidate(k, "kill", done | {j}, {j: "torn"}, said + ", half done")

    def _power(
        self,
        k: int,
        covered: frozenset[int],
        loose: tuple[int, ...],
        rng: random.Random,
        samples: int,
    ) -> Iterator[_Candidate]:
        """A power loss: ``strict`` (only what was fsynced), then the names the journal
        kept (as in ``ext4``: every one before the last fsync, a prefix of the rest) with
        each unsynced write's own fate (lost: empty or its last durable contents, kept,
        zero-filled, torn), independent of the others': every write sharing one fate,
        every write but one kept (the one lost, zeroed or torn), one kept and the rest
        lost; within one traced run of separate writes (a seek, an overlap), each write's
        own fate (:func:`_per_write`, the other files kept); and ``samples`` random mixes
        drawn from ``rng`` (the audit's seed), a run's writes mixed too."""
        yield _Candidate(k, "power", covered, {}, "power loss: only what was fsynced survives")
        last_sync = self._journal_bound(k)
        journaled = {i for i in loose if self.ops[i].kind == "entry" and i < last_sync}
        tail = [i for i in loose if self.ops[i].kind == "entry" and i >= last_sync]
        unsynced = [i for i in loose if self.ops[i].kind == "data"]
        fates: tuple[DataFate, ...] = ("lost", "kept", "zero", "torn")
        runs = {i: len(self.ops[i].writes or ()) for i in unsynced}
        multi = {i: n for i, n in runs.items() if n > 1}
        for j in range(len(tail) + 1):
            meta = covered | journaled | set(tail[:j])
            names = (
                "names kept as at the crash"
                if j == len(tail)
                else f"names lost from #{tail[j] + 1}"
            )
            mixes: list[tuple[dict[int, DataFate], dict[int, WriteFates], str]] = [
                (dict.fromkeys(unsynced, f), {}, f"unsynced data all {f}") for f in fates
            ]
            kept: dict[int, DataFate] = dict.fromkeys(unsynced, "kept")
            if j == len(tail) and len(unsynced) > 1:  # one file's fate against the rest's
                for i in unsynced:
                    only: dict[int, DataFate] = {**dict.fromkeys(unsynced, "lost"), i: "kept"}
                    mixes.append((only, {}, f"only #{i + 1}'s data kept"))
                    for f in ("lost", "zero", "torn"):
                        mixes.append(({**kept, i: f}, {}, f"#{i + 1}'s data {f}, the rest kept"))
            if j == len(tail):  # one run's writes each their own fate, the rest kept
                for i, n in multi.items():
                    for per, said in _per_write(n):
                        mixes.append((kept, {i: per}, f"#{i + 1}'s {said}, the rest kept"))
            if len(unsynced) > 1 or multi:
                for _ in range(samples if j == len(tail) else max(1, samples // 4)):
                    mix: dict[int, DataFate] = {i: rng.choice(fates) for i in unsynced}
                    each: dict[int, WriteFates] = {
                        i: tuple(rng.choice(fates) for _ in range(n))
                        for i, n in multi.items()
                        if rng.random() < 0.5
                    }
                    mixes.append((mix, each, "unsynced data fates mixed at random"))
            for mix, each, said in mixes:
                persisted = frozenset(meta | {i for i in unsynced if mix[i] != "lost" or i in each})
                yield _Candidate(k, "power", persisted, mix, f"power loss, {names}, {said}", each)

    def _ext4(
        self,
        k: int,
        covered: frozenset[int],
        loose: tuple[int, ...],
        rng: random.Random,
        samples: int,
    ) -> Iterator[_Candidate]:
        last_sync = self._journal_bound(k)
        journaled = {i for i in loose if self.ops[i].kind == "entry" and i < last_sync}
        tail = [i for i in loose if self.ops[i].kind == "entry" and i >= last_sync]
        unsynced = [i for i in loose if self.ops[i].kind == "data"]
        fates_all: list[DataFate] = ["lost", "kept", "zero", "torn"]
        for j in range(len(tail) + 1):
            meta = covered | journaled | set(tail[:j])
            kept = (
                f"journal kept metadata ops before #{tail[j]}"
                if j < len(tail)
                else ("journal kept every metadata op")
            )
            choices: list[dict[int, DataFate]] = [dict.fromkeys(unsynced, f) for f in fates_all]
            if len(unsynced) > 1:
                choices += [
                    {i: rng.choice(fates_all) for i in unsynced}
                    for _ in range(max(1, samples // 4))
                ]
            for fates in choices:
                persisted = frozenset(meta | {i for i in unsynced if fates[i] != "lost"})
                yield _Candidate(k, "ext4", persisted, fates, kept)

    def _subset(
        self,
        k: int,
        covered: frozenset[int],
        loose: tuple[int, ...],
        rng: random.Random,
        samples: int,
    ) -> Iterator[_Candidate]:
        if not loose:
            return
        picks: list[frozenset[int]] = [frozenset(loose)]
        picks += [frozenset({i}) for i in loose]
        picks += [frozenset(loose) - {i} for i in loose]
        picks += [frozenset(i for i in loose if rng.random() < 0.5) for _ in range(samples)]
        for pick in picks:
            yield _Candidate(k, "subset", covered | pick, {}, "a subset of unsynced ops kept")


class _CrashStates(_CrashModel):
    """The crash model of a run recorded through the library's hooks, with what each
    step may hold at each crash point (the saves the hooks saw start and return)."""

    def __init__(self, recorder: _Recorder, scratch: Path) -> None:
        super().__init__(recorder.ops, recorder.inodes)
        self._rec = recorder
        self._scratch = scratch
        self._root_rel = recorder.rel(recorder.root) or ""

    def expectations(self, k: int) -> dict[int, Expectation]:
        """What each step may show after a crash that lets the first ``k`` operations run."""
        steps = set(self._rec.initial)
        for s in self._rec.saves:
            steps.update(s.steps)
        out: dict[int, Expectation] = {}
        for step in sorted(steps):
            initial = self._rec.initial.get(step)
            current: list[Version] = [initial] if initial is not None else []
            every: list[Version] = list(current)
            required = initial is not None
            replacing = False
            for i, s in enumerate(self._rec.saves):
                if step not in s.steps or s.start > k:
                    continue
                if s.kind == "delete":
                    required = False
                    continue
                assert s.tree is not None or s.kind == "mark_complete"
                if s.tree is None:
                    continue
                v = Version(step, f"{s.kind} #{i}", s.tree, s.marker)
                every.append(v)
                if s.end is not None and s.end <= k:
                    current, required, replacing = [v], True, False
                else:
                    replacing = replacing or required
                    current.append(v)
            stale = tuple(v for v in every if all(v is not c for c in current))
            out[step] = Expectation(step, tuple(current), stale, required, replacing)
        return out

    def _context(self, k: int) -> tuple[tuple[int, int], ...]:
        def status(s: _Save) -> int:
            if s.start > k:
                return 0
            return 2 if s.end is not None and s.end <= k else 1

        return tuple((i, status(s)) for i, s in enumerate(self._rec.saves))

    def _materialize(self, flat: _Flat) -> Path:
        top = self._scratch / "state"
        if top.exists():
            shutil.rmtree(top)
        top.mkdir()
        for path, kind, payload in flat:
            target = top / path
            if kind == "dir":
                target.mkdir()
            elif kind == "symlink":
                os.symlink(text(payload), target)
            else:
                with open(target, "wb") as f:
                    write_to(f, payload)
        return top / self._root_rel
