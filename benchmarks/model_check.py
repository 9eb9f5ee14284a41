"""The model check of the whole public API, as a benchmark: sequences, crash states, states
per second, and the review defects it catches.

    python benchmarks/model_check.py --quick   # the default configuration (seq-1, sampled seq-2)
    python benchmarks/model_check.py           # the soak: every seq-2, sampled seq-3

Every sequence of the alphabet (``atomic_ckpt.testing.alphabet`` plus the command line's
actions of ``tests/testing/model_cli.py``) from every starting root is checked live
against the reference model, and its last action under every ``kill`` and ``power`` crash
state (``atomic_ckpt.testing.sequences``), every single action under ``subset`` too (in
the same exploration: each sequence and each distinct state is counted once); then
each API mutant is put back and its sequence must fail. Prints progress, then as its
last line one JSON object:
``{"actions", "sequences", "checked_under", "crash_states", "distinct_states", "mutants",
"mutants_killed", "seconds", "states_per_second", "failures"}``. Exits 1 if a sequence
fails or a mutant survives.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "testing"))

from model_cli import CLI_ACTIONS  # noqa: E402

from atomic_ckpt.testing.actions import Action  # noqa: E402
from atomic_ckpt.testing.alphabet import ALPHABET, ROOTS, Root, by_name  # noqa: E402
from atomic_ckpt.testing.mutants import (  # noqa: E402
    API_MUTANTS,
    KILLED_BY,
    KILLED_UNDER,
    api_mutant,
)
from atomic_ckpt.testing.sequences import (  # noqa: E402
    PAIRS,
    TRIPLES,
    Totals,
    check_sequence,
    default_run,
)

KILL_POWER = ("kill", "power")
SEQ1_MODELS = (*KILL_POWER, "subset")


def make_plan(
    todo: list[tuple[Root, tuple[Action, ...]]],
) -> list[tuple[Root, tuple[Action, ...], tuple[str, ...]]]:
    """Each sequence of ``todo`` once, with the crash models it is checked under: a single
    action under ``kill``, ``power`` and ``subset`` together (one exploration, so a state
    two models reach counts once; tests/testing/test_model_reordered.py), a longer one
    under ``kill`` and ``power``."""
    return [(r, s, SEQ1_MODELS if len(s) == 1 else KILL_POWER) for r, s in todo]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default configuration")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="seq-2 sample in --quick")
    parser.add_argument("--triples", type=int, default=TRIPLES, help="seq-3 sample in the soak")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument(
        "--minutes", type=float, default=None, help="stop the soak after this long (partial)"
    )
    args = parser.parse_args()
    alphabet = (*ALPHABET, *CLI_ACTIONS)
    todo = default_run(
        extra=CLI_ACTIONS,
        soak=not args.quick,
        pairs=args.pairs,
        triples=args.triples,
        seed=args.seed,
    )
    if not args.quick:  # the soak: seq-1, then seq-2 and seq-3 interleaved at random
        n1 = len(alphabet) * len(ROOTS)
        tail = todo[n1:]
        random.Random(args.seed).shuffle(tail)
        todo = todo[:n1] + tail
    plan = make_plan(todo)
    totals = Totals()
    start = time.monotonic()
    stop = start + args.minutes * 60 if args.minutes else None
    for i, (root, seq, models) in enumerate(plan, 1):
        if stop is not None and time.monotonic() > stop:
            print(f"stopped after {args.minutes} minutes: {i - 1}/{len(plan)}", file=sys.stderr)
            break
        outcome = check_sequence(root, seq, models=models)
        totals.add(outcome)
        if not outcome.ok:
            print(f"FAILED {outcome}", file=sys.stderr)
        if i % 50 == 0 or i == len(plan):
            took = time.monotonic() - start
            print(
                f"{i}/{len(plan)} sequences, {totals.distinct_states} distinct crash states, "
                f"{took:.0f} s ({totals.distinct_states / took:.0f} states/s)",
                file=sys.stderr,
                flush=True,
            )
    roots = {r.name: r for r in ROOTS}
    killed = 0
    for name in API_MUTANTS:
        root, seq = KILLED_BY[name]
        actions = tuple(by_name(a) for a in seq)
        assert (roots[root], actions) in todo, f"{name}'s sequence is not in this run"
        with api_mutant(name):
            outcome = check_sequence(
                roots[root], actions, models=KILLED_UNDER.get(name, KILL_POWER)
            )
        killed += not outcome.ok
        print(f"mutant {name}: {'killed' if not outcome.ok else 'SURVIVED'}", file=sys.stderr)
    seconds = time.monotonic() - start
    print(
        json.dumps(
            {
                "actions": [a.name for a in alphabet],
                "sequences": totals.sequences,
                "checked_under": {"seq-1": list(SEQ1_MODELS), "longer": list(KILL_POWER)},
                "crash_states": totals.crash_states,
                "distinct_states": totals.distinct_states,
                "mutants": len(API_MUTANTS),
                "mutants_killed": killed,
                "seconds": round(seconds, 1),
                "sequences_planned": len(plan),
                "states_per_second": round(totals.distinct_states / seconds, 1),
                "failures": len(totals.failures),
            }
        )
    )
    return 0 if not totals.failures and killed == len(API_MUTANTS) else 1


if __name__ == "__main__":
    sys.exit(main())
