"""Run DCP scenarios on real gloo ranks (CPU processes) and collect what each rank saw.

Each rank runs one function of ``dcp_scenarios`` (see tests/ranks.py).
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint")

import dcp_scenarios
from ranks import Runner, make_runner

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(
    ["torch", "torch.distributed.checkpoint", "atomic_ckpt.dcp", "dcp_scenarios"]
)


@pytest.fixture
def run_dcp(tmp_path: Path) -> Runner:
    """Run ``scenario`` on ``world`` ranks against ``tmp_path/ckpts``; each rank's result."""
    return make_runner(_CTX, dcp_scenarios.main, tmp_path, deadline=90.0)
