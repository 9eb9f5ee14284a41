"""SIGKILL mid-save, then ``trainer.fit(ckpt_path="last")``: the run resumes from a complete
checkpoint and ends bit-identical to a run never killed, with the same top-k files."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")
pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning (the test extra)")

import torch
from lightning_runs import Runs

from atomic_ckpt._core.l4_protocol.onefile import _TEMP_RE

pytestmark = pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow

EPOCHS = 6
"""Epochs of 4 steps; a checkpoint at the end of each (top 2 by step, last linked)."""

CHAIN = [("write", 2), ("link", 2), ("unlink", 1), ("renamed", 2), ("rename", 2)]
"""The kill points, in order: each run resumes the killed one and is killed at its n-th
occurrence of the point (lightning_child.POINTS says where each is)."""


def config(tmp: Path, name: str, **kw: Any) -> dict[str, Any]:
    return {"package": "lightning", "dir": str(tmp / name), "out": str(tmp / f"{name}_out"), **kw}


def summary(cfg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(Path(cfg["out"] + ".json").read_text())
    return out


def weights(cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(cfg["out"] + ".pt", weights_only=True)
    return loaded


def starts(cfg: dict[str, Any]) -> list[int]:
    return [int(s) for s in (Path(cfg["dir"]) / "starts").read_text().split()]


def visible(ckpt_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(ckpt_dir) if not n.startswith("."))


def check_after_kill(ckpt_dir: Path) -> int:
    """``last.ckpt`` names a complete checkpoint and every visible file is complete; the step
    that ``last`` names (where the next run must resume)."""
    last = ckpt_dir / "last.ckpt"
    assert last.is_symlink(), f"last.ckpt is missing: {visible(ckpt_dir)}"
    assert last.exists(), f"last.ckpt dangles: -> {os.readlink(last)}"
    steps = {}
    for name in visible(ckpt_dir):
        path = ckpt_dir / name
        if path.is_dir():  # a sharded checkpoint: DCP's metadata and Lightning's meta.pt
            assert (path / ".metadata").is_file(), f"{name} has no DCP metadata"
            path = path / "meta.pt"
        ckpt = torch.load(path, weights_only=True)  # a torn file raises here
        steps[name] = int(ckpt["global_step"])
    assert steps, "no checkpoint left"
    return steps["last.ckpt"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), f"{key} differs"


@pytest.fixture(scope="module")
def reference(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A plain Lightning run (TorchCheckpointIO, ModelCheckpoint), never killed."""
    cfg = config(tmp_path_factory.mktemp("reference"), "plain", io="plain", epochs=EPOCHS)
    assert runs.run(cfg) == 0
    return cfg


@pytest.mark.parametrize(
    ("package", "io"), [("lightning", "atomic"), ("pytorch_lightning", "atomic_async")]
)
def test_killed_five_times_resumes_bit_identical(
    runs: Runs, reference: dict[str, Any], tmp_path: Path, package: str, io: str
) -> None:
    """Killed inside the write, before and after the rename, inside the last-link update and
    before a top-k delete (one kill per run, each run resuming the last), every kill leaves
    ``last`` naming a complete checkpoint; the run that ends has the weights (bit for bit),
    top-k and files of a run never killed, and no temporary file."""
    base = config(tmp_path, "run", package=package, io=io, epochs=EPOCHS)
    ckpt_dir = Path(base["dir"]) / "ckpts"
    expected_starts = [0]
    for i, (point, nth) in enumerate(CHAIN):
        marker = tmp_path / f"killed{i}"
        cfg = {**base, "resume": i > 0, "kill": [point, nth], "marker": str(marker)}
        assert runs.run(cfg) == -signal.SIGKILL, f"the kill at {point} #{nth} did not fire"
        assert marker.read_text() == point
        expected_starts.append(check_after_kill(ckpt_dir))
    assert runs.run({**base, "resume": True}) == 0
    # Each run resumed from what `last` named after the kill before it (a complete file).
    assert starts(base) == expected_starts
    assert expected_starts == [0, 4, 8, 12, 16, 20]  # the kills fell where CHAIN means them to
    assert_same_weights(weights(base), weights(reference))
    got, want = summary(base), summary(reference)
    assert got["weights"] == want["weights"]
    assert got["best_k_models"] == want["best_k_models"]
    assert visible(ckpt_dir) == visible(Path(reference["dir"]) / "ckpts")
    assert os.readlink(ckpt_dir / "last.ckpt") == want["best_k_models"][-1]
    assert [n for n in os.listdir(ckpt_dir) if _TEMP_RE.fullmatch(n)] == []


