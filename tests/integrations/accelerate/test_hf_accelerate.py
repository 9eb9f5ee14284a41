"""``atomic_ckpt.integrations.accelerate`` with the real Accelerate on 1 and 2 CPU processes:
save_state / load_state resume bit-identical, registered objects and the dataloader
position included."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

_CTX = mp.get_context("forkserver")
DEADLINE = 240.0
"""Seconds a process may run before the test gives up on it (a hang, not a timing check)."""


def launch(out: Path, phase: str, world: int) -> list[int | None]:
    """Run ``acc_child`` phase ``phase`` on ``world`` processes; return their exit codes."""
    import acc_child

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env: dict[str, str] = {}
        if world > 1:
            env = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(world),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world),
            }
        log = out / f"{phase}-rank{rank}.log"
        p = _CTX.Process(target=acc_child.run, args=(str(out), phase, env, str(log)))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(DEADLINE)
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def logs(out: Path) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("*.log")))


@pytest.mark.parametrize("world", [1, 2])
def test_save_state_then_load_state_resumes_bit_identical(tmp_path: Path, world: int) -> None:
    """A run resumed by load_state from the newest complete checkpoint ends with the same
    parameters, optimizer state and registered object as the run that saved it, and
    with ProjectConfiguration.iteration restored."""
    from acc_child import SAVES, STEPS

    assert launch(tmp_path, "save", world) == [0] * world, logs(tmp_path)
    saved = torch.load(tmp_path / "save.pt", weights_only=True)
    assert saved["steps"] == [SAVES[-1]]  # retain(keep_last=1) ran after each commit
    root = tmp_path / "project" / "checkpoints"
    listing = sorted(os.listdir(root))
    assert listing == [f"checkpoint_{SAVES[-1]}"]  # nothing else: no lock, no staging
    files = set(os.listdir(root / listing[0]))
    wanted = {"model.safetensors", "optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl"}
    assert wanted <= files
    assert {f"random_states_{r}.pkl" for r in range(world)} <= files

    assert launch(tmp_path, "resume", world) == [0] * world, logs(tmp_path)
    resumed = torch.load(tmp_path / "resume.pt", weights_only=True)
    assert resumed["resumed"] == SAVES[-1]
    assert resumed["iteration_after_load"] == len(SAVES)
    assert resumed["counter"] == saved["counter"] == STEPS
    for name, value in saved["params"].items():
        assert torch.equal(value, resumed["params"][name]), name
    for key, state in saved["optimizer"]["state"].items():
        for name, value in state.items():
            other = resumed["optimizer"]["state"][key][name]
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(other)), (key, name)


def test_accelerates_own_automatic_naming_reads_a_root_at_rest(tmp_path: Path) -> None:
    """exp2 of INTEGRATIONS.md: Accelerate's automatic-naming load_state() listing a root
    that atomic_ckpt wrote no longer raises IndexError on the root lock (none is left)."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.integrations.accelerate import save_state

    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=str(tmp_path), automatic_checkpoint_naming=True
        ),
    )
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    ckpts = CheckpointDir(tmp_path / "checkpoints", prefix="checkpoint_")
    for step in (1, 2):
        save_state(accelerator, ckpts, step)
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state()  # Accelerate's own listing: the highest checkpoint_<n>
    saved = ckpts.latest()
    assert saved is not None
    assert saved.step == 2
    assert not torch.equal(model.weight, torch.zeros(2, 2))
