"""A resume that passes over a step moved by hand under a name (``mv 5 interrupted``) says
so: the directory holds step 5's complete checkpoint, which no scan of steps sees and no
commit replaces, so the job would resume from an older step (or start over) without a
word. The warning names the directory, the step and the remedy (move it back)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir

LOGGER = "atomic_ckpt"


def _commit(c: CheckpointDir, step: int) -> None:
    with c.commit(step) as path:
        (path / "m.bin").write_bytes(str(step).encode() * 10)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("older", [None, 3], ids=["nothing-else", "an-older-step"])
def test_a_resume_below_a_step_moved_to_a_name_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, older: int | None
) -> None:
    """``commit(5)``, ``mv 5 interrupted``: ``resume_point()`` returned None (or step 3)
    quietly. It still does (nothing there can be lost: a commit of 5 does not touch
    ``interrupted/``), with a warning saying that ``interrupted`` holds step 5 and to move
    it back to resume from it; resume_plan() warns the same."""
    c = CheckpointDir(tmp_path / "ckpts")
    if older is not None:
        _commit(c, older)
    _commit(c, 5)
    os.rename(tmp_path / "ckpts" / "5", tmp_path / "ckpts" / "interrupted")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        found = c.resume_point()
    assert (found and found.step) == older
    said = [m for m in _warnings(caplog) if "interrupted" in m]
    assert len(said) == 1, _warnings(caplog)
    assert "step 5" in said[0]
    assert "move it back" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        plan = CheckpointDir(tmp_path / "ckpts").resume_plan()
    assert (plan.checkpoint and plan.checkpoint.step) == older
    assert any("interrupted" in m for m in _warnings(caplog))


def test_no_warning_for_a_named_checkpoint_or_a_step_moved_below_the_resumed_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint committed under a name (``commit_named``) records no step: a resume
    says nothing of it. Nor of a step moved to a name below the step resumed from (set
    aside by hand: the resume loses nothing of it)."""
    c = CheckpointDir(tmp_path / "ckpts")
    _commit(c, 2)
    os.rename(tmp_path / "ckpts" / "2", tmp_path / "ckpts" / "set-aside")
    _commit(c, 4)
    with c.commit_named("interrupted") as path:
        (path / "m.bin").write_bytes(b"i")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        found = c.resume_point()
    assert found is not None
    assert found.step == 4
    assert _warnings(caplog) == []
