"""Run scenarios on 2 or 4 real gloo ranks (CPU processes) and collect what each rank saw.

Ranks are forked from a forkserver that has imported torch once, so a
scenario costs a fork and a gloo rendezvous, not a torch import per rank.
Each rank runs one function of ``dist_scenarios`` and writes its outcome
(the error it raised, if any, how long it took, and scenario data) to
``<out>/rank<r>.json``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

import dist_scenarios

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(
    ["torch", "torch.distributed", "atomic_ckpt.distributed", "dist_scenarios"]
)


@dataclass
class RankResult:
    """What one rank reported (None fields if it died before reporting)."""

    rank: int
    exitcode: int | None
    error: str | None = None
    message: str = ""
    elapsed: float = 0.0
    data: Any = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and self.error is None


Runner = Callable[..., list[RankResult]]


@pytest.fixture
def run_ranks(tmp_path: Path) -> Runner:
    """Run ``scenario`` on ``world`` ranks against ``tmp_path/ckpts``; return each rank's result."""
    counter = iter(range(1000))

    def run(
        scenario: str, world: int, *, deadline: float = 60.0, **params: Any
    ) -> list[RankResult]:
        n = next(counter)
        out = tmp_path / f"out{n}"
        out.mkdir()
        init = tmp_path / f"init{n}"
        procs = [
            _CTX.Process(
                target=dist_scenarios.main,
                args=(
                    scenario,
                    rank,
                    world,
                    (str(init), str(tmp_path / "ckpts"), str(out)),
                    params,
                ),
            )
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
