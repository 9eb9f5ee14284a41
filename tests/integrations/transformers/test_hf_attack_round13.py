"""Attacks on issue 35's promises for the Hugging Face integration (round 13): the final
save, the starts that clean, as a new user's script meets them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from packaging.version import Version

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer_api import make_trainer  # noqa: E402

from atomic_ckpt import TMP_INFIX  # noqa: E402


def test_the_final_save_into_a_symlinked_output_dir_works(tmp_path: Path) -> None:
    """``output_dir`` a symlink to the real directory (``out -> /scratch/run1``, common on
    clusters): training commits its checkpoints there, and the final ``save_model``,
    ``save_state`` and ``save_metrics`` must too, as stock's do. They raised
    ``NotADirectoryError`` from the directory fsync (``O_NOFOLLOW`` on the link) after the
    files had been renamed: the script died at its last line."""
    real = tmp_path / "scratch" / "run1"
    real.mkdir(parents=True)
    out = tmp_path / "out"
    out.symlink_to(real)
    trainer = make_trainer(out, max_steps=2, save_steps=2)
    trainer.train()
    trainer.save_model()
    trainer.save_metrics("train", {"train_loss": 1.5})
    trainer.save_state()
    assert out.is_symlink()
    names = set(os.listdir(real))
    for name in ("model.safetensors", "config.json", "trainer_state.json", "all_results.json"):
        assert name in names, name
    assert [n for n in names if TMP_INFIX in n and "root.lock" not in n] == []
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    for name, tensor in trainer.model.state_dict().items():
        assert loaded.state_dict()[name].equal(tensor), name


def test_save_model_into_a_new_directory_through_a_symlinked_parent(tmp_path: Path) -> None:
    """``save_model("link/final")``: the final directory is made below a symlinked parent
    and the model lands in it, whole."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    trainer = make_trainer(tmp_path / "out", max_steps=1, save_steps=10)
    trainer.train()
    trainer.save_model(str(tmp_path / "link" / "final"))
    transformers.GPT2LMHeadModel.from_pretrained(real / "final")


def test_the_mixin_after_trainer_in_the_bases_is_refused() -> None:
    """A new user writes ``class T(SFTTrainer, AtomicCheckpointMixin)`` (the mixin last,
    as mixins often go): every method of ``Trainer`` then comes before the mixin's, so
    checkpoints are written straight into ``checkpoint-N`` and nothing says so. The class
    statement must fail, naming the order the guide asks for."""
    from transformers import Trainer

    from atomic_ckpt.integrations.transformers import AtomicCheckpointMixin

    class MyTrainer(Trainer):
        pass

    with pytest.raises(TypeError, match="AtomicCheckpointMixin first"):

        class Wrong(MyTrainer, AtomicCheckpointMixin):
            pass

    class Right(AtomicCheckpointMixin, MyTrainer):  # still fine, and so is a subclass of it
        pass

    class Sub(Right):
        pass

    assert Sub._save_checkpoint is AtomicCheckpointMixin._save_checkpoint


def refuse_symlinks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.symlink`` refused as vfat, exFAT or some SMB mounts refuse it (EPERM; vfat
    itself could not be mounted here: the container's kernel has no vfat module)."""
    import errno

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "symlink", refuse)


def test_checkpoints_on_a_filesystem_without_symlinks_save_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock Trainer saves on vfat/exFAT/SMB; AtomicTrainer must too (issue 35: where it is
    silent, what a user expects): each checkpoint committed whole, rotation, and the
    automatic resume."""
    refuse_symlinks(monkeypatch)
    out = tmp_path / "out"
    make_trainer(out, max_steps=4, save_steps=2, save_total_limit=1).train()
    assert sorted(n for n in os.listdir(out) if TMP_INFIX not in n) == ["checkpoint-4"]
    assert sorted(os.listdir(out / "checkpoint-4"))[:2] == ["checkpoint_complete", "config.json"]
    trainer = make_trainer(out, max_steps=6, save_steps=2, save_total_limit=1)
    trainer.train(resume_from_checkpoint="true")
    assert trainer.state.global_step == 6
    assert sorted(n for n in os.listdir(out) if TMP_INFIX not in n) == ["checkpoint-6"]
    trainer.save_model()
    trainer.save_state()
    transformers.GPT2LMHeadModel.from_pretrained(out)


def test_the_best_checkpoint_is_kept_on_a_filesystem_without_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_best_model_at_end`` with ``save_total_limit=1`` where symlinks are refused: the
    best checkpoint is kept (as Trainer counts it), and ``checkpoint_best`` is the core's
    pointer file naming it."""
    out = tmp_path / "out"
    kw = {
        "save_steps": 2,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "save_total_limit": 1,
        "load_best_model_at_end": True,
        "metric_for_best_model": "loss",
        "greater_is_better": True,  # the first evaluation is the best: kept beside the last
    }
    refuse_symlinks(monkeypatch)
    trainer = make_trainer(out, max_steps=6, **kw)
    trainer.train()
    best = Path(trainer.state.best_model_checkpoint or "")
    assert best.name in os.listdir(out)
    assert (best / "checkpoint_complete").exists()
    assert (out / "checkpoint_best").read_text() == f"{best.name}\n"


STOCK_RESUMES_ON_CPU_RANKS = Version(transformers.__version__) >= Version("5.18")
"""Before 5.18 Trainer itself cannot resume a multi-process run on CPU: it loads
``optimizer.pt`` with ``map_location=args.device``, ``cpu:0``, which torch refuses ("don't
know how to restore data location"), with or without atomic_ckpt (as in
test_hf_verified_resume.py)."""


def test_two_ranks_on_a_filesystem_without_symlinks_save_and_resume(tmp_path: Path) -> None:
    """2 gloo ranks where ``symlink()`` is refused: both write into the real
    ``checkpoint-N`` directory of the staging dir, rank 0 moves its entries up, each
    checkpoint holds both ranks' RNG states, and the resume from ``True`` goes on (where
    Trainer itself can resume a multi-process CPU run: see STOCK_RESUMES_ON_CPU_RANKS)."""
    import json

    from hf_launch import complete_steps, launch

    out = tmp_path / "out"
    cfg = {"out": str(out), "steps": 4, "save_steps": 2, "limit": 1, "no_symlinks": True}
    run = launch(cfg, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    assert complete_steps(out) == [4]
    names = os.listdir(out / "checkpoint-4")
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= set(names), names
    assert "checkpoint-4" not in names
    if not STOCK_RESUMES_ON_CPU_RANKS:
        return
    result = tmp_path / "result.json"
    cfg = {**cfg, "steps": 6, "resume": True, "result": str(result)}
    run = launch(cfg, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    assert json.loads(result.read_text())["global_step"] == 6
    assert complete_steps(out) == [6]
