"""Run scenarios on 2 or 4 real gloo ranks (CPU processes) and collect what each rank saw.

Each rank runs one function of ``dist_scenarios`` (see tests/ranks.py).
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

import dist_scenarios
from ranks import RankResult, Runner, make_runner

__all__ = ["RankResult", "Runner", "run_ranks"]

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(
    ["torch", "torch.distributed", "atomic_ckpt.distributed", "dist_scenarios"]
)


@pytest.fixture
def run_ranks(tmp_path: Path) -> Runner:
    """Run ``scenario`` on ``world`` ranks against ``tmp_path/ckpts``; return each rank's result."""
    return make_runner(_CTX, dist_scenarios.main, tmp_path, deadline=60.0)
