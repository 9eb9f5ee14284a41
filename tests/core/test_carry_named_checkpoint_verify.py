"""A named checkpoint that shares inodes with a carrier (``carry(..., from_="base")``, or
``commit_named(..., carry=...)``) can be verified like a step: a write in place into the
carrier damages it too, and ``verify()`` of either checkpoint must report it."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, VerificationError
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


@pytest.mark.xfail(
    strict=True,
    reason="verify() takes only a step: a named carry source cannot be verified (InvalidStepError)",
)
def test_verify_of_a_named_carry_source_reports_a_write_in_place(ckpts: CheckpointDir) -> None:
    """verify("base") raises VerificationError for the bytes changed through the carrier."""
    _damaged(ckpts)
    with pytest.raises(VerificationError):
        ckpts.verify(3)
    with pytest.raises(VerificationError, match=r"frozen\.bin"):
        ckpts.verify("base")  # type: ignore[arg-type]


@pytest.mark.xfail(
    strict=True,
    reason="atomic-ckpt verify ROOT NAME is a usage error (exit 2): no way to check a named one",
)
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
