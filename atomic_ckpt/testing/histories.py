"""Concurrent histories: several processes run short sequences of actions against one root;
each invocation and completion is logged, and the history must be linearizable against
the reference model (brute force: the histories are small).

A call refused with :class:`~atomic_ckpt.StepConflictError` that the model does not refuse
(an amend whose checkpoint another process replaced or deleted meanwhile) had no effect: it
linearizes as a no-op, but only for the refusals a concurrent writer can cause
(:data:`CONFLICTS`) and only if a call of another process that overlaps it in real time
is one that can cause it. Any other such refusal is the library's, and must match the model.
A process may be SIGKILLed mid-action: its action in flight may have taken effect or
not, at any point after its invocation (``clean()`` runs before the final state is read).
The victim runs :data:`SLOW` (a commit that pauses inside its block) and is killed only
once it has logged that invocation, inside the pause: the kill lands mid-action, which
the history shows as a call that never returned.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir
from atomic_ckpt.testing.actions import Action, B
from atomic_ckpt.testing.alphabet import Root, by_name
from atomic_ckpt.testing.model import Observation, Refused, RootModel, observe

__all__ = [
    "CONCURRENT",
    "CONFLICTS",
    "SLOW",
    "Call",
    "check_history",
    "random_plans",
    "run_history",
]

CONCURRENT = (
    "commit_new",
    "commit_replace",
    "commit_named",
    "amend_metadata",
    "set_best",
    "delete_step",
    "remove_alias",
    "prune",
    "promote_named",
)
"""The actions the concurrent histories draw from."""

CONFLICTS: dict[str, frozenset[str]] = {
    # amend(2) pins step 2: another amend of it, or a prune deleting it, changes it under it
    "amend_metadata": frozenset({"amend_metadata", "prune"}),
    # promote_named carries the named checkpoint's files into step 1: a new save of the name,
    # another promote of it, or a change of step 1 (replace, delete, prune) meanwhile
    "promote_named": frozenset(
        {"commit_named", "promote_named", "commit_replace", "delete_step", "prune"}
    ),
}
"""For each action a concurrent writer can refuse with StepConflictError (and the model,
alone, does not): the actions of another process that can cause that refusal."""

SLOW = "commit_slow"
"""A commit of step 3 (contents ``B``) that pauses inside its block: the action a killed
process is killed in."""
SLOW_PAUSE = 2.0
"""Seconds :data:`SLOW` pauses with half its files written."""


def _commit_slow(c: CheckpointDir) -> None:
    with c.commit(3) as p:
        (p / "model.bin").write_bytes(B["model.bin"])
        time.sleep(SLOW_PAUSE)
        (p / "extra").mkdir()
        (p / "extra" / "opt.bin").write_bytes(B["extra/opt.bin"])


def _action(name: str) -> Action:
    if name == SLOW:
        return dataclasses.replace(by_name("async_save"), name=SLOW, run=_commit_slow)
    return by_name(name)


@dataclass(frozen=True)
class Call:
    """One action of one process: when it was invoked and returned (None: killed)."""

    process: int
    action: str
    invoked: int
    returned: int | None
    raised: tuple[str, ...] | None
    """The names of the exception's classes (its MRO), or None if it returned."""


def _child(root: str, prefix: str, names: Sequence[str], log: str, index: int) -> None:
    ckpts = CheckpointDir(root, prefix=prefix, workers=1)
    with open(log, "a") as out:
        for name in names:
            t0 = time.monotonic_ns()
            out.write(json.dumps({"p": index, "a": name, "t0": t0}) + "\n")
            out.flush()
            raised = None
            try:
                _action(name).run(ckpts)
            except Exception as exc:
                raised = [c.__name__ for c in type(exc).__mro__]
            out.write(json.dumps({"p": index, "a": name, "t1": time.monotonic_ns(), "r": raised}))
            out.write("\n")
            out.flush()


