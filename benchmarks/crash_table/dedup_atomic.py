"""Row "write only what changed (carry + dedup)", with atomic_ckpt: the step-directory row's
three files beside a frozen one (``frozen.pt``, the same in every save). Save 1 writes it;
save 2 (a rewrite of step 1) writes it again inside ``begin(1, dedup=True)``, which links
it to the older save's; saves 3 (step 2, failing on a full disk) and 4 (step 2 again)
carry it from step 1 (``Commit.carry``) with ``dedup=True``; then ``prune(keep_last=1)``
deletes the source. Resume from ``resume_point()``; the frozen file must be whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import _common
import _nets
from atomic_ckpt import CheckpointDir
from stepdir_plain import failing_limit, read_files, write_files

FROZEN_FILE = "frozen.pt"
PLAN = ((1, 1, False), (2, 1, False), (3, 2, True), (4, 2, True))
"""(save, step, carry): saves 1 and 2 write frozen.pt (2 rewrites step 1), 3 and 4 carry it;
save 3 fails on a full disk."""


def frozen() -> torch.Tensor:
    """The frozen weights every save holds."""
    return torch.arange(1024, dtype=torch.float32)


def states() -> list[tuple[int, int, bool, dict[str, Any], str]]:
    """(save, step, carry, what it writes, its digest) for each save of :data:`PLAN`."""
    out = []
    for k, step, carry in PLAN:
        model, optim = _nets.trained(k)
        saved = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
        out.append((k, step, carry, saved, _nets.state_digest(model, optim, step)))
    return out


def run_saves(root: Path, save: Any) -> None:
    """The journal around ``save(step, saved, carry)`` for each save (3 fails part-way)."""
    _common.open_journal(root)
    for k, step, carry, saved, d in states():
        _common.begin(root, k, d)
        if k == 3:
            _common.failing_save(root, k, failing_limit(), lambda: save(step, saved, carry))  # noqa: B023
        else:
            save(step, saved, carry)
            _common.returned(root, k)


def workload(root: Path) -> None:
    ckpts = CheckpointDir(root / "ckpt")
    linked: dict[str, Any] = {}

    def save(step: int, saved: dict[str, Any], carry: bool) -> None:
        with ckpts.begin(step, dedup=True) as commit:
            if carry:
                linked[f"carry {step}"] = commit.carry(FROZEN_FILE, from_=1)
            else:
                torch.save(frozen(), commit.path / FROZEN_FILE)
            write_files(commit.path, saved)
        linked[f"dedup {step}"] = commit.deduped

    run_saves(root, save)
    ckpts.prune(keep_last=1)  # the source of the carried file goes
    print(json.dumps(linked))


def check_frozen(path: Path, where: str) -> None:
    """A Violation unless ``path`` holds the frozen weights."""
    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:
        raise _common.Violation(f"cannot load {where}: {type(exc).__name__}: {exc}") from exc
    if not torch.equal(loaded, frozen()):
        raise _common.Violation(f"bytes of no single save: {where} holds other frozen weights")


def check(root: Path) -> str:
    """Resume from the newest complete checkpoint; its frozen file too must be whole."""
    try:
        found = CheckpointDir(root / "ckpt").resume_point()
    except Exception as exc:
        raise _common.Violation(f"resume_point() raised {type(exc).__name__}: {exc}") from exc
    if found is None:
        return _common.judge(root, None, "ckpt/")
    where = f"ckpt/{found.path.name}/"
    verdict = _nets.judged_load(root, where, lambda: read_files(found.path))
    check_frozen(found.path / FROZEN_FILE, where + FROZEN_FILE)
    return verdict


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
