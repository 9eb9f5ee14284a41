"""Power-loss simulation of torch DCP saves through :class:`atomic_ckpt.dcp.AtomicWriter`.

A single-process DCP save (``no_dist``) run under :func:`~atomic_ckpt.testing.explore`
records DCP's own writes (its shard files, ``.metadata`` and its rename) as the
unsynced writes of a save function, and the writer's fsyncs and commit through the
hooked :mod:`atomic_ckpt._core.l2_syscalls.fs`, so every crash state of a DCP save is checked::

    from atomic_ckpt.testing import explore
    from atomic_ckpt.testing.dcp import dcp_saver, loads_exactly

    states = [{"w": torch.randn(8)}]
    report = explore(dcp_saver(states[0], step=1), loads_exactly(states))
    assert report.ok, report

Importing this module imports torch (``pip install 'atomic_ckpt[dcp]'``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

from atomic_ckpt import CheckpointDir
from atomic_ckpt.dcp import AtomicWriter
from atomic_ckpt.testing._results import Checker, CrashState
from atomic_ckpt.testing.invariants import check_invariants

__all__ = ["dcp_saver", "loads_exactly"]


def dcp_saver(
    state_dict: dict[str, Any], *, step: int = 1, **options: Any
) -> Callable[[CheckpointDir], Path]:
    """A save function for :func:`~atomic_ckpt.testing.explore`: one single-process
    ``dcp.save(state_dict, storage_writer=AtomicWriter(ckpts, step, **options))``."""

    def save_it(ckpts: CheckpointDir) -> Path:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled": on purpose
            save(state_dict, storage_writer=AtomicWriter(ckpts, step, **options), no_dist=True)
        return ckpts.path_of(step)

    return save_it


def loads_exactly(states: Sequence[dict[str, Any]]) -> Checker:
    """A checker: :func:`~atomic_ckpt.testing.check_invariants`, then plain ``dcp.load``
    of every complete checkpoint of the crash state, which must equal one of
    ``states`` tensor for tensor (flat dicts of tensors)."""

    def check(state: CrashState) -> None:
        check_invariants(state)
        for ckpt in state.checkpoints().checkpoints():
            target = {k: torch.zeros_like(v) for k, v in states[0].items()}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    load(target, checkpoint_id=ckpt.path, no_dist=True)
            except CheckpointException as exc:  # a BaseException: explore would not catch it
                raise AssertionError(
                    f"checkpoint {ckpt.path.name} is complete but does not load: {exc}"
                ) from None
            if not any(_equal(target, s) for s in states):
                raise AssertionError(
                    f"checkpoint {ckpt.path.name} loads, but as none of the saved states"
                )

    return check


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