def run_history(
    root: Root,
    directory: Path,
    plans: Sequence[Sequence[str]],
    *,
    kill: int | None = None,
    kill_after: float = 0.01,
) -> tuple[RootModel, list[Call], Observation]:
    """Set ``root`` up in ``directory``, run each plan in its own (forked) process, kill
    process ``kill`` ``kill_after`` seconds into its :data:`SLOW` action (its plan must
    hold one), clean; return the start model, the history and the final observation."""
    ckpts = CheckpointDir(directory / "ckpts", prefix=root.prefix, workers=1)
    ckpts.root.mkdir(parents=True)
    model = RootModel(prefix=root.prefix)
    for a in root.setup:
        a.run(ckpts)
        a.apply(model)
    log = directory / "history.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_child, args=(str(ckpts.root), root.prefix, list(p), str(log), i))
        for i, p in enumerate(plans)
    ]
    for p in procs:
        p.start()
    if kill is not None:
        _kill_in(procs[kill], kill, log, kill_after)
    for p in procs:
        p.join(60)
    open_calls: dict[tuple[int, str], int] = {}
    calls: list[Call] = []
    for line in log.read_text().splitlines() if log.exists() else []:
        rec = json.loads(line)
        key = (rec["p"], rec["a"])
        if "t0" in rec:
            open_calls[key] = rec["t0"]
        else:
            t0 = open_calls.pop(key)
            raised = tuple(rec["r"]) if rec["r"] is not None else None
            calls.append(Call(rec["p"], rec["a"], t0, rec["t1"], raised))
    calls += [Call(p, a, t0, None, None) for (p, a), t0 in open_calls.items()]
    ckpts.clean()
    return model, calls, observe(ckpts.root, prefix=root.prefix)


def _kill_in(proc: Any, index: int, log: Path, after: float) -> None:
    """SIGKILL ``proc`` (process ``index``) ``after`` seconds into its :data:`SLOW` action
    (at once if it ends without one)."""
    deadline = time.monotonic() + 60
    invoked = json.dumps({"p": index, "a": SLOW})[:-1] + ', "t0"'
    while proc.is_alive() and time.monotonic() < deadline:
        if log.exists() and invoked in log.read_text():
            time.sleep(after)
            break
        time.sleep(0.005)
    if proc.pid is not None and proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)


def _step(model: RootModel, action: Action) -> tuple[RootModel, str | None]:
    after = model.copy()
    try:
        action.apply(after)
    except Refused as refused:
        return model, refused.expected.__name__
    return after, None


def check_history(start: RootModel, calls: Sequence[Call], final: Observation) -> str | None:
    """None if some order of ``calls`` respects real time (a call that returned before
    another was invoked comes first), gives each call its outcome, and ends in ``final``
    (a killed call may be left out); else why not."""
    done = [c for c in calls if c.returned is not None]
    killed = [c for c in calls if c.returned is None]
    for n in range(len(killed) + 1):
        for chosen in itertools.combinations(killed, n):
            for order in itertools.permutations([*done, *chosen]):
                if _fits(start, order, final):
                    return None
    return f"no linearization of {len(calls)} calls ends in the final state"


def _fits(start: RootModel, order: Sequence[Call], final: Observation) -> bool:
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if b.returned is not None and b.returned < a.invoked:
                return False
    model = start
    for c in order:
        if _conflict_explained(c, order):
            continue  # a concurrent change refused (amend's pin): no effect, as documented
        model, refused = _step(model, _action(c.action))
        if c.returned is None:
            continue
        if (refused is None) != (c.raised is None):
            return False
        if refused is not None and c.raised is not None and refused not in c.raised:
            return False
    return model.observation() == final


def _conflict_explained(call: Call, calls: Sequence[Call]) -> bool:
    """True if ``call`` was refused with StepConflictError by a concurrent writer: its
    action is one of :data:`CONFLICTS` and a call of another process that can cause the
    refusal overlaps it in real time (a killed call runs on from its invocation)."""
    if call.raised is None or "StepConflictError" not in call.raised:
        return False
    causes = CONFLICTS.get(call.action, frozenset())
    end = call.returned if call.returned is not None else float("inf")
    return any(
        other.process != call.process
        and other.action in causes
        and other.invoked < end
        and call.invoked < (other.returned if other.returned is not None else float("inf"))
        for other in calls
    )


def random_plans(rng: random.Random, processes: int = 2, length: int = 2) -> list[list[str]]:
    """Short random sequences of :data:`CONCURRENT` actions, one per process."""
    return [[rng.choice(CONCURRENT) for _ in range(length)] for _ in range(processes)]
