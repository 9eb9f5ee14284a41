"""A step directory holding a checkpoint this release must not lose: one a newer
atomic_ckpt wrote (a newer marker format version), or a complete checkpoint moved there by
hand (``mv interrupted 5``). A commit never replaces one unless told to
(``replace_unusable=True``), and a resume below one stops, naming the remedy."""

from __future__ import annotations

import logging
import os

import pytest

from atomic_ckpt import MARKER, CheckpointDir, StepConflictError, UnusableCheckpointsError
from atomic_ckpt._core.l3_formats.marker import VERSION


def _commit(ckpts: CheckpointDir, step: int, text: bytes = b"weights") -> None:
    with ckpts.commit(step) as path:
        (path / "model.pt").write_bytes(text)


def _as_if_newer(ckpts: CheckpointDir, step: int) -> None:
    """Rewrite step's marker as a release with the next format version would write it."""
    marker = ckpts.path_of(step) / MARKER
    raw = marker.read_bytes()
    newer = raw.replace(b'"version": %d' % VERSION, b'"version": %d' % (VERSION + 1), 1)
    assert newer != raw
    marker.write_bytes(newer)


def _moved_interrupt(ckpts: CheckpointDir, step: int) -> None:
    """The seed project's advice: save ``interrupted``, then ``mv interrupted <step>``."""
    with ckpts.commit_named("interrupted") as path:
        (path / "model.pt").write_bytes(b"interrupt save")
    os.rename(ckpts.root / "interrupted", ckpts.path_of(step))


# ---------------------------------------------------------------- 11: newer format


def test_committing_over_a_newer_format_checkpoint_is_refused_naming_the_option(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit over a newer release's checkpoint says what it is and names the option."""
    _commit(ckpts, 5)
    _as_if_newer(ckpts, 5)
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(StepConflictError, match="replace_unusable=True") as caught,
        ckpts.commit(5) as path,
    ):
        (path / "model.pt").write_bytes(b"new")
    assert "newer atomic_ckpt" in str(caught.value)
    assert f"format version {VERSION + 1}" in str(caught.value)
    assert "has no checkpoint_complete marker" not in caplog.text
    assert (ckpts.path_of(5) / "model.pt").read_bytes() == b"weights"  # kept
    assert [n for n in os.listdir(ckpts.root) if ".tmp-" in n] == []  # nothing left


def test_replace_unusable_replaces_a_newer_format_checkpoint_knowingly(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``replace_unusable=True`` the commit replaces it, with a warning saying what."""
    _commit(ckpts, 5)
    _as_if_newer(ckpts, 5)
    with caplog.at_level(logging.WARNING), ckpts.commit(5, replace_unusable=True) as path:
        (path / "model.pt").write_bytes(b"new")
    assert ckpts.get(5).path == ckpts.path_of(5)
    assert (ckpts.path_of(5) / "model.pt").read_bytes() == b"new"
    assert "newer atomic_ckpt" in caplog.text


# ---------------------------------------------------------------- 14: moved by hand


def test_committing_over_a_named_checkpoint_moved_to_the_step_is_refused(
    ckpts: CheckpointDir,
) -> None:
    """``commit(5)`` over ``mv interrupted 5`` refuses, naming ``atomic-ckpt promote``."""
    _moved_interrupt(ckpts, 5)
    with pytest.raises(StepConflictError) as caught, ckpts.commit(5):
        pass
    message = str(caught.value)
    assert "atomic-ckpt promote" in message
    assert "replace_unusable=True" in message
    assert (ckpts.path_of(5) / "model.pt").read_bytes() == b"interrupt save"


def test_begin_refuses_it_too_and_replace_unusable_replaces_it(ckpts: CheckpointDir) -> None:
    """``begin(5)`` refuses the same; ``replace_unusable=True`` replaces it."""
    _moved_interrupt(ckpts, 5)
    with pytest.raises(StepConflictError, match="atomic-ckpt promote"):
        ckpts.begin(5)
    with ckpts.begin(5, replace_unusable=True) as commit:
        (commit.path / "model.pt").write_bytes(b"new")
    assert (ckpts.get(5).path / "model.pt").read_bytes() == b"new"


def test_a_resume_below_a_moved_checkpoint_stops_naming_promote(ckpts: CheckpointDir) -> None:
    """Steps 1-4 committed, then ``mv interrupted 5``: the resume refuses, naming the remedy."""
    for step in range(1, 5):
        _commit(ckpts, step)
    _moved_interrupt(ckpts, 5)
    with pytest.raises(UnusableCheckpointsError) as caught:
        ckpts.resume_point()
    err = caught.value
    assert err.paths == (ckpts.path_of(5),)
    assert "atomic-ckpt promote" in str(err)
    assert "step 4" in str(err)
    with pytest.raises(UnusableCheckpointsError):
        ckpts.resume_point(fresh=True)  # a checkpoint to resume from: fresh does not apply
    assert ckpts.latest() is not None  # a query still answers


def test_a_resume_with_only_a_moved_checkpoint_names_promote(ckpts: CheckpointDir) -> None:
    """With nothing else there, the refusal (as before) now names ``atomic-ckpt promote``."""
    _moved_interrupt(ckpts, 5)
    with pytest.raises(UnusableCheckpointsError, match="atomic-ckpt promote"):
        ckpts.resume_point()


def test_a_step_copied_to_another_step_stops_a_resume_below_it(ckpts: CheckpointDir) -> None:
    """``cp -r 3 7`` (a complete checkpoint under another step's name) stops it too."""
    for step in range(1, 4):
        _commit(ckpts, step)
    os.rename(ckpts.path_of(3), ckpts.path_of(7))
    with pytest.raises(UnusableCheckpointsError, match="records step 3"):
        ckpts.resume_point()
