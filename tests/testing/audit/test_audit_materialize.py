"""Crash states shown at the audited path: incrementally, repaired after a check touched
them, and the original directory always put back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt.testing.audit import AuditError
from atomic_ckpt.testing.audit._materialize import Materializer, aside_path, set_aside

BIG = b"w" * 100_000


def test_consecutive_states_write_only_what_differs(tmp_path: Path) -> None:
    """Going to a state that differs in one small file rewrites that file, not the big one."""
    shown = Materializer(tmp_path / "root")
    shown.show((("1", "dir", b""), ("1/weights.bin", "file", BIG)))
    assert shown.written == len(BIG)
    shown.show((("1", "dir", b""), ("1/meta.json", "file", b"{}"), ("1/weights.bin", "file", BIG)))
    assert shown.written == len(BIG) + 2
    assert sorted(os.listdir(tmp_path / "root" / "1")) == ["meta.json", "weights.bin"]
    shown.show((("link", "symlink", b"1"),))
    assert os.listdir(tmp_path / "root") == ["link"]
    assert os.readlink(tmp_path / "root" / "link") == "1"


def test_what_a_check_changed_is_rewritten_for_the_next_state(tmp_path: Path) -> None:
    """A check that truncates a file, adds one and removes a directory does not leak into
    the next state."""
    root = tmp_path / "root"
    state = (("1", "dir", b""), ("1/weights.bin", "file", BIG), ("2", "dir", b""))
    shown = Materializer(root)
    shown.show(state)
    (root / "1" / "weights.bin").write_bytes(b"")  # what a check might do
    (root / "1" / "new.txt").write_text("left by the check")
    os.rmdir(root / "2")
    shown.show(state)
    assert (root / "1" / "weights.bin").read_bytes() == BIG
    assert sorted(os.listdir(root)) == ["1", "2"]
    assert os.listdir(root / "1") == ["weights.bin"]


def test_set_aside_puts_the_original_back_after_an_error(tmp_path: Path) -> None:
    """Whatever happens inside, the original directory is back at its path afterwards."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "keep").write_text("original")
    seen: list[Path | None] = []

    def audit_that_fails() -> None:
        with set_aside(root) as aside:
            seen.append(aside)
            assert not root.exists()
            root.mkdir()
            (root / "crash-state").write_text("x")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        audit_that_fails()
    assert seen == [aside_path(root)]
    assert os.listdir(root) == ["keep"]
    assert (root / "keep").read_text() == "original"
    assert not aside_path(root).exists()


def test_a_leftover_original_from_a_killed_audit_is_never_overwritten(tmp_path: Path) -> None:
    """If an earlier audit was SIGKILLed, the next one refuses instead of clobbering it."""
    root = tmp_path / "ckpts"
    root.mkdir()
    aside_path(root).mkdir()
    try:
        with pytest.raises(AuditError, match="move it back"), set_aside(root):
            pass
        assert root.is_dir()
        assert aside_path(root).is_dir()
    finally:
        aside_path(root).rmdir()  # in the audits' shared private directory, not tmp_path
