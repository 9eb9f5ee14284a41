"""The model check under PROTOCOL.md's third crash model, ``subset``: any subset of the
operations not yet fsynced survives a power loss, in no particular order (a filesystem
that does not journal metadata in order). The default run's ``power`` model keeps names
in journal order, so a missing fsync between two renames of the root is invisible to
it; here every single action from every root is crashed under ``subset`` as well.

A file of its own so that xdist (--dist loadfile) runs it beside the other model-check
files."""

from __future__ import annotations

import pytest
from model_cli import CLI_ACTIONS

from atomic_ckpt.testing.alphabet import ALPHABET, ROOTS, by_name
from atomic_ckpt.testing.mutants import api_mutant
from atomic_ckpt.testing.sequences import Totals, check_sequence, sequences

ROOT = {r.name: r for r in ROOTS}
SUBSET = ("subset",)


@pytest.mark.parametrize(
    "action",
    [
        # a new alias renamed into place before the commit's rename was durable: under
        # reordering, the alias may survive without its checkpoint (dangling) or name
        # the step's older save
        "commit_alias",
        "commit_keep_aliases",
        "commit_replace_aliases",
        "join_options",
        "rank0_commit",
        # the best pointer and the aliases unlinked, then the step renamed aside, with
        # no fsync between: the rename may survive without the unlinks (dangling)
        "delete_best_force",
    ],
)
def test_aliases_and_the_best_pointer_never_dangle_under_reordering(action: str) -> None:
    """An alias or ``checkpoint_best`` never names a checkpoint that is not there (or,
    for a new alias, one whose new save is not there), whatever subset of the unsynced
    operations a power loss keeps."""
    outcome = check_sequence(ROOT["two"], (by_name(action),), models=SUBSET)
    assert outcome.states_checked > 0
    assert outcome.ok, str(outcome)


def test_replace_aliases_unlinks_durably_before_the_promotion() -> None:
    """The drop of the older save's aliases is fsynced before the exchange: with that
    fsync switched off (the ``drop_aliases_not_durable`` mutant), some reordered crash
    state shows an old alias on the new contents; only ``subset`` can see it."""
    action = (by_name("commit_replace_aliases"),)
    with api_mutant("drop_aliases_not_durable"):
        assert check_sequence(ROOT["two"], action).ok  # invisible to kill and power
        assert not check_sequence(ROOT["two"], action, models=SUBSET).ok


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: r.name)
def test_every_single_action_survives_reordered_metadata(root, model_totals: Totals) -> None:  # type: ignore[no-untyped-def]
    """Seq-1, exhaustive, under ``subset``: each action from each root."""
    failed = []
    for r, seq in sequences(1, roots=[root], alphabet=(*ALPHABET, *CLI_ACTIONS)):
        outcome = check_sequence(r, seq, models=SUBSET)
        model_totals.add(outcome)
        if not outcome.ok:
            failed.append(outcome)
    assert not failed, f"{len(failed)} failed:\n\n" + "\n\n".join(str(f) for f in failed[:3])
