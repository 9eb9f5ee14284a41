"""Run the tiny-GPT-2 ``AtomicTrainer`` child (``hf_trainer_child.py``) on 1 or 2 CPU
processes forked from a server that imported transformers once, SIGKILL it at chosen
points, and inspect the output directory."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}
"""No downloads, one thread: set before the forkserver starts, so every child has them."""
DEADLINE = 240.0
"""Seconds a child may run before the test gives up on it (a hang, not a timing check)."""


for _name, _value in ENV.items():
    os.environ.setdefault(_name, _value)

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "transformers", "hf_trainer_child"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    """The exit codes of one launch (one per rank; -9 is SIGKILL) and each rank's output."""

    codes: list[int | None]
    logs: list[str]

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)


def launch(
    cfg: dict[str, Any],
    *,
    world: int = 1,
    kill_rank: int | None = None,
    tmp: Path,
    per_node: int | None = None,
    deadline: float = DEADLINE,
) -> Run:
    """Run the child on ``world`` processes (torchrun's environment variables, gloo), each
    forked from a server that imported transformers once; ``per_node`` (default: all of
    them) is the LOCAL_WORLD_SIZE they are told, so that one machine can pose as several
    nodes; ``deadline``: the seconds after which a rank still running is killed. With
    ``kill_rank``, only that rank gets ``cfg["kill"]``; once it is dead, the others are
    given a while to notice (they raise) and are then killed if they have not."""
    import hf_trainer_child

    port = free_port()
    procs = []
    logs = []
    for rank in range(world):
        mine = dict(cfg)
        if kill_rank is not None and rank != kill_rank:
            mine.pop("kill", None)
        env = {"RANK": "0", "WORLD_SIZE": "1"}
        if world > 1:
            env = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(world),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % (per_node or world)),
                "LOCAL_WORLD_SIZE": str(per_node or world),
            }
        log = tmp / f"log-{next(_COUNTER)}-rank{rank}.txt"
        logs.append(log)
        p = _CTX.Process(target=hf_trainer_child.run, args=(mine, env, str(log)))
        p.start()
        procs.append(p)
    if kill_rank is not None:
        procs[kill_rank].join(DEADLINE)
    for p in procs:
        p.join(60 if kill_rank is not None else deadline)
        if p.is_alive():
            p.kill()
            p.join()
    return Run([p.exitcode for p in procs], [log.read_text()[-4000:] for log in logs])


_COUNTER = iter(range(10**6))


def complete_steps(out: Path) -> list[int]:
    from atomic_ckpt import CheckpointDir

    return CheckpointDir(out, prefix="checkpoint-").steps()
