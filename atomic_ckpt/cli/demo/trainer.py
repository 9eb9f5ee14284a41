"""``atomic-ckpt demo --trainer``: a Hugging Face ``Trainer`` run is SIGKILLed mid-save and
resumes with ``resume_from_checkpoint=True``.

A child process trains a tiny randomly initialised GPT-2 on CPU with
:class:`~atomic_ckpt.integrations.transformers.AtomicTrainer` (a checkpoint every 2 steps,
``save_total_limit=2``). During the save of step 4 it stops between the model and the
optimizer file and says so; the parent SIGKILLs it there. The parent shows what is on disk,
restarts the same script with ``resume_from_checkpoint=True`` (it resumes from
``checkpoint-2``, the newest complete one), and compares the result with a run that was
never killed. Needs the ``transformers`` extra; downloads nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir

_MIDSAVE = "MIDSAVE"
_SAVED = "SAVED"
_RESUMED = "RESUMED"
_STOP_AT = 4
"""The step whose save is killed (the second one)."""


def _require_transformers() -> None:
    if any(importlib.util.find_spec(m) is None for m in ("transformers", "accelerate", "torch")):
        raise ImportError(
            "atomic-ckpt demo --trainer needs transformers: pip install 'atomic_ckpt[transformers]'"
        )


def child_main(output_dir: str, steps: int, stop: bool, resume: bool) -> None:
    """The training script: a tiny GPT-2, AtomicTrainer, a checkpoint every 2 steps. With
    ``stop``, the save of step 4 pauses after the model file (the parent kills it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        PreTrainedTokenizerFast,
        TrainerCallback,
        TrainingArguments,
    )

    from atomic_ckpt.integrations.transformers import AtomicTrainer, last_checkpoint

    torch.set_num_threads(1)
    if stop:
        real_save = torch.save

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if str(f).endswith("optimizer.pt") and f"checkpoint-{_STOP_AT}" in str(f):
                print(f"{_MIDSAVE} {_STOP_AT}", flush=True)
                time.sleep(120)  # the parent kills us here
            real_save(obj, f, *args, **kwargs)

        torch.save = save

    class Report(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            print(f"{_SAVED} {state.global_step}", flush=True)

    vocab = 64
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="t0", pad_token="t1"
    )
    ids = torch.randint(0, vocab, (64, 8), generator=torch.Generator().manual_seed(1234))
    data = [{"input_ids": row, "labels": row} for row in ids]
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=16)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        save_steps=2,
        save_total_limit=2,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        seed=7,
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = AtomicTrainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Report()],
    )
    if resume:
        print(f"{_RESUMED} {Path(last_checkpoint(output_dir) or '-').name}", flush=True)
    trainer.train(resume_from_checkpoint=True if resume else None)


def _child(output_dir: Path, steps: int, *, stop: bool, resume: bool) -> subprocess.Popen[str]:
    code = (
        "import sys; from atomic_ckpt.cli.demo.trainer import child_main; "
        "child_main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == '1', sys.argv[4] == '1')"
    )
    argv = [str(output_dir), str(steps), "1" if stop else "0", "1" if resume else "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _show(root: Path) -> None:
    ckpts = CheckpointDir(root, prefix="checkpoint-")
    for e in ckpts.entries(include_staging=True):
        files = sorted(p.name for p in e.path.iterdir())
        label = "complete   " if e.status == "complete" else f"{e.status:<11}"
        shown = ", ".join(files[:4]) + (f", ... ({len(files)} files)" if len(files) > 4 else "")
        print(f"    {label} {e.path.name + '/':<50} {shown}")


def run_trainer_demo(directory: str | None, *, steps: int = 8) -> int:
    """Run the demo in ``directory`` (a fresh temporary one by default); 0 if the resumed
    run ends bit-identical to one that was never killed."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 6 or steps % 2:
        raise ValueError(f"atomic-ckpt demo --trainer needs an even --steps >= 6, got {steps!r}")
    if directory is not None:
        where = Path(directory)
        if where.exists() and (not where.is_dir() or any(where.iterdir())):
            raise FileExistsError(f"{where} is not an empty directory: give the demo a fresh one")
    _require_transformers()
    work = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="atomic_ckpt_demo_"))
    out = work / "output_dir"
    print(f"atomic_ckpt demo --trainer: Trainer output_dir is {out}\n")
    print(f"1. A Hugging Face Trainer (AtomicTrainer, tiny GPT-2) trains {steps} steps,")
    print("   saving checkpoint-N every 2 steps. During the save of step 4 we kill it with")
    print("   SIGKILL, between the model file and the optimizer file.\n")
    child = _child(out, steps, stop=True, resume=False)
    assert child.stdout is not None
    killed = False
    for line in child.stdout:
        word, at = [*line.split(), "", ""][:2]
        if word == _SAVED:
            print(f"   step {at}: checkpoint-{at} committed")
        elif word == _MIDSAVE:
            print(f"   step {at}: saving... model.safetensors written, optimizer.pt not yet")
            child.send_signal(signal.SIGKILL)
            killed = True
            print(f"   >>> SIGKILL sent to the trainer (pid {child.pid}) mid-save")
            break
    child.wait()
    if not killed:
        print("the trainer ended before it could be killed")
        return 1

    print("\n2. What the kill left in output_dir:")
    _show(out)
    print("   The half-written checkpoint-4 is a hidden .tmp- staging directory: neither")
    print("   Trainer's own listing nor resume_from_checkpoint=True will ever pick it.\n")

    print("3. The same script restarts with trainer.train(resume_from_checkpoint=True):")
    child = _child(out, steps, stop=False, resume=True)
    assert child.stdout is not None
    for line in child.stdout:
        word, at = [*line.split(), "", ""][:2]
        if word == _RESUMED:
            print(f"   resumed from {at}, the newest complete checkpoint (the leftovers removed)")
        elif word == _SAVED:
            print(f"   step {at}: checkpoint-{at} committed")
    if child.wait() != 0:
        print("the resumed trainer failed")
        return 1

    print("\n4. Final state of output_dir (save_total_limit=2):")
    _show(out)
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    for step in ckpts.steps():
        ckpts.verify(step)
    ref = work / "uninterrupted"
    plain = _child(ref, steps, stop=False, resume=False)
    plain.communicate()
    last = f"checkpoint-{steps}/model.safetensors"
    same = plain.returncode == 0 and (out / last).read_bytes() == (ref / last).read_bytes()
    print(
        "   Every checkpoint verifies, and the final weights are bit-identical to a run that\n"
        "   was never killed."
        if same
        else "   WARNING: the resumed run's weights differ from an uninterrupted run's."
    )
    shutil.rmtree(ref, ignore_errors=True)
    if directory is None:
        shutil.rmtree(work)
        print(f"\n(removed the temporary directory {work})")
    else:
        print(f"\nTry: atomic-ckpt ls --prefix checkpoint- {out}")
    return 0 if same else 1
