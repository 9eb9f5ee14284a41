"""atomic_ckpt.testing as a user meets it: explore a save function, read the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import MARKER, CheckpointDir
from atomic_ckpt.testing import CrashState, check_invariants, explore, record

WEIGHTS = bytes(range(256)) * 4


def _load_latest(state: CrashState) -> None:
    """A user's checker: whatever latest() returns must load, with the saved weights."""
    latest = state.checkpoints().latest()
    if latest is not None:
        assert (latest.path / "model.bin").read_bytes() == WEIGHTS


def _naive_save(ckpts: CheckpointDir) -> None:
    """What many training loops do: write the step directory in place, then touch a marker."""
    path = ckpts.path_of(5)
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(WEIGHTS)
    (path / MARKER).write_bytes(b"")


def _committed_save(ckpts: CheckpointDir) -> None:
    with ckpts.commit(5) as path:
        (path / "model.bin").write_bytes(WEIGHTS)


def test_explore_finds_the_crash_state_that_breaks_a_naive_save() -> None:
    """A save without fsync or rename leaves a marked checkpoint whose weights are gone."""
    report = explore(_naive_save, _load_latest)
    assert report.failure is not None
    assert f"ckpts/5/{MARKER} (0 bytes)" in report.failure.description


def test_the_same_save_through_commit_passes_the_user_checker_and_the_invariants() -> None:
    """Wrapped in commit, every crash state loads (or shows no checkpoint at all)."""

    def checker(state: CrashState) -> None:
        check_invariants(state)
        _load_latest(state)

    report = explore(_committed_save, checker)
    assert report.ok, str(report)
    assert report.states_checked > 10
    assert set(report.checked_by_model) == {"strict", "ext4", "subset"}


def test_the_description_says_which_operations_survived() -> None:
    """A rejected state lists every operation's fate and what is on disk."""
    with record(_naive_save) as rec:
        end = len(rec.ops)
        weights = next(op.index for op in rec.ops if op.description.startswith("write ckpts/5/"))
        kept = [i for i in rec.uncovered(end) if i != weights]
        failure = rec.check(end, persisted=kept, checker=_load_latest)
    assert failure is not None
    text = str(failure)
    assert f"#{weights:<3} write ckpts/5/model.bin (1024 bytes) [observed]  LOST" in text
    assert "kept (not fsynced)" in text
    assert "on disk after the crash:\n" in text
    assert "ckpts/5/model.bin (0 bytes)" in text


@pytest.mark.parametrize(
    ("prefix", "staging"),
    [("", "5.tmp-"), ("checkpoint-", ".tmp-checkpoint-5.")],
    ids=["plain", "prefixed"],
)
def test_recording_sees_the_library_calls_and_the_save_functions_writes(
    prefix: str, staging: str
) -> None:
    """fsyncs and renames come from the syscall module; the files written are observed (in
    the staging dir of the root's form)."""
    with record(_committed_save, prefix=prefix) as rec:
        ops = [op.description for op in rec.ops]
    observed = [op for op in rec.ops if op.by == "observed"]
    assert any(d.startswith(f"write ckpts/{staging}") and "model.bin" in d for d in ops)
    assert any(d.startswith(f"fsync ckpts/{staging}") and d.endswith("/model.bin") for d in ops)
    assert any(d.startswith(f"rename (noreplace) ckpts/{staging}") for d in ops)
    assert ops[-1] == "fsync ckpts"
    assert observed
    assert all(op.kind != "sync" for op in observed)


def test_a_new_root_is_made_durable_with_its_first_commit() -> None:
    """The root's own entry is fsynced in its parent, or the first commit could vanish."""
    with record(_committed_save) as rec:
        ops = [op.description for op in rec.ops]
    assert ops.index("mkdir ckpts") < ops.index("fsync .") < ops.index("fsync ckpts")


def test_check_takes_only_operations_that_a_crash_could_still_lose() -> None:
    """Choosing an fsynced operation as 'lost or kept' is a caller error."""
    with record(_committed_save) as rec:
        end = len(rec.ops)
        durable = sorted(rec.covered(end))
        assert durable
        with pytest.raises(ValueError, match="not unsynced"):
            rec.check(end, persisted=[durable[0]])
        assert rec.check(end) is None
        assert rec.check(0) is None


def test_a_checker_that_crashes_is_a_rejection(tmp_path: Path) -> None:
    """An exception other than AssertionError from the checker is reported, not raised."""

    def broken(state: CrashState) -> None:
        raise RuntimeError("loader exploded")

    report = explore(_committed_save, broken, workdir=tmp_path)
    assert report.failure is not None
    assert report.failure.invariant is None
    assert "loader exploded" in report.failure.message
