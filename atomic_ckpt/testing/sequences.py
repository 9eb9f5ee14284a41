"""The sequence explorer: run a sequence of actions against the reference model, record its
last action once, and check every ``kill`` and ``power`` crash state of it.

The actions before the last one run unrecorded (the durable starting state, as in
CrashMonkey's ACE: their own crash states are those of shorter sequences). Each one's
outcome is compared with the model live (the exception it must raise, the state it must
leave, no temporary name left beside the checkpoints); then every crash state of the
last action must be, for each entry, the model before it or after it (steps and named
checkpoints it changes move together unless it is ``multi``; an action with a ``midway``
phase shows its second phase only once its first is there), with no alias naming a
save it does not belong to; every complete step verifies (and ``checkpoints()`` and
``steps()`` ascend); ``clean()`` changes nothing observable and ``clean(force=True)`` then
leaves no leftovers; and ``latest()`` is the highest complete step (a resume never starts
fresh over something usable). A crash after the action's last operation must show the
model after it: what returned is durable.
"""

from __future__ import annotations

import itertools
import os
import random
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atomic_ckpt import TMP_INFIX, CheckpointDir
from atomic_ckpt._core.l1_names.names import TAG_STAGING, parse_tmp
from atomic_ckpt.testing._crash import _quiet, record
from atomic_ckpt.testing._results import CrashState
from atomic_ckpt.testing.actions import Action
from atomic_ckpt.testing.alphabet import ALPHABET, LEFTOVER_ACTIONS, LEFTOVERS, ROOTS, Root, by_name
from atomic_ckpt.testing.model import Observation, Refused, RootModel, observe

__all__ = [
    "PAIRS",
    "TRIPLES",
    "Outcome",
    "Totals",
    "check_sequence",
    "default_run",
    "explore_sequences",
    "leftover_sequences",
    "sequences",
]

PAIRS = 300
"""How many seq-2 sequences the default run samples (``seed`` 2)."""
TRIPLES = 3000
"""How many seq-3 sequences the soak samples (``seed`` 3), after every seq-2."""


@dataclass
class Outcome:
    """What checking one sequence found."""

    root: str
    actions: tuple[str, ...]
    operations: int = 0
    states_generated: int = 0
    states_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.root}: {' ; '.join(self.actions)}"
        return head + ("" if self.ok else "\n  " + "\n  ".join(self.problems))


def _expect(model: RootModel, action: Action) -> tuple[RootModel, Refused | None]:
    after = model.copy()
    try:
        action.apply(after)
    except Refused as refused:
        return model, refused
    return after, None


def _live(
    ckpts: CheckpointDir, action: Action, after: RootModel, refused: Refused | None
) -> list[str]:
    """Run ``action`` for real: did it raise what the model says (saying what it must),
    and leave its state?"""
    problems: list[str] = []
    before = _leftovers(ckpts.root)
    expected = refused.expected if refused is not None else None
    try:
        action.run(ckpts)
    except Exception as exc:
        if expected is None or not isinstance(exc, expected):
            want = expected.__name__ if expected else "success"
            problems.append(f"{action.name}: raised {exc!r}, the model says {want}")
        elif refused is not None and refused.says and refused.says not in str(exc):
            problems.append(f"{action.name}: raised {exc!r}, not saying {refused.says!r}")
    else:
        if expected is not None:
            problems.append(f"{action.name}: returned, the model says {expected.__name__}")
    left = sorted(set(_leftovers(ckpts.root)) - set(before))
    if left:  # PROTOCOL.md: once it returns (or raises), nothing of it is left beside
        problems.append(f"{action.name}: left {left} beside the checkpoints")
    try:
        with _quiet():
            seen = observe(ckpts.root, prefix=ckpts.prefix)
    except AssertionError as exc:
        return [*problems, f"{action.name}: {exc}"]
    want_obs = after.observation()
    if seen != want_obs:
        problems.append(f"{action.name}: left {_diff(seen, want_obs)}")
    return problems


def _leftovers(root: Path) -> list[str]:
    """The temporary names (``.tmp-``) in ``root``: staging dirs, old copies, lock files."""
    return [n for n in os.listdir(root) if TMP_INFIX in n] if root.is_dir() else []


def _diff(seen: Observation, want: Observation) -> str:
    keys = sorted(set(seen) | set(want))
    return "; ".join(
        f"{k}: {_short(seen.get(k))} (model: {_short(want.get(k))})"
        for k in keys
        if seen.get(k) != want.get(k)
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) < 120 else text[:117] + "..."


