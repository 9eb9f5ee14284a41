"""Run DCP scenarios on real gloo ranks (CPU processes) and collect what each rank saw.

As in tests/distributed: ranks are forked from a forkserver that has imported
torch once; each runs one function of ``dcp_scenarios`` and writes its outcome
to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed.checkpoint")

import dcp_scenarios
from dcp_runner import RankResult, Runner

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(
    ["torch", "torch.distributed.checkpoint", "atomic_ckpt.dcp", "dcp_scenarios"]
)


@pytest.fixture
def run_dcp(tmp_path: Path) -> Runner:
    """Run ``scenario`` on ``world`` ranks against ``tmp_path/ckpts``; each rank's result."""
    counter = iter(range(1000))

    def run(
        scenario: str, world: int, *, deadline: float = 90.0, **params: Any
    ) -> list[RankResult]:
        n = next(counter)
        out = tmp_path / f"out{n}"
        out.mkdir()
        paths = (str(tmp_path / f"init{n}"), str(tmp_path / "ckpts"), str(out))
        procs = [
            _CTX.Process(target=dcp_scenarios.main, args=(scenario, rank, world, paths, params))
            for rank in range(world)
        ]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join()
        assert not hung, f"{len(hung)} rank(s) still running after {deadline}s"
        results = []
        for rank, p in enumerate(procs):
            report = out / f"rank{rank}.json"
            fields = json.loads(report.read_text()) if report.exists() else {}
            results.append(RankResult(rank, p.exitcode, **fields))
        return results

    return run
