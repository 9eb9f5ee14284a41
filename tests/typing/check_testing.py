"""``atomic_ckpt.testing`` (the power-loss simulation) as a user calls it on their own save
function, checked by `mypy --strict`.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import assert_type

from atomic_ckpt import CheckpointDir, SyncPolicy
from atomic_ckpt.testing import (
    STEPS,
    CrashState,
    Expectation,
    Failure,
    InvariantViolation,
    Op,
    Recording,
    Report,
    check_invariants,
    explore,
    mutant,
    record,
)


def save(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        (path / "model.bin").write_bytes(b"weights")


def setup(ckpts: CheckpointDir) -> None:
    with ckpts.commit(0) as path:
        (path / "model.bin").write_bytes(b"old weights")


def my_checker(state: CrashState) -> None:
    """A user's checker: the library's invariants, then their own loader."""
    assert_type(state.root, Path)
    assert_type(state.prefix, str)
    assert_type(state.sync, SyncPolicy)
    assert_type(state.model, str)
    assert_type(state.crash_point, int)
    assert_type(state.expected, Mapping[int, Expectation])
    assert_type(state.description, str)
    assert_type(state.moved_aside, bool)
    check_invariants(state)
    check_invariants(state, recover=False)
    ckpts = state.checkpoints()
    assert_type(ckpts, CheckpointDir)
    last = ckpts.latest()
    if last is not None:
        (last.path / "model.bin").read_bytes()


def check_my_save(workdir: Path) -> None:
    report = explore(save)
    assert report.ok, report
    report = explore(
        save,
        my_checker,
        setup=setup,
        models=("strict", "ext4", "subset"),
        samples=4,
        seed=1,
        keep_going=True,
        prefix="checkpoint-",
        checksum="sha256",
        workdir=workdir,
    )
    assert_type(report, Report)
    assert_type(report.ok, bool)
    assert_type(report.ops, tuple[Op, ...])
    assert_type(report.states_generated, int)
    assert_type(report.states_checked, int)
    assert_type(report.checked_by_model, Mapping[str, int])
    assert_type(report.failures, tuple[Failure, ...])
    first = report.failure
    assert_type(first, Failure | None)
    if first is not None:
        assert_type(first.model, str)
        assert_type(first.crash_point, int)
        assert_type(first.invariant, str | None)
        assert_type(first.message, str)
        assert_type(first.description, str)


def the_simulation_notices_a_missing_fsync() -> None:
    """Each mutant (one durability step off) must be rejected: the suite tests the protocol."""
    for step in STEPS:
        assert_type(step, str)
        policy = mutant(step)
        assert_type(policy, SyncPolicy)
        assert not explore(save, sync=policy, setup=setup).ok
    with record(save, setup=setup, replace="aside") as recording:
        assert_type(recording, Recording)
        assert_type(recording.ops, tuple[Op, ...])
        assert_type(recording.explore(my_checker, models=("strict",)), Report)
        failure = recording.check(len(recording.ops), checker=my_checker)
        assert_type(failure, Failure | None)


def catch_a_violation(state: CrashState) -> str | None:
    try:
        check_invariants(state)
    except InvariantViolation as exc:
        assert_type(exc.invariant, str)
        caught: AssertionError = exc
        return str(caught)
    return None