def _judge(
    obs: Observation,
    before: Observation,
    after: Observation,
    action: Action,
    midway: Observation | None = None,
) -> None:
    """Reject ``obs`` unless each entry is before or after (or as after the action's
    ``midway`` phase); see the module docstring."""
    mid = midway if midway is not None else before
    for key in sorted(set(obs) | set(before) | set(after) | set(mid)):
        if obs.get(key) not in (before.get(key), after.get(key), mid.get(key)):
            raise AssertionError(
                f"{key} is {_short(obs.get(key))}: neither before ({_short(before.get(key))}) "
                f"nor after ({_short(after.get(key))})"
                + (f" nor midway ({_short(mid.get(key))})" if midway is not None else "")
            )
    if midway is not None:  # the first phase is durable before the second shows at all
        second = [
            k
            for k in set(mid) | set(after)
            if obs.get(k) == after.get(k) not in (mid.get(k), before.get(k))
        ]
        first = [k for k in set(before) | set(mid) if before.get(k) != mid.get(k)]
        behind = [k for k in first if obs.get(k) not in (mid.get(k), after.get(k))]
        if second and behind:
            raise AssertionError(
                f"{sorted(second)} show {action.name}'s second phase while {sorted(behind)} "
                "are still as before its first"
            )
    changed = [
        k
        for k in set(before) | set(after)
        if k.split(":")[0] in ("step", "named", "legacy") and before.get(k) != after.get(k)
    ]
    if not action.multi:
        main = [k for k in changed if k not in action.lingers]
        sides = {obs.get(k) == after.get(k) for k in main}
        if len(sides) > 1:
            raise AssertionError(f"half the action shows: {sorted(changed)} mix before and after")
        early = [k for k in changed if k in action.lingers and obs.get(k) == after.get(k)]
        if early and sides == {False}:
            raise AssertionError(f"{early} changed before the rest of {action.name}")
    for key, target in obs.items():
        if not key.startswith("alias:") or not isinstance(target, tuple):
            continue
        tkey = f"{target[0]}:{target[1]}"
        if before.get(tkey) == after.get(tkey):
            continue
        if target == before.get(key) != after.get(key) and obs.get(tkey) == after.get(tkey):
            raise AssertionError(f"{key} (of the older save) names {tkey}'s new save")
        if target == after.get(key) != before.get(key) and obs.get(tkey) != after.get(tkey):
            raise AssertionError(f"{key} names {tkey} before its new save is there")


def check_sequence(
    root: Root,
    actions: Sequence[Action],
    *,
    models: Sequence[str] = ("kill", "power"),
    crashes: bool = True,
) -> Outcome:
    """Check one sequence from ``root``: live against the model, then every crash state of
    its last action (``crashes=False``: live only)."""
    outcome = Outcome(root.name, tuple(a.name for a in actions))
    model = RootModel(prefix=root.prefix)
    for a in root.setup:
        a.apply(model)
    plan: list[tuple[Action, RootModel, Refused | None]] = []
    for a in actions:
        after, expected = _expect(model, a)
        plan.append((a, after, expected))
        model = after
    before = plan[-2][1] if len(plan) > 1 else _start(root)
    last, after, expected = plan[-1]

    def setup(ckpts: CheckpointDir) -> None:
        ckpts.root.mkdir(parents=True, exist_ok=True)
        for a in root.setup:
            a.run(ckpts)
        for a, after_a, expected_a in plan[:-1]:
            outcome.problems.extend(_live(ckpts, a, after_a, expected_a))

    def save(ckpts: CheckpointDir) -> None:
        outcome.problems.extend(_live(ckpts, last, after, expected))

    with record(save, setup=setup, prefix=root.prefix) as rec:
        outcome.operations = len(rec.ops)
        if not crashes or not last.crash or outcome.problems:
            return outcome
        b, a_obs = before.observation(), after.observation()
        m_obs: Observation | None = None
        if last.midway is not None and expected is None:
            mid = before.copy()
            last.midway(mid)
            m_obs = mid.observation()
        end = len(rec.ops)

        seen: dict[object, Observation] = {}

        def checker(state: CrashState) -> None:
            prefix = state.prefix
            tree = snapshot(state.root)
            # Crash states that differ only inside a staging directory (a commit's writes)
            # look the same through the API: the root is observed once for all of them.
            key = (_beside(state.root), _outside_staging(state.root, tree))
            obs = seen.get(key)
            if obs is None:
                obs = seen[key] = observe(state.root, prefix=prefix)
            if state.crash_point == end and obs != a_obs:
                raise AssertionError(f"after {last.name} returned: {_diff(obs, a_obs)}")
            _judge(obs, b, a_obs, last, m_obs)
            ckpts = state.checkpoints()
            if state.root.is_dir():
                ckpts.clean()
                # A clean() that changed nothing on disk changed nothing observable: the
                # root is observed again only when it removed or restored something.
                if snapshot(state.root) != tree:
                    cleaned = observe(state.root, prefix=prefix)
                    if cleaned != obs:
                        raise AssertionError(f"clean() changed the state: {_diff(cleaned, obs)}")
                ckpts.clean(force=True)
                left = [n for n in os.listdir(state.root) if TMP_INFIX in n or "tmp-" in n]
                if left:
                    raise AssertionError(f"clean(force=True) left {left}")
            steps = [int(k[5:]) for k in obs if k.startswith("step:")]
            latest = ckpts.latest()
            if (latest.step if latest else None) != max(steps, default=None):
                raise AssertionError(f"latest() is {latest}, complete steps {sorted(steps)}")

        report = rec.explore(checker, models=models)
    outcome.states_generated = report.states_generated
    outcome.states_checked = report.states_checked
    if report.failure is not None:
        outcome.problems.append(str(report.failure))
    return outcome