@pytest.fixture(scope="module")
def ddp_reference(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A plain Lightning DDP run on 2 gloo ranks, never killed."""
    cfg = config(tmp_path_factory.mktemp("ddp_reference"), "plain", io="plain", epochs=4)
    assert runs.run_ranks(cfg) == [0, 0]
    return cfg


def test_ddp_two_ranks_killed_twice_resumes_bit_identical(
    runs: Runs, ddp_reference: dict[str, Any], tmp_path: Path
) -> None:
    """DDP on 2 gloo ranks: rank 0 killed after a rename (async) and inside the last-link
    update (sync), the other rank with it; resumed on 2 ranks, the weights are bit-identical
    to a DDP run never killed."""
    base = config(tmp_path, "ddp", epochs=4)
    ckpt_dir = Path(base["dir"]) / "ckpts"
    expected_starts = [0]
    for i, (io, point, nth) in enumerate([("atomic_async", "renamed", 2), ("atomic", "link", 1)]):
        marker = tmp_path / f"killed{i}"
        cfg = {**base, "io": io, "resume": i > 0, "kill": [point, nth], "marker": str(marker)}
        statuses = runs.run_ranks(cfg)
        assert statuses[0] == -signal.SIGKILL, f"the kill at {point} #{nth} did not fire"
        assert marker.read_text() == point
        expected_starts.append(check_after_kill(ckpt_dir))
    assert runs.run_ranks({**base, "io": "atomic_async", "resume": True}) == [0, 0]
    assert starts(base) == expected_starts
    assert expected_starts[1] > 0
    assert_same_weights(weights(base), weights(ddp_reference))
    assert summary(base)["best_k_models"] == summary(ddp_reference)["best_k_models"]
    assert visible(ckpt_dir) == visible(Path(ddp_reference["dir"]) / "ckpts")


@pytest.fixture(scope="module")
def sharded_reference(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A plain Lightning ModelParallelStrategy (FSDP2) run on 2 gloo ranks, never killed."""
    tmp = tmp_path_factory.mktemp("sharded_reference")
    cfg = config(tmp, "plain", io="plain", epochs=4, sharded=True)
    assert runs.run_ranks(cfg) == [0, 0]
    return cfg


def test_sharded_directories_killed_twice_resume_bit_identical(
    runs: Runs, sharded_reference: dict[str, Any], tmp_path: Path
) -> None:
    """ModelParallelStrategy (FSDP2 on 2 gloo ranks) saving a checkpoint directory per save:
    rank 0 killed inside the write of the directory and before its promotion; every kill
    leaves ``last`` naming a complete directory, and the resumed run is bit-identical to a
    run never killed."""
    base = config(tmp_path, "sharded", io="atomic_async", epochs=4, sharded=True)
    ckpt_dir = Path(base["dir"]) / "ckpts"
    expected_starts = [0]
    for i, (point, nth) in enumerate([("write", 2), ("promote", 2)]):
        marker = tmp_path / f"killed{i}"
        cfg = {**base, "resume": i > 0, "kill": [point, nth], "marker": str(marker)}
        statuses = runs.run_ranks(cfg)
        assert statuses[0] == -signal.SIGKILL, f"the kill at {point} #{nth} did not fire"
        assert marker.read_text() == point
        expected_starts.append(check_after_kill(ckpt_dir))
    assert runs.run_ranks({**base, "resume": True}) == [0, 0]
    assert starts(base) == expected_starts == [0, 4, 8]
    assert_same_weights(weights(base), weights(sharded_reference))
    assert summary(base)["best_k_models"] == summary(sharded_reference)["best_k_models"]
    assert visible(ckpt_dir) == visible(Path(sharded_reference["dir"]) / "ckpts")
    assert all((ckpt_dir / n).is_dir() for n in summary(base)["best_k_models"])
    assert os.readlink(ckpt_dir / "last.ckpt") == summary(base)["best_k_models"][-1]
    assert [n for n in os.listdir(ckpt_dir) if _TEMP_RE.fullmatch(n)] == []
