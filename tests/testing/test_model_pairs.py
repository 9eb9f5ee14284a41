"""The model check's sequences of two and three actions (atomic_ckpt.testing.sequences): a
sample of seq-2 in the default run (1,000 more in the slow tier), every seq-2 and a sample
of seq-3 in the soak (ATOMIC_CKPT_SOAK=1). A file of its own so that xdist (--dist
loadfile) runs it beside test_model_check.py's seq-1, on the other core."""

from __future__ import annotations

import os

import pytest

from atomic_ckpt.testing.sequences import PAIRS, TRIPLES, Totals, check_sequence, sequences

SOAK = os.environ.get("ATOMIC_CKPT_SOAK", "") not in ("", "0")


def _run(todo: list, totals: Totals) -> None:  # type: ignore[type-arg]
    before = len(totals.failures)
    for root, seq in todo:
        totals.add(check_sequence(root, seq))
    failed = totals.failures[before:]
    assert not failed, f"{len(failed)} failed:\n\n" + "\n\n".join(str(f) for f in failed[:3])


def test_pairs_of_actions_survive_every_crash(model_totals: Totals) -> None:
    """Seq-2: a sample of PAIRS in the default run, every pair with ATOMIC_CKPT_SOAK=1."""
    _run(sequences(2, sample=None if SOAK else PAIRS, seed=2), model_totals)


MORE_PAIRS, MORE_PARTS = 1000, 4
"""The slow tier's further pairs, in parts that the workers share out (in one test, they
were the slow tier's longest)."""


@pytest.mark.slow
@pytest.mark.skipif(SOAK, reason="the soak runs every pair")
@pytest.mark.parametrize("part", range(MORE_PARTS))
def test_more_pairs_survive_every_crash(model_totals: Totals, part: int) -> None:
    """Seq-2, the slow tier: 1,000 more pairs, drawn with another seed; this part's share."""

    def key(item: tuple) -> tuple:  # type: ignore[type-arg]
        return item[0].name, tuple(a.name for a in item[1])

    drawn = {key(s) for s in sequences(2, sample=PAIRS, seed=2)}
    more = [s for s in sequences(2, sample=PAIRS + MORE_PAIRS, seed=4) if key(s) not in drawn]
    _run(more[:MORE_PAIRS][part::MORE_PARTS], model_totals)


@pytest.mark.skipif(not SOAK, reason="seq-3 runs in the soak (ATOMIC_CKPT_SOAK=1)")
def test_sampled_triples_survive_every_crash(model_totals: Totals) -> None:
    """Seq-3, a sample of TRIPLES (soak only)."""
    _run(sequences(3, sample=TRIPLES, seed=3), model_totals)
