"""A final ``save_model`` over an earlier one whose weights were laid out the other way
(unsharded, then sharded, or back): the directory holds the new model's weight files
only, and ``from_pretrained`` loads the new model (stock ``save_pretrained`` keeps an old
``model.safetensors`` beside new shards, which ``from_pretrained`` then loads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch
from test_hf_trainer_api import make_trainer
from transformers import GPT2LMHeadModel, Trainer

import atomic_ckpt._core.l2_syscalls.fs as _fs
from atomic_ckpt.integrations.transformers import AtomicTrainer
from atomic_ckpt.integrations.transformers._weights import stale_weights

SHARD_SIZE = {"whole": None, "3 shards": "100KB", "2 shards": "150KB"}
"""``max_shard_size`` per layout of the tiny GPT-2 (about 240 KB of float32 weights)."""


def weight_files(out: Path) -> set[str]:
    return {p.name for p in out.iterdir() if p.name.startswith("model")}


def sharded_as(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make Trainer's ``save_pretrained`` lay the weights out as ``layout``."""
    real = GPT2LMHeadModel.save_pretrained
    size = SHARD_SIZE[layout]

    def save_pretrained(self: Any, *args: Any, **kwargs: Any) -> Any:
        if size is not None:
            kwargs["max_shard_size"] = size
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GPT2LMHeadModel, "save_pretrained", save_pretrained)


def two_saves(
    out: Path, first: str, then: str, monkeypatch: pytest.MonkeyPatch, *, stock: bool = False
) -> dict[str, torch.Tensor]:
    """``save_model`` laid out as ``first``, the weights changed, again as ``then``;
    returns the weights of the second save."""
    trainer = make_trainer(out)
    if stock:
        trainer.__class__ = Trainer  # the same trainer without the mixin
    with monkeypatch.context() as m:
        sharded_as(first, m)
        trainer.save_model()
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
    with monkeypatch.context() as m:
        sharded_as(then, m)
        trainer.save_model()
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def loads_as(out: Path, expected: dict[str, torch.Tensor]) -> bool:
    loaded = GPT2LMHeadModel.from_pretrained(out).state_dict()
    return all(loaded[k].equal(v) for k, v in expected.items())


CHANGES = [("whole", "3 shards"), ("3 shards", "whole"), ("3 shards", "2 shards")]


@pytest.mark.parametrize(("first", "then"), CHANGES)
def test_a_final_save_in_another_layout_leaves_only_the_new_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, then: str
) -> None:
    """After the second save the weight files are exactly those it wrote (no old
    ``model.safetensors``, shard or index), and ``from_pretrained`` loads the new model."""
    out = tmp_path / "out"
    new = two_saves(out, first, then, monkeypatch)
    expected = {"model.safetensors"} if then == "whole" else set()
    if then != "whole":
        n = int(then[0])
        expected = {f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)}
        expected.add("model.safetensors.index.json")
    assert weight_files(out) == expected
    assert loads_as(out, new)


@pytest.mark.parametrize(("first", "then"), CHANGES)
def test_the_final_save_leaves_no_more_stale_weights_than_stock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, then: str
) -> None:
    """Stock ``Trainer.save_model`` the same two saves into another directory: what ours
    leaves is a subset of what stock leaves, and where stock loads the old model (an old
    ``model.safetensors`` beside new shards) ours loads the new one."""
    ours, stock = tmp_path / "ours", tmp_path / "stock"
    new = two_saves(ours, first, then, monkeypatch)
    stock_new = two_saves(stock, first, then, monkeypatch, stock=True)
    assert weight_files(ours) <= weight_files(stock)
    assert loads_as(ours, new)
    if first == "whole":  # what stock gets wrong: model.safetensors is loaded first
        assert "model.safetensors" in weight_files(stock)
        assert not loads_as(stock, stock_new)


def test_stale_weights_are_removed_after_the_new_ones_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old ``model.safetensors`` is unlinked only after every new file is renamed in
    and the directory fsynced, and the unlink is followed by a directory fsync."""
    out = tmp_path / "out"
    trainer = make_trainer(out)
    trainer.save_model()
    calls: list[tuple[str, str]] = []
    for name in ("fsync_dir", "rename", "unlink"):
        real = getattr(_fs, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append((_name, str(Path(args[-1] if _name == "rename" else args[0]))))
            return _real(*args)

        monkeypatch.setattr(_fs, name, spy)
    sharded_as("3 shards", monkeypatch)
    trainer.save_model()
    unlinked = ("unlink", str(out / "model.safetensors"))
    assert unlinked in calls  # the fault point this test is about was reached
    at = calls.index(unlinked)
    renames = [i for i, c in enumerate(calls) if c[0] == "rename" and c[1].startswith(str(out))]
    assert renames
    assert max(renames) < at
    assert ("fsync_dir", str(out)) in calls[max(renames) : at]
    assert ("fsync_dir", str(out)) in calls[at:]


def test_stale_weights_follows_stock_and_adds_the_other_layouts_entry_point() -> None:
    """The rule on names alone: stock's shards of the same stem, plus the unsharded file
    or the index of the other layout; never a file of another name or the new ones."""
    present = [
        "model.safetensors",
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
        "model-00001-of-00002.safetensors",
        "training_args.bin",
        "config.json",
        "pytorch_model.bin",
    ]
    sharded = ["model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    assert stale_weights(sharded, present) == [
        "model-00001-of-00003.safetensors",
        "model.safetensors",
    ]
    assert stale_weights(["model.safetensors", "training_args.bin"], present) == [
        "model-00001-of-00002.safetensors",
        "model-00001-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    assert stale_weights(["training_args.bin", "config.json"], present) == []
    assert AtomicTrainer  # the integration imported


class Crash(BaseException):
    """The process dying at the fault point (a BaseException: nothing catches it)."""


def test_a_crash_before_the_stale_weights_go_leaves_a_whole_model_and_the_next_save_removes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsharded, then sharded, dying at the unlink of the old ``model.safetensors``: the
    directory still loads a whole model (the old one, which from_pretrained reads first),
    and the next final save there removes the stale file and loads the new model."""
    out = tmp_path / "out"
    trainer = make_trainer(out)
    trainer.save_model()
    real_unlink = _fs.unlink
    fired: list[Path] = []

    def unlink(path: Path) -> None:
        if Path(path) == out / "model.safetensors" and not fired:
            fired.append(Path(path))
            raise Crash
        real_unlink(path)

    with monkeypatch.context() as m:
        m.setattr(_fs, "unlink", unlink)
        sharded_as("3 shards", m)
        with pytest.raises(Crash):
            trainer.save_model()
    assert fired == [out / "model.safetensors"]  # the fault fired
    assert "model.safetensors" in weight_files(out)
    GPT2LMHeadModel.from_pretrained(out)  # a whole model loads
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
    sharded_as("3 shards", monkeypatch)
    trainer.save_model()
    assert "model.safetensors" not in weight_files(out)
    assert loads_as(out, trainer.model.state_dict())
