"""Run a scenario on real gloo ranks (CPU processes) and collect what each rank saw.

Shared by tests/distributed and tests/dcp. Ranks are forked from a forkserver that
has imported torch once, so a scenario costs a fork and a gloo rendezvous, not a
torch import per rank. Each rank runs ``main(scenario, rank, world, (init file,
checkpoint root, out dir), params)`` of a scenarios module, which writes the
rank's outcome (the error it raised, if any, how long it took, and scenario data)
to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir


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
Main = Callable[[str, int, int, tuple[str, str, str], dict[str, Any]], None]


def make_runner(ctx: ForkServerContext, main: Main, tmp_path: Path, deadline: float) -> Runner:
    """A ``run(scenario, world, *, deadline=..., **params)`` against ``tmp_path/ckpts``.

    Every rank must end within ``deadline`` seconds: one still running is killed and
    the test fails (a hang is a bug, never a wait).
    """
    counter = iter(range(1000))

    def run(
        scenario: str, world: int, *, deadline: float = deadline, **params: Any
    ) -> list[RankResult]:
        n = next(counter)
        out = tmp_path / f"out{n}"
        out.mkdir()
        paths = (str(tmp_path / f"init{n}"), str(tmp_path / "ckpts"), str(out))
        procs = [
            ctx.Process(target=main, args=(scenario, rank, world, paths, params))
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


@dataclass
class Ctx:
    """What a scenario gets, in its rank's process."""

    rank: int
    world: int
    ckpts: CheckpointDir
    out: Path
    params: dict[str, Any]


Scenario = Callable[[Ctx], Any]


def run_scenario(
    name: str,
    rank: int,
    world: int,
    paths: tuple[str, str, str],
    params: dict[str, Any],
    *,
    scenarios: Mapping[str, Scenario],
    catch: type[BaseException] = Exception,
    pg_timeout: float = 30.0,
    data_of_error: Callable[[BaseException], Any] | None = None,
) -> None:
    """In a rank's process: join the gloo group, run ``scenarios[name]``, write the report
    ``{"error", "message", "elapsed", "data"}`` to ``<out>/rank<r>.json`` and exit.

    ``paths`` are (init file, checkpoint root, out dir). An exception of type ``catch`` is
    reported (``data_of_error`` may describe it further); after one, the process leaves
    without collectives, since the group may be broken.
    """
    import torch.distributed as dist

    init, root, out = paths
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=pg_timeout),
    )
    ctx = Ctx(rank, world, CheckpointDir(root), Path(out), params)
    report: dict[str, Any] = {"error": None, "message": "", "data": None}
    start = time.monotonic()
    try:
        report["data"] = scenarios[name](ctx)
    except catch as exc:
        report["error"] = type(exc).__name__
        report["message"] = str(exc) + "".join(f"\n{n}" for n in getattr(exc, "__notes__", ()))
        if data_of_error is not None:
            report["data"] = data_of_error(exc)
    report["elapsed"] = time.monotonic() - start
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    if report["error"] is None:
        dist.destroy_process_group()
    os._exit(0)
