"""``atomic-ckpt demo``: a training run is SIGKILLed mid-save, then resumes cleanly.

The parent starts a child process that trains a tiny torch model and commits a
checkpoint every step. At one step the child stops in the middle of its save
(the model file is written, the optimizer state is not) and says so; the
parent kills it there with SIGKILL, so the kill lands mid-save every time.
Then the parent shows what is on disk, resumes from the newest complete
checkpoint, verifies it, finishes training and cleans up.
"""

from __future__ import annotations

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
_COMMITTED = "COMMITTED"


def _require_torch() -> None:
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        raise ImportError(
            "atomic-ckpt demo needs torch and safetensors: "
            "pip install torch==2.13.0 'atomic_ckpt[torch]'"
        ) from None


def _build(seed: int) -> tuple[Any, Any, Any]:
    import torch

    torch.manual_seed(seed)
    embed = torch.nn.Embedding(32, 16)
    torch.nn.init.normal_(embed.weight, std=0.1)
    head = torch.nn.Linear(16, 32, bias=False)
    head.weight = embed.weight  # tied weights, as in language models
    model = torch.nn.Sequential(embed, torch.nn.Linear(16, 16), head)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def _train_step(model: Any, opt: Any, sched: Any, step: int) -> float:
    import torch

    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 32, (64,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), (x + 1) % 32)
    opt.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    sched.step()
    return float(loss.item())


def child_main(root: str, steps: int, stop_at: int) -> None:
    """The training process: commit every step; pause mid-save at ``stop_at``."""
    from safetensors.torch import save_model

    from atomic_ckpt.torch import MODEL_FILE, write_state

    ckpts = CheckpointDir(root)
    model, opt, sched = _build(0)
    for step in range(1, steps + 1):
        loss = _train_step(model, opt, sched, step)
        with ckpts.commit(step, metadata={"loss": loss}) as path:
            if step == stop_at:
                save_model(model, str(path / MODEL_FILE))
                print(f"{_MIDSAVE} {step} {path.name}", flush=True)
                time.sleep(120)  # the parent kills us here
            write_state(path, step=step, model=model, optimizer=opt, scheduler=sched)
        print(f"{_COMMITTED} {step} {loss:.4f}", flush=True)


def _same_as_uninterrupted(model: Any, steps: int) -> bool:
    """Train the same model without interruption; are the final weights identical?"""
    import torch

    ref, opt, sched = _build(0)
    for step in range(1, steps + 1):
        _train_step(ref, opt, sched, step)
    a, b = model.state_dict(), ref.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _show(root: Path) -> None:
    for e in CheckpointDir(root).entries(include_staging=True):
        files = sorted(p.name for p in e.path.iterdir())
        label = {
            "complete": "complete   ",
            "staging": "staging    ",
            "unmarked": "NO MARKER  ",
            "invalid": "BAD MARKER ",
        }[e.status]
        print(f"    {label} {e.path.name + '/':<45} {', '.join(files)}")


def run_demo(directory: str | None, *, steps: int = 8) -> int:
    """Run the demo in ``directory`` (a fresh temporary one by default)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 3:
        raise ValueError(f"atomic-ckpt demo needs --steps of at least 3, got {steps!r}")
    if directory is not None:
        where = Path(directory)
        if where.exists() and not where.is_dir():
            raise NotADirectoryError(f"{where} is not a directory: give the demo a directory")
        root = where / "checkpoints"
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise FileExistsError(f"{root} is not empty: give the demo a fresh directory")
    _require_torch()
    stop_at = steps // 2 + 1
    work = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="atomic_ckpt_demo_"))
    root = work / "checkpoints"
    print(f"atomic_ckpt demo: checkpoints go to {root}\n")
    print(f"1. A training process starts; it commits a checkpoint after each of {steps} steps.")
    print(f"   During the save of step {stop_at} we kill it with SIGKILL, as an OOM killer,")
    print("   a preemption or a node failure would.\n")

    cmd = [
        sys.executable,
        "-c",
        "import sys; from atomic_ckpt.cli.demo.basic import child_main; "
        "child_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))",
        str(root),
        str(steps),
        str(stop_at),
    ]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    killed = False
    for line in child.stdout:
        word, at, rest = [*line.split(maxsplit=2), "", ""][:3]
        if word == _COMMITTED:
            print(f"   step {at}: trained (loss {rest.strip()}), checkpoint committed")
        elif word == _MIDSAVE:
            print(f"   step {at}: saving... model.safetensors written, optimizer not yet")
            child.send_signal(signal.SIGKILL)
            killed = True
            print(f"   >>> SIGKILL sent to the training process (pid {child.pid}) mid-save")
            break
    child.wait()
    if not killed:
        print("the training process ended before it could be killed; see its output above")
        return 1

    print("\n2. What the crash left on disk:")
    _show(root)
    print(f"   The half-written save of step {stop_at} sits in a .tmp- staging directory.")
    print("   It has no marker and no final name, so nothing will ever load it.\n")

    from atomic_ckpt.torch import resume, save_state

    ckpts = CheckpointDir(root)
    model, opt, sched = _build(1)  # fresh, different weights: resume must overwrite them
    state = resume(ckpts, model=model, optimizer=opt, scheduler=sched, verify=True)
    if state is None:
        print("no complete checkpoint to resume from")
        return 1
    print(f"3. Resume: the newest complete checkpoint is step {state.step}.")
    print("   Its files match the manifest (sizes and checksums verified) and the model,")
    print("   optimizer and scheduler were restored from it.\n")

    removed = ckpts.clean()
    print("4. Cleanup removed what the killed save left behind:")
    for path in removed:
        print(f"    {path.name}")
    print()

    print(f"5. Training continues from step {state.step + 1}:")
    for step in range(state.step + 1, steps + 1):
        loss = _train_step(model, opt, sched, step)
        save_state(
            ckpts, step, model=model, optimizer=opt, scheduler=sched, metadata={"loss": loss}
        )
        print(f"   step {step}: trained (loss {loss:.4f}), checkpoint committed")
    print("\n6. Final state of the checkpoint directory:")
    _show(root)
    for step in ckpts.steps():
        ckpts.verify(step)
    print(f"   All {len(ckpts.steps())} checkpoints verify. Latest: step {ckpts.steps()[-1]}.")
    same = _same_as_uninterrupted(model, steps)
    print(
        "   The resumed run ends with bit-identical weights to a run that was never killed."
        if same
        else "   WARNING: the resumed run's weights differ from an uninterrupted run's."
    )
    if directory is None:
        shutil.rmtree(work)
        print(f"\n(removed the temporary directory {work})")
    else:
        print(f"\nTry: atomic-ckpt ls {root}")
    return 0 if same else 1
