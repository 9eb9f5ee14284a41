"""A named checkpoint that shares inodes with a carrier (``carry(..., from_="base")``, or
``commit_named(..., carry=...)``) can be verified like a step: a write in place into the
carrier damages it too, and ``verify()`` of either checkpoint must report it."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, NamedCheckpoint, VerificationError
from atomic_ckpt.cli import main


def _damaged(ckpts: CheckpointDir) -> None:
    """Named ``base`` carried into step 3 (by the guide's own example), then a byte of
    step 3's carried file written in place: ``base`` holds the damaged bytes too."""
    with ckpts.commit_named("base") as path:
        (path / "frozen.bin").write_bytes(b"\0" * 100_000)
    with ckpts.begin(3) as commit:
        commit.carry("frozen.bin", from_="base")
    with open(ckpts.path_of(3) / "frozen.bin", "r+b") as f:
        f.write(b"X")


def test_verify_of_a_named_carry_source_reports_a_write_in_place(ckpts: CheckpointDir) -> None:
    """verify("base") raises VerificationError for the bytes changed through the carrier."""
    _damaged(ckpts)
    with pytest.raises(VerificationError):
        ckpts.verify(3)
    with pytest.raises(VerificationError, match=r"frozen\.bin"):
        ckpts.verify("base")


def test_cli_verify_of_a_named_carry_source_reports_a_write_in_place(
    ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """`atomic-ckpt verify ROOT base` exits 1 (a mismatch), as for a step."""
    _damaged(ckpts)
    try:
        code = main(["verify", str(Path(ckpts.root)), "base"])
    except SystemExit as exc:  # argparse refuses the name
        code = exc.code
    assert code == 1, capsys.readouterr().err


def test_cli_verify_of_the_whole_root_checks_named_checkpoints_too(
    ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """`atomic-ckpt verify ROOT` reports the damaged named carry source after the steps."""
    _damaged(ckpts)
    assert main(["verify", str(ckpts.root)]) == 1
    out = capsys.readouterr().out
    assert "step 3: FAILED" in out
    assert "named base: FAILED" in out


def test_verify_returns_the_named_checkpoint_it_checked(ckpts: CheckpointDir) -> None:
    """verify("base") of an intact named checkpoint returns its NamedCheckpoint."""
    with ckpts.commit_named("base") as path:
        (path / "frozen.bin").write_bytes(b"\0" * 1000)
    checked = ckpts.verify("base")
    assert isinstance(checked, NamedCheckpoint)
    assert (checked.name, checked.path) == ("base", ckpts.root / "base")


def test_verify_takes_a_step_as_ls_shows_it_in_a_prefixed_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a checkpoint- root, "1" and "checkpoint-1" name step 1, in the API and the CLI."""
    ckpts = CheckpointDir(tmp_path / "run", prefix="checkpoint-")
    with ckpts.commit(1) as path:
        (path / "f.bin").write_bytes(b"f" * 100)
    assert ckpts.verify("1").step == ckpts.verify("checkpoint-1").step == 1
    assert main(["verify", "--prefix", "checkpoint-", str(ckpts.root), "1"]) == 0
    assert "step 1: ok" in capsys.readouterr().out
