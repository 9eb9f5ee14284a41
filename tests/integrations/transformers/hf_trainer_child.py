"""A tiny GPT-2 trained by ``AtomicTrainer`` on CPU: the process the kill tests SIGKILL.

Run as ``python hf_trainer_child.py '<json config>'`` (one process, or one per rank with
the torchrun environment variables set), or through :func:`run` in a process forked from
a server that has imported it once (what the tests do: a launch then costs a fork).
Config keys: ``out`` (output_dir), ``steps``, ``save_steps``, ``limit``
(save_total_limit), ``resume`` (bool), ``save_only_model``, ``save_on_each_node``,
``verify`` (``verify_on_resume``), ``kill`` (``[point, n]``: SIGKILL this process the
n-th time it reaches ``point``, after writing ``<out>/../killed-<point>-rank<r>``),
``result`` (a JSON file rank 0 writes when training ends; each rank also writes
``<result>.rank<r>``: the checkpoint it resumed from and the files it held mapped),
``final_rank0`` (a directory: after training, rank 0 alone calls ``save_model`` into it,
as a script guarded by ``is_world_process_zero()`` does; the other ranks wait, up to a
while, for ``<final_rank0>.done``, which rank 0 writes when its save returns).

Kill points: ``model`` (inside the model write: half the safetensors bytes are on disk),
``optimizer`` (the model is written, the optimizer is not), ``rng`` (everything but the
RNG state and trainer state), ``promote`` (everything written and fsynced, the marker
too, before the rename), ``retain`` (a checkpoint being deleted by rotation, renamed
out of sight but not yet removed).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

torch.set_num_threads(1)

import safetensors.torch  # noqa: E402
import transformers.modeling_utils  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    TrainingArguments,
)

import atomic_ckpt._core.l2_syscalls.fs  # noqa: E402
from atomic_ckpt.integrations.transformers import AtomicTrainer, last_checkpoint  # noqa: E402

VOCAB = 64


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def install_kill(out: Path, point: str, n: int) -> None:
    """Make this process SIGKILL itself the n-th time it reaches ``point``."""
    seen = [0]

    def reached() -> bool:
        seen[0] += 1
        return seen[0] == n

    def die() -> None:
        (out.parent / f"killed-{point}-rank{rank()}").write_text(str(seen[0]))
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "model":
        real_save_file = transformers.modeling_utils.safe_save_file

        def save_file(tensors: Any, filename: str, metadata: Any = None) -> None:
            if reached():
                data = safetensors.torch.save(tensors, metadata=metadata)
                with open(filename, "wb") as f:
                    f.write(data[: len(data) // 2])
                    f.flush()
                die()
            real_save_file(tensors, filename, metadata=metadata)

        transformers.modeling_utils.safe_save_file = save_file
    elif point in ("optimizer", "rng"):
        real_torch_save = torch.save
        stem = {"optimizer": "optimizer.pt", "rng": "rng_state"}[point]

        def torch_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(f, str | os.PathLike) and stem in os.path.basename(f) and reached():
                die()
            real_torch_save(obj, f, *args, **kwargs)

        torch.save = torch_save
    elif point == "promote":
        real_rename = atomic_ckpt._core.l2_syscalls.fs.rename_noreplace

        def rename_noreplace(src: Any, dst: Any) -> None:
            if ".tmp-" in os.path.basename(src) and reached():
                die()
            real_rename(src, dst)

        atomic_ckpt._core.l2_syscalls.fs.rename_noreplace = rename_noreplace
    elif point == "retain":
        real_remove = atomic_ckpt._core.l2_syscalls.fs.remove_tree

        def remove_tree(path: Any) -> None:
            if ".del-" in os.path.basename(path) and reached():
                die()
            real_remove(path)

        atomic_ckpt._core.l2_syscalls.fs.remove_tree = remove_tree
    else:
        raise SystemExit(f"unknown kill point {point}")


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1")


def dataset() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, VOCAB, (64, 8), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def main(cfg: dict[str, Any]) -> None:
    if cfg.get("no_symlinks"):  # as vfat, exFAT or some SMB mounts: symlink() refused

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))

        os.symlink = refuse  # type: ignore[assignment]
    out = Path(cfg["out"])
    if cfg.get("kill"):
        point, n = cfg["kill"]
        install_kill(out, point, n)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=cfg["steps"],
        save_steps=cfg["save_steps"],
        save_total_limit=cfg.get("limit"),
        save_only_model=cfg.get("save_only_model", False),
        save_on_each_node=cfg.get("save_on_each_node", False),
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=7,
        dataloader_num_workers=0,
        disable_tqdm=True,
        save_strategy="steps",
    )
    trainer = AtomicTrainer(
        model=model,
        args=args,
        train_dataset=dataset(),
        processing_class=tokenizer(),
        verify_on_resume=cfg.get("verify", False),
    )
    resumed_from = last_checkpoint(out) if cfg.get("resume") else None
    chosen: list[str | None] = []
    choose = trainer._resume_point

    def resume_point(output_dir: str) -> str | None:
        chosen.append(choose(output_dir))
        chosen.append(",".join(sorted(trainer._atomic_views)))  # what this rank holds
        return chosen[0]

    trainer._resume_point = resume_point  # type: ignore[method-assign]
    trainer.train(resume_from_checkpoint=True if cfg.get("resume") else None)
    if cfg.get("final_rank0"):
        save_on_rank0_alone(trainer, Path(cfg["final_rank0"]))
    if cfg.get("result"):
        Path(f"{cfg['result']}.rank{rank()}").write_text(json.dumps(chosen))
    if cfg.get("result") and rank() == 0:
        Path(cfg["result"]).write_text(
            json.dumps({"resumed_from": resumed_from, "global_step": trainer.state.global_step})
        )


def save_on_rank0_alone(trainer: AtomicTrainer, final: Path) -> None:
    """``save_model`` on rank 0 only (a collective there would wait for the other ranks
    forever); the others wait for it to return, then go on without a collective."""
    done = final.with_name(final.name + ".done")
    if trainer.is_world_process_zero():
        trainer.save_model(str(final))
        done.write_text("saved")
        return
    for _ in range(600):
        if done.exists():
            return
        time.sleep(0.1)
    raise SystemExit(f"rank {rank()}: rank 0's save_model did not return within 60 s")


def run(cfg: dict[str, Any], env: dict[str, str], log: str) -> None:
    """Entry point in a process forked from the test's forkserver (torch and transformers
    already imported): this rank's environment, its output to ``log``, then :func:`main`."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    main(cfg)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
