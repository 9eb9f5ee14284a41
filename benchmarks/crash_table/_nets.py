"""The small ``nn.Module`` of the torch.save, step-directory and DCP rows, and its states.

Save ``k`` writes the state a few steps of Adam leave from seed ``k``: the model's
weights, the optimizer's state and the step; the step of saves 1 and 2 is 1 (save 2
rewrites it), of save 3, 2. Every file of a save is a few KiB, so a trace stays short.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import _common
from _common import digest

STEPS = {1: 1, 2: 1, 3: 2}
"""The step each save writes: save 2 rewrites save 1's step."""


def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A model and its optimizer, as a resuming job builds them before loading."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def trained(save: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model and optimizer that save ``save`` writes: seeded, so the same every run."""
    model, optim = fresh()
    g = torch.Generator().manual_seed(save)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    for _ in range(2):
        x = torch.randn(8, 16, generator=g)
        loss = (model(x) - x).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    return model, optim


def state_digest(model: nn.Module, optim: torch.optim.Optimizer, step: int) -> str:
    """The digest of a training state, as saved and as loaded back."""
    return digest({"model": model.state_dict(), "optim": optim.state_dict(), "step": step})


def state(save: int) -> tuple[dict[str, Any], str]:
    """(what save ``save`` writes: model, optim and step; its digest)."""
    model, optim = trained(save)
    step = STEPS[save]
    return (
        {"model": model.state_dict(), "optim": optim.state_dict(), "step": step},
        state_digest(model, optim, step),
    )


def load(saved: dict[str, Any]) -> str:
    """Load ``saved`` (model, optim, step) as a resuming job does; the digest of the result."""
    model, optim = fresh()
    model.load_state_dict(saved["model"])
    optim.load_state_dict(saved["optim"])
    return state_digest(model, optim, int(saved["step"]))


def three_saves(root: Path, save: Callable[[int, dict[str, Any]], None], limit: int) -> None:
    """The workload of the small-model rows: saves 1 and 2 (the rewrite) through
    ``save(step, state)``, then save 3 on a disk that fills up at ``limit`` bytes a file."""
    _common.open_journal(root)
    for k in (1, 2, 3):
        saved, d = state(k)
        _common.begin(root, k, d)
        if k < 3:
            save(STEPS[k], saved)
            _common.returned(root, k)
        else:
            _common.failing_save(root, k, limit, lambda: save(STEPS[3], saved))  # noqa: B023 - called at once


def file_size(obj: Any) -> int:
    """The size of ``torch.save(obj)``: where to put the full disk of a failing save."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return len(buf.getvalue())


def judged_load(root: Path, where: str, load_it: Callable[[], str]) -> str:
    """Run ``load_it`` (the framework's load, returning the loaded state's digest) and
    judge the result; any error while loading is a violation."""
    try:
        loaded = load_it()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is one; any failure is the finding
        raise _common.Violation(f"cannot load {where}: {type(exc).__name__}: {exc}") from exc
    return _common.judge(root, loaded, where)
