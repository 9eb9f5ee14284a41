"""Lightning training runs in their own processes, for the kill and resume tests.

``python lightning_child.py '<json config>'`` runs one. ``python lightning_child.py --serve``
imports Lightning once and then forks one child per request (importing Lightning takes
seconds; a fork, milliseconds), one JSON line each on stdin, one JSON line back:

* ``{"start": config, "env": {...}, "log": path}`` -> ``{"pid": pid}``: run ``config`` in a
  child with ``env`` added to its environment, its output going to ``log``;
* ``{"wait": pid, "timeout": seconds}`` -> ``{"status": code}``, the exit code, or minus the
  signal that ended it; ``null`` if it still runs after ``timeout``;
* ``{"kill": pid}`` -> ``{"status": code}``: SIGKILL the child and reap it.

A run's config keys:

* ``package``: ``lightning`` or ``pytorch_lightning``;
* ``dir``: the run directory (checkpoints go to ``dir/ckpts``);
* ``epochs``: train until this many epochs are done (4 steps each, a checkpoint at the end of
  each);
* ``io``: ``atomic``, ``atomic_async`` or ``plain`` (Lightning's own TorchCheckpointIO and
  ModelCheckpoint);
* ``sharded``: ModelParallelStrategy with FSDP2 (``fully_shard``) on the ranks, saving a
  checkpoint directory per save (AtomicModelParallelStrategy unless ``io`` is ``plain``);
* ``resume``: ``trainer.fit(ckpt_path="last")``;
* ``kill``: ``[point, n]``: SIGKILL this process at the ``n``-th (1-based) time it reaches
  ``point`` (see :data:`POINTS`), after writing ``marker``;
* ``out``: where to write the final weights (``torch.save``) and a JSON summary.

Under DDP (``LOCAL_RANK``, ``WORLD_SIZE`` set by the test) only rank 0 writes, so only
rank 0 arms the kill.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

POINTS = {
    "write": "inside torch.save of a checkpoint's temporary file: half the bytes written",
    "rename": "the temporary file written and fsynced, not yet renamed over the .ckpt",
    "renamed": "the .ckpt renamed into place; its directory fsync, link and delete not done",
    "link": "the last link's temporary symlink made, not yet renamed over last.ckpt",
    "unlink": "about to delete the top-k file that dropped out",
    "promote": "a sharded checkpoint's staging directory written and fsynced, not yet renamed",
}


def arm(point: str, nth: int, marker: Path) -> None:
    """Install the kill hook for ``point``: SIGKILL at its ``nth`` occurrence."""
    from atomic_ckpt._core.l2_syscalls import fs as _fs

    seen = [0]

    def due() -> bool:
        seen[0] += 1
        return seen[0] == nth

    def die() -> None:
        marker.write_text(point)
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "write":
        real_save = torch.save

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            # The plain IO saves to a path; AtomicCheckpointIO to a writer over the opened
            # temporary file (it hashes what torch.save writes): its file's name says which.
            named = f if isinstance(f, str | os.PathLike) else getattr(f, "_file", None)
            target = os.fspath(
                named if isinstance(named, str | os.PathLike) else getattr(named, "name", "")
            )
            if ".tmp-" in target and due():
                buf = io.BytesIO()
                real_save(obj, buf, *args, **kwargs)
                data = buf.getvalue()
                if isinstance(f, str | os.PathLike):
                    with open(f, "wb") as fh:
                        fh.write(data[: len(data) // 2])
                else:
                    f.write(data[: len(data) // 2])
                    f.flush()
                die()
            real_save(obj, f, *args, **kwargs)

        torch.save = save
    elif point in ("rename", "renamed", "link"):
        real_rename = _fs.rename

        def rename(src: Path, dst: Path) -> None:
            is_link = os.path.islink(src)
            if (is_link == (point == "link")) and point != "renamed" and due():
                die()
            real_rename(src, dst)
            if point == "renamed" and not is_link and due():
                die()

        _fs.rename = rename
    elif point == "promote":
        for name in ("rename_noreplace", "rename_exchange"):
            real = getattr(_fs, name)

            def promote(src: Path, dst: Path, real: Any = real) -> None:
                if due():
                    die()
                real(src, dst)

            setattr(_fs, name, promote)
    elif point == "unlink":
        real_unlink = _fs.unlink

        def unlink(path: Path) -> None:
            if not Path(path).name.startswith(".") and due():  # a top-k file, not a temporary
                die()
            real_unlink(path)

        _fs.unlink = unlink
    else:
        raise ValueError(point)


def main(config: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    package = config["package"]
    pl: Any = importlib.import_module("lightning.pytorch" if package == "lightning" else package)
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from atomic_ckpt.integrations.lightning import classes_for

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if config.get("kill") and rank == 0:
        arm(config["kill"][0], config["kill"][1], Path(config["marker"]))

    class Net(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)
            )
            self.start_step: int | None = None

        def on_train_start(self) -> None:
            self.start_step = self.trainer.global_step
            if self.trainer.is_global_zero:  # the step each run (killed or not) started at
                Path(config["dir"]).mkdir(parents=True, exist_ok=True)
                with open(Path(config["dir"]) / "starts", "a") as f:
                    f.write(f"{self.start_step}\n")

        def configure_model(self) -> None:
            if config.get("sharded"):
                from torch.distributed.fsdp import fully_shard

                fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def train_dataloader(self) -> DataLoader[Any]:
            g = torch.Generator().manual_seed(0)
            x = torch.randn(16 * world, 8, generator=g)
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=4)

    pl.seed_everything(0)  # (its verbose=False is new in 2.4)
    dirpath = Path(config["dir"]) / "ckpts"
    options = {
        "dirpath": dirpath,
        "filename": "{epoch}-{step}",
        "monitor": "step",
        "mode": "max",
        "save_top_k": 2,
        "save_last": "link",
        "every_n_epochs": 1,
        "enable_version_counter": False,
    }
    strategy: Any = "ddp" if world > 1 else "auto"
    classes = classes_for(package)
    if config["io"] == "plain":
        plugins: list[Any] = []
        callback = pl.callbacks.ModelCheckpoint(**options)
    else:
        plugins = [classes.AtomicCheckpointIO(async_save=config["io"] == "atomic_async")]
        callback = classes.AtomicModelCheckpoint(**options)
    if config.get("sharded"):
        cls = (
            pl.strategies.ModelParallelStrategy
            if config["io"] == "plain"
            else classes.AtomicModelParallelStrategy
        )
        strategy = cls(data_parallel_size=world, tensor_parallel_size=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_epochs=config["epochs"],
        plugins=plugins,
        callbacks=[callback],
        default_root_dir=config["dir"],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    model = Net()
    trainer.fit(model, ckpt_path="last" if config.get("resume") else None)
    state = {  # every rank: gathering a sharded tensor is a collective
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in model.state_dict().items()
    }
    if trainer.is_global_zero:
        torch.save(state, config["out"] + ".pt")
        digest = hashlib.sha256()
        for value in state.values():
            digest.update(value.numpy().tobytes())
        summary = {
            "start_step": model.start_step,
            "global_step": trainer.global_step,
            "weights": digest.hexdigest(),
            "best_k_models": sorted(os.path.basename(p) for p in callback.best_k_models),
            "last_model_path": os.path.basename(callback.last_model_path),
        }
        Path(config["out"] + ".json").write_text(json.dumps(summary))


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def _run_child(config: dict[str, Any], env: dict[str, str], log: str) -> None:
    """In the forked child: redirect the output, run, and never return."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.update(env)
        main(config)
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The fork server: see the module docstring."""
    import time

    torch.set_num_threads(1)
    importlib.import_module("lightning.pytorch")
    importlib.import_module("pytorch_lightning")
    importlib.import_module("atomic_ckpt.integrations.lightning")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any]
        if "start" in request:
            pid = os.fork()
            if pid == 0:
                _run_child(request["start"], request.get("env", {}), request["log"])
            reply = {"pid": pid}
        elif "wait" in request:
            deadline = time.monotonic() + request.get("timeout", 120)
            status: int | None = None
            while True:
                done, raw = os.waitpid(request["wait"], os.WNOHANG)
                if done:
                    status = _status(raw)
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            reply = {"status": status}
        elif "kill" in request:
            os.kill(request["kill"], signal.SIGKILL)
            reply = {"status": _status(os.waitpid(request["kill"], 0)[1])}
        else:
            reply = {"error": f"unknown request {request!r}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve()
    else:
        main(json.loads(sys.argv[1]))
