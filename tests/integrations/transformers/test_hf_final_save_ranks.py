"""The final ``save_model`` with several ranks (2 CPU processes, gloo): collective exactly
where stock ``Trainer.save_model`` is, so a script that saves on rank 0 alone under plain
DDP finishes, with the whole model in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
from hf_launch import launch
from test_hf_push_to_hub import hub  # noqa: F401  (the Hub stand-in fixture)

DEADLINE = 150.0
"""Seconds before a rank still running is killed: a hang fails the test, never stalls it."""


def test_save_model_on_rank0_alone_under_ddp_finishes_with_the_whole_model(
    tmp_path: Path,
) -> None:
    """Plain DDP, ``if trainer.is_world_process_zero(): trainer.save_model(final)``: stock
    writes from rank 0 without any collective, so ours must too (a broadcast or barrier
    there waits for ranks that never come); the model saved is the trained one."""
    out, final = tmp_path / "out", tmp_path / "final"
    cfg = {"out": str(out), "steps": 2, "save_steps": 2, "final_rank0": str(final)}
    run = launch(cfg, world=2, tmp=tmp_path, deadline=DEADLINE)
    assert run.ok, run.logs
    assert (tmp_path / "final.done").read_text() == "saved"
    saved = safetensors.torch.load_file(final / "model.safetensors")
    trained = safetensors.torch.load_file(out / "checkpoint-2" / "model.safetensors")
    assert saved.keys() == trained.keys()
    for name, tensor in trained.items():
        assert saved[name].equal(tensor), name
    assert not [p.name for p in final.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize(
    ("setting", "collective"),
    [
        ("plain", False),
        ("deepspeed", True),
        ("fsdp_full", True),
        ("fsdp_sharded", False),
        ("sharded_at_load", True),
    ],
)
def test_save_model_is_collective_exactly_where_stock_is(setting: str, collective: bool) -> None:
    """Stock ``save_model`` gathers on every rank under DeepSpeed, FSDP with
    ``FULL_STATE_DICT`` (and XLA, SageMaker MP) and for a model sharded at load time; under
    plain DDP, and FSDP saving sharded state (which stock's save_model skips), rank 0 writes
    alone."""
    from types import SimpleNamespace

    from atomic_ckpt.integrations.transformers._compat import save_model_is_collective

    trainer = SimpleNamespace(
        is_deepspeed_enabled=setting == "deepspeed",
        is_fsdp_enabled=setting.startswith("fsdp"),
        is_distributed_loading_by_transformers=setting == "sharded_at_load",
        accelerator=SimpleNamespace(
            state=SimpleNamespace(
                fsdp_plugin=SimpleNamespace(
                    state_dict_type="StateDictType.FULL_STATE_DICT"
                    if setting == "fsdp_full"
                    else "StateDictType.SHARDED_STATE_DICT"
                )
            )
        ),
    )
    assert save_model_is_collective(trainer) is collective


def test_push_to_hubs_local_save_on_rank0_alone_makes_no_collective(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hub: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    """``push_to_hub()`` saves the model first (``save_model(_internal_call=True)``); as rank
    0 of a plain-DDP run (here posed: a distributed world whose collectives raise) that save
    makes no broadcast and no barrier, and the push uploads the model."""
    import torch.distributed as dist
    from test_hf_trainer_api import make_trainer

    from atomic_ckpt.integrations.transformers import _final

    out = tmp_path / "out"
    hub.out = out
    trainer = make_trainer(out, push_to_hub=True, hub_model_id="someone/tiny")
    collectives: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        collectives.append("collective")
        raise AssertionError("a collective on rank 0 alone waits forever")

    monkeypatch.setattr(_final, "_distributed", lambda: True)
    monkeypatch.setattr(_final, "_barrier", refuse)
    monkeypatch.setattr(dist, "broadcast_object_list", refuse)
    trainer.push_to_hub()
    assert collectives == []
    assert (out / "model.safetensors").is_file()
    assert "model.safetensors" in hub.uploads[-1].files
