"""The defects reviews found after the first API mutants were written (a carry in flight
as the block ends, a joined block left open in a generator, a same-step commit nested
without join in ckpts.commit and in distributed_commit, two threads' rank0_commit of
one step, a late join after an abort, a
publish interrupted while it waits, a delete's unlinks not durable before its rename
aside): each is a mutant (atomic_ckpt.testing.later_defects), all but the last of which
survived the alphabet as it was, and the actions of atomic_ckpt.testing.races (and the
model's ``says``) that kill them. test_model_check.py's
test_each_review_defect_put_back_is_caught checks each against its KILLED_BY sequence;
these pin how each is caught."""

from __future__ import annotations

import logging

import pytest

from atomic_ckpt.testing.alphabet import ALPHABET, ROOTS, by_name
from atomic_ckpt.testing.later_defects import LATER_DEFECTS
from atomic_ckpt.testing.mutants import KILLED_BY, KILLED_UNDER, api_mutant
from atomic_ckpt.testing.races import RACES
from atomic_ckpt.testing.sequences import check_sequence

ROOT = {r.name: r for r in ROOTS}


def _check(mutant: str, *, crashes: bool = True) -> str:
    root, seq = KILLED_BY[mutant]
    models = KILLED_UNDER.get(mutant, ("kill", "power"))
    with api_mutant(mutant):
        outcome = check_sequence(
            ROOT[root], tuple(by_name(a) for a in seq), models=models, crashes=crashes
        )
    return "" if outcome.ok else str(outcome)


def test_every_race_action_is_in_the_alphabet_and_every_later_defect_has_a_sequence() -> None:
    """The race actions run in the default check; each later defect names its killer."""
    assert set(RACES) <= {a.name for a in ALPHABET}
    assert set(LATER_DEFECTS) <= set(KILLED_BY)


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: r.name)
@pytest.mark.parametrize("action", sorted(RACES))
def test_each_race_action_agrees_with_the_model_from_every_root(root, action: str) -> None:  # type: ignore[no-untyped-def]
    """Without a defect, each race action passes live and under every kill and power crash."""
    outcome = check_sequence(root, (by_name(action),))
    assert outcome.ok, str(outcome)
    assert outcome.states_checked > 0


def test_a_carry_in_flight_not_waited_for_commits_its_waiting_name() -> None:
    """With the carry not counted as a joined block, the publish runs while another
    thread's carry is held in flight: step 3 holds the private waiting name, not
    model.bin (the defect the review found)."""
    found = _check("carry_in_flight_not_waited")
    assert ".carrying.tmp-" in found, found


@pytest.mark.parametrize("mutant", ["nested_commit_not_refused", "distributed_nested_not_refused"])
def test_a_nested_commit_not_refused_is_caught_by_a_crash_state_not_live(mutant: str) -> None:
    """Unrefused (in ckpts.commit, or in distributed_commit on a one-rank process group),
    the inner commit publishes its part and the outer one replaces it: the end state is
    the model's, so only a crash between the two publishes shows it."""
    assert _check(mutant, crashes=False) == ""
    found = _check(mutant)
    assert "step:3 is" in found, found
    assert "part1.bin" in found, found


def test_a_refusal_must_name_the_cause_the_model_says(caplog: pytest.LogCaptureFixture) -> None:
    """The old message for a block ending inside its own joined block (blaming a publish
    "from inside" it) raises the right type, and is still caught: the model says the
    message names the generator."""
    caplog.set_level(logging.ERROR)
    found = _check("open_join_blames_publish")
    assert "not saying 'generator'" in found, found


@pytest.mark.parametrize(
    ("mutant", "shows"),
    [
        ("open_join_in_own_thread_ignored", "returned, the model says CommitStateError"),
        ("late_join_commits_alone", "left step:3"),
        ("interrupted_publish_left_open", "beside the checkpoints"),
        ("rank0_one_block_per_step", "raised KeyError"),
    ],
)
def test_a_join_defect_is_caught_live(mutant: str, shows: str) -> None:
    """A publish ignoring its own thread's open joined block returns where the model says
    CommitStateError; a late join committing alone leaves a step 3 the model has not; an
    interrupted publish left open leaves its staging dir and lock; rank0_commit blocks
    recorded one per step make the second thread's save fail with KeyError."""
    found = _check(mutant)
    assert shows in found, found


def test_a_delete_whose_unlinks_are_not_durable_is_caught_only_under_reordering() -> None:
    """The unlinks of the best pointer and aliases not fsynced before the rename aside:
    invisible to kill and power (a journal keeps their order), a dangling pointer under
    ``subset``."""
    action = (by_name("delete_best_force"),)
    with api_mutant("delete_unlinks_not_durable"):
        assert check_sequence(ROOT["two"], action).ok
    assert "dangles" in _check("delete_unlinks_not_durable")