def snapshot(top: Path) -> list[tuple[str, int, bytes]]:
    """Every entry under ``top``: its path, its type bits and its bytes (a file's data, a
    link's target); cheap next to :func:`~atomic_ckpt.testing.model.observe`."""
    out: list[tuple[str, int, bytes]] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            mode = stat.S_IFMT(os.lstat(path).st_mode)
            if mode == stat.S_IFLNK:
                data = os.fsencode(os.readlink(path))
            elif mode == stat.S_IFREG:
                with open(path, "rb") as f:
                    data = f.read()
            else:
                data = b""
            out.append((path, mode, data))
    return out


def _beside(root: Path) -> tuple[tuple[str, bytes], ...]:
    """The ``.json`` files beside the root (what ``atomic_write`` writes), as observed."""
    parent = root.parent
    if not parent.is_dir():
        return ()
    return tuple(
        (name, (parent / name).read_bytes())
        for name in sorted(os.listdir(parent))
        if name.endswith(".json") and (parent / name).is_file()
    )


def _outside_staging(root: Path, tree: list[tuple[str, int, bytes]]) -> tuple[object, ...]:
    """``tree`` without the contents of staging directories (their names stay): the
    public API never reads inside one (a name with ``.tmp-`` is never a checkpoint)."""
    out: list[object] = []
    top = str(root) + os.sep
    for path, mode, data in tree:
        rel = path[len(top) :] if path.startswith(top) else path
        first, _, rest = rel.partition(os.sep)
        tmp = parse_tmp(first)
        if rest and tmp is not None and tmp.tag == TAG_STAGING and not tmp.is_lock:
            continue
        out.append((rel, mode, data))
    return tuple(out)


def _start(root: Root) -> RootModel:
    model = RootModel(prefix=root.prefix)
    for a in root.setup:
        a.apply(model)
    return model


def sequences(
    length: int,
    *,
    alphabet: Sequence[Action] = ALPHABET,
    roots: Sequence[Root] = ROOTS,
    sample: int | None = None,
    seed: int = 0,
) -> list[tuple[Root, tuple[Action, ...]]]:
    """Every sequence of ``length`` actions from every root, or ``sample`` of them."""
    every = [(r, tuple(seq)) for r in roots for seq in itertools.product(alphabet, repeat=length)]
    if sample is not None and sample < len(every):
        every = random.Random(seed).sample(every, sample)
    return every


def leftover_sequences() -> list[tuple[Root, tuple[Action, ...]]]:
    """Each of :data:`~atomic_ckpt.testing.alphabet.LEFTOVER_ACTIONS` alone from
    :data:`~atomic_ckpt.testing.alphabet.LEFTOVERS`."""
    return [(LEFTOVERS, (by_name(name),)) for name in LEFTOVER_ACTIONS]


def default_run(
    *,
    extra: Sequence[Action] = (),
    soak: bool = False,
    pairs: int = PAIRS,
    triples: int = TRIPLES,
    seed: int = 2,
) -> list[tuple[Root, tuple[Action, ...]]]:
    """The sequences of the default run: every seq-1 of the alphabet (and ``extra``
    actions) from every root and :func:`leftover_sequences`, then ``pairs`` seq-2 sampled
    with ``seed``; the soak (``soak=True``): every seq-2 instead, then ``triples`` seq-3
    sampled with ``seed + 1``."""
    todo = sequences(1, alphabet=(*ALPHABET, *extra)) + leftover_sequences()
    if soak:
        return todo + sequences(2) + sequences(3, sample=triples, seed=seed + 1)
    return todo + sequences(2, sample=pairs, seed=seed)


@dataclass
class Totals:
    """Counts over many sequences."""

    sequences: int = 0
    operations: int = 0
    crash_states: int = 0
    distinct_states: int = 0
    failures: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.sequences += 1
        self.operations += outcome.operations
        self.crash_states += outcome.states_generated
        self.distinct_states += outcome.states_checked
        if not outcome.ok:
            self.failures.append(outcome)


def explore_sequences(
    todo: Iterable[tuple[Root, tuple[Action, ...]]], **options: object
) -> Iterator[Outcome]:
    """:func:`check_sequence` on each sequence of ``todo``."""
    for root, seq in todo:
        yield check_sequence(root, seq, **options)  # type: ignore[arg-type]
