"""The model check of the whole public API, as a benchmark: sequences, crash states, states
per second, and the review defects it catches.

    python benchmarks/model_check.py --quick   # the default configuration (seq-1, sampled seq-2)
    python benchmarks/model_check.py           # the soak: every seq-2, sampled seq-3

Every sequence of the alphabet (``atomic_ckpt.testing.alphabet`` plus the command line's
actions of ``tests/testing/model_cli.py``) from every starting root is checked live
against the reference model, and its last action under every ``kill`` and ``power`` crash
state (``atomic_ckpt.testing.sequences``); then each API mutant is put back and its
sequence must fail. Prints progress, then as its last line one JSON object:
``{"actions", "sequences", "crash_states", "distinct_states", "mutants", "mutants_killed",
"seconds", "states_per_second", "failures"}``. Exits 1 if a sequence fails or a mutant
survives.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "testing"))

from model_cli import CLI_ACTIONS  # noqa: E402

from atomic_ckpt.testing.alphabet import ALPHABET, ROOTS, by_name  # noqa: E402
from atomic_ckpt.testing.mutants import API_MUTANTS, api_mutant  # noqa: E402
from atomic_ckpt.testing.sequences import Totals, check_sequence, sequences  # noqa: E402

CATCHES = {
    "join_error_not_aborting": ("empty", ("join_raises",)),
    "amend_stale_entries": ("two", ("amend_files",)),
    "aliases_after_root_fsync": ("two", ("commit_alias",)),
    "replace_aliases_drop_after_promotion": ("two", ("commit_replace_aliases",)),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default configuration")
    parser.add_argument("--pairs", type=int, default=60, help="seq-2 sample in --quick")
    parser.add_argument("--triples", type=int, default=2000, help="seq-3 sample in the soak")
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    alphabet = (*ALPHABET, *CLI_ACTIONS)
    todo = sequences(1, alphabet=alphabet)
    if args.quick:
        todo += sequences(2, sample=args.pairs, seed=args.seed)
    else:
        todo += sequences(2) + sequences(3, sample=args.triples, seed=args.seed + 1)
    totals = Totals()
    start = time.monotonic()
    for i, (root, seq) in enumerate(todo, 1):
        outcome = check_sequence(root, seq)
        totals.add(outcome)
        if not outcome.ok:
            print(f"FAILED {outcome}", file=sys.stderr)
        if i % 50 == 0 or i == len(todo):
            print(
                f"{i}/{len(todo)} sequences, {totals.distinct_states} distinct crash states, "
                f"{time.monotonic() - start:.0f} s",
                file=sys.stderr,
            )
    roots = {r.name: r for r in ROOTS}
    killed = 0
    for name in API_MUTANTS:
        root, seq = CATCHES[name]
        with api_mutant(name):
            outcome = check_sequence(roots[root], tuple(by_name(a) for a in seq))
        killed += not outcome.ok
        print(f"mutant {name}: {'killed' if not outcome.ok else 'SURVIVED'}", file=sys.stderr)
    seconds = time.monotonic() - start
    print(
        json.dumps(
            {
                "actions": [a.name for a in alphabet],
                "sequences": totals.sequences,
                "crash_states": totals.crash_states,
                "distinct_states": totals.distinct_states,
                "mutants": len(API_MUTANTS),
                "mutants_killed": killed,
                "seconds": round(seconds, 1),
                "states_per_second": round(totals.distinct_states / seconds, 1),
                "failures": len(totals.failures),
            }
        )
    )
    return 0 if not totals.failures and killed == len(API_MUTANTS) else 1


if __name__ == "__main__":
    sys.exit(main())
