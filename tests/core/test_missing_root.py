"""Every call on a root that does not exist yet: reads mean "no checkpoints", a call that
needs a checkpoint raises CheckpointNotFoundError naming it (never a FileNotFoundError
about a lock file), and nothing creates the root."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError


def _amend(ckpts: CheckpointDir) -> None:
    with ckpts.amend(1):
        pass


NEEDS_A_CHECKPOINT: dict[str, Callable[[CheckpointDir], Any]] = {
    "delete": lambda c: c.delete(1),
    "delete(force)": lambda c: c.delete(1, force=True),
    "set_best": lambda c: c.set_best(1),
    "amend": _amend,
    "promote_named": lambda c: c.promote_named("interrupted", 1),
    "get_named": lambda c: c.get_named("interrupted"),
    "mark_complete": lambda c: c.mark_complete(1),
    "get": lambda c: c.get(1),
    "verify": lambda c: c.verify(1),
}

NOTHING_TO_DO: dict[str, Callable[[CheckpointDir], Any]] = {
    "retain": lambda c: c.retain(keep_last=1),
    "retain(metric)": lambda c: c.retain(keep_best=1, metric="loss"),
    "prune": lambda c: c.prune(keep_last=1),
    "clean": lambda c: c.clean(),
    "clean(force)": lambda c: c.clean(force=True),
    "clean(dry_run)": lambda c: c.clean(dry_run=True),
}


@pytest.fixture(params=["missing", "parent-missing", "under-a-file"])
def missing(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointDir:
    """A root that does not exist (or whose parent does not either, or is a file)."""
    (tmp_path / "file").write_bytes(b"")
    where = {"missing": "ckpts", "parent-missing": "a/b", "under-a-file": "file/ckpts"}
    return CheckpointDir(tmp_path / where[request.param])


@pytest.mark.parametrize("call", NEEDS_A_CHECKPOINT.values(), ids=NEEDS_A_CHECKPOINT.keys())
def test_a_call_needing_a_checkpoint_is_checkpoint_not_found(
    missing: CheckpointDir, call: Callable[[CheckpointDir], Any]
) -> None:
    """CheckpointNotFoundError naming the root, not a raw FileNotFoundError about the lock."""
    with pytest.raises(CheckpointNotFoundError) as info:
        call(missing)
    assert str(missing.root) in str(info.value)
    assert "lock" not in str(info.value)
    assert not missing.root.exists()


@pytest.mark.parametrize("call", NOTHING_TO_DO.values(), ids=NOTHING_TO_DO.keys())
def test_a_maintenance_call_has_nothing_to_do(
    missing: CheckpointDir, call: Callable[[CheckpointDir], Any]
) -> None:
    """Retention, prune and clean of a missing root remove nothing and create nothing."""
    assert call(missing) == []
    assert not missing.root.exists()


def test_reads_of_a_missing_root_mean_no_checkpoints(missing: CheckpointDir) -> None:
    """latest, steps, best, named, entries, resume_point: empty, never an error."""
    assert missing.latest() is None
    assert missing.latest(verify=True) is None
    assert missing.steps() == []
    assert missing.best() is None
    assert missing.named() == []
    assert missing.entries(include_staging=True) == []
    assert missing.resume_point(verify=True) is None
    assert not missing.root.exists()


def test_the_root_lock_of_a_missing_root_is_checkpoint_not_found(tmp_path: Path) -> None:
    """The one place every mutation takes the root lock turns a missing root into
    CheckpointNotFoundError (a root removed after a caller's own check), creating nothing."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with pytest.raises(CheckpointNotFoundError, match="does not exist"), ckpts._root.locked():
        pytest.fail("the lock of a missing root was taken")
    assert not ckpts.root.exists()
