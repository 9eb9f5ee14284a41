"""Adopting a legacy directory checks what can be checked without its writer: a save torn
by a kill (truncated safetensors, a zip archive without its directory, broken JSON) is
refused, naming the file; formats not known are adopted and reported as unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from treeutil import unmarked

from atomic_ckpt import MARKER, CheckpointDir, FileCheck, VerificationError
from atomic_ckpt.cli import main

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def legacy_epoch(root: Path, step: int = 7) -> Path:
    """A directory as a legacy trainer leaves it: weights, optimizer, a JSON state, a blob."""
    path = unmarked(root, str(step))
    safetensors_torch.save_file(
        {"w": torch.arange(64, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)},
        str(path / "model.safetensors"),
    )
    torch.save({"state": {0: {"exp_avg": torch.zeros(16)}}}, path / "optimizer.pt")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "rng.bin").write_bytes(b"\x01\x02\x03")
    return path


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_a_complete_legacy_directory_is_checked_and_adopted(ckpts: CheckpointDir) -> None:
    """Good files pass their checks; the unknown blob is reported unchecked; adoption works."""
    legacy_epoch(ckpts.root)
    checks = {c.path: c for c in ckpts.check_contents(7)}
    assert checks["model.safetensors"] == FileCheck("model.safetensors", "safetensors")
    assert checks["optimizer.pt"] == FileCheck("optimizer.pt", "torch zip")
    assert checks["trainer_state.json"] == FileCheck("trainer_state.json", "json")
    assert checks["rng.bin"] == FileCheck("rng.bin", None)
    assert all(c.ok for c in checks.values())
    assert ckpts.mark_complete(7).step == 7
    assert ckpts.latest() is not None


@pytest.mark.parametrize(
    ("name", "damage", "says"),
    [
        ("model.safetensors", lambda p: truncate(p, p.stat().st_size - 10), "truncated"),
        ("model.safetensors", lambda p: truncate(p, 5), "shorter than a safetensors header"),
        ("model.safetensors", lambda p: p.write_bytes(p.read_bytes() + b"xx"), "trailing"),
        ("optimizer.pt", lambda p: truncate(p, p.stat().st_size // 2), "zip"),
        ("optimizer.pt", lambda p: p.write_bytes(b""), "zip"),
        ("trainer_state.json", lambda p: p.write_text('{"global_st'), "JSON"),
    ],
)
def test_a_torn_file_stops_the_adoption_naming_it(
    ckpts: CheckpointDir, name: str, damage: object, says: str
) -> None:
    """A file as a kill mid-write leaves it: VerificationError naming it; no marker written."""
    path = legacy_epoch(ckpts.root)
    damage(path / name)  # type: ignore[operator]
    with pytest.raises(VerificationError, match=says) as caught:
        ckpts.mark_complete(7)
    assert caught.value.problems
    assert name in caught.value.problems[0]
    assert "--no-check" in str(caught.value)
    assert not (path / MARKER).exists()
    assert ckpts.latest() is None


def test_check_false_adopts_a_damaged_directory_anyway(ckpts: CheckpointDir) -> None:
    """The escape hatch: check=False marks it complete as it is."""
    path = legacy_epoch(ckpts.root)
    truncate(path / "model.safetensors", 20)
    assert ckpts.mark_complete(7, check=False).step == 7


def test_the_cli_reports_each_file_and_refuses_a_torn_one(
    ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mark-complete` prints a verdict per file, exits 1 on a damaged one (nothing marked),
    and adopts with --no-check."""
    path = legacy_epoch(ckpts.root)
    truncate(path / "optimizer.pt", 100)
    assert main(["mark-complete", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "optimizer.pt: torch zip: DAMAGED" in out
    assert "rng.bin: not checked (format not known)" in out
    assert "--no-check" in err
    assert not (path / MARKER).exists()
    assert main(["mark-complete", "--no-check", str(path)]) == 0
    assert "without checks" in capsys.readouterr().out
    assert (path / MARKER).exists()


def test_the_cli_says_which_files_it_could_not_check(
    ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """A clean adoption names how many files were of formats it does not know."""
    path = legacy_epoch(ckpts.root)
    assert main(["mark-complete", str(path)]) == 0
    assert "2 file(s) of unknown formats adopted unchecked" in capsys.readouterr().out
