"""``AtomicTrainer`` in this process (tiny GPT-2, CPU): rotation through the library's
retention, the best checkpoint, ``save_only_model``, ``last_checkpoint``, the version
check, and what Trainer's and Accelerate's own listings make of a root mid-commit."""

from __future__ import annotations

import inspect
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from hf_trainer_child import dataset, tokenizer  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

try:
    from transformers.trainer_utils import rotate_checkpoints, sort_checkpoints
except ImportError:  # transformers < 5.5: the same listings, as Trainer's own methods
    from types import SimpleNamespace

    from transformers import Trainer

    class _Listing:
        """What Trainer's _sorted_checkpoints and _rotate_checkpoints read of a Trainer."""

        _sorted_checkpoints = Trainer._sorted_checkpoints
        _rotate_checkpoints = Trainer._rotate_checkpoints

        def __init__(self, save_total_limit: int | None = None) -> None:
            self.args = SimpleNamespace(save_total_limit=save_total_limit)
            self.state = SimpleNamespace(best_model_checkpoint=None)

    def sort_checkpoints(output_dir: str, use_mtime: bool = False) -> list[str]:
        return _Listing()._sorted_checkpoints(output_dir=output_dir, use_mtime=use_mtime)  # type: ignore[no-any-return]

    def rotate_checkpoints(output_dir: str, save_total_limit: int | None = None) -> None:
        _Listing(save_total_limit)._rotate_checkpoints(output_dir=output_dir)


from atomic_ckpt import (  # noqa: E402
    BEST_LINK,
    MARKER,
    TMP_INFIX,
    CheckpointDir,
    UnmarkedCheckpointsError,
    UnusableCheckpointsError,
)
from atomic_ckpt.integrations import UntestedVersionWarning  # noqa: E402
from atomic_ckpt.integrations import transformers as integration  # noqa: E402
from atomic_ckpt.integrations.transformers import (  # noqa: E402
    AtomicTrainer,
    check_transformers,
    last_checkpoint,
)

torch.set_num_threads(1)


def make_trainer(out: Path, **args: Any) -> AtomicTrainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    options: dict[str, Any] = {
        "per_device_train_batch_size": 2,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "save_strategy": "steps",
        "learning_rate": 1e-2,
        **args,
    }
    data = dataset()
    return AtomicTrainer(
        model=model,
        args=TrainingArguments(output_dir=str(out), **options),
        train_dataset=data,
        eval_dataset=data[:8],
        processing_class=tokenizer(),
    )


def commit_steps(ckpts: CheckpointDir, *steps: int) -> None:
    for step in steps:
        with ckpts.commit(step) as path:
            (path / "model.safetensors").write_bytes(b"%d" % step)


def test_exp1_rotation_keeps_complete_checkpoints_and_never_touches_a_live_save(
    tmp_path: Path,
) -> None:
    """exp1 of INTEGRATIONS.md: complete 1, 2, 3, an unmarked checkpoint-9 and a commit of
    4 in flight; a save of step 5 with save_total_limit=2 keeps the two newest complete
    ones, leaves the live staging dir and the unmarked dir alone, and resuming picks the
    newest complete checkpoint, not checkpoint-9 (which Trainer's own function returns)."""
    out = tmp_path / "out"
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    commit_steps(ckpts, 1, 2, 3)
    (out / "checkpoint-9").mkdir()
    (out / "checkpoint-9" / "model.safetensors").write_bytes(b"torn")
    live = ckpts.begin(4)
    (live.path / "model.safetensors").write_bytes(b"4")

    trainer = make_trainer(out, save_total_limit=2, max_steps=5)
    trainer.create_optimizer_and_scheduler(num_training_steps=5)
    trainer.state.global_step = 5
    trainer._save_checkpoint(trainer.model, None)

    assert ckpts.steps() == [3, 5]
    assert (out / "checkpoint-9" / "model.safetensors").read_bytes() == b"torn"
    assert last_checkpoint(out) == str(out / "checkpoint-5")
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-9")  # why ours exists
    live.publish()  # the live save was never touched
    assert ckpts.steps() == [3, 4, 5]
    saved = set(os.listdir(out / "checkpoint-5"))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= saved
    assert {"trainer_state.json", "tokenizer.json", "config.json", MARKER} <= saved
    assert not any(TMP_INFIX in n or n.startswith("checkpoint-") for n in saved)


def test_trainers_and_accelerates_listings_of_a_root_mid_commit(tmp_path: Path) -> None:
    """Mid-commit (a staging dir and its lock beside complete checkpoints), Trainer's own
    sort_checkpoints, rotate_checkpoints and get_last_checkpoint see the complete ones
    only, and Accelerate's digit sort does not crash (no entry without digits)."""
    out = tmp_path / "out"
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    commit_steps(ckpts, 1, 2, 3)
    with ckpts.commit(4) as staging:
        (staging / "model.safetensors").write_bytes(b"4")
        entries = sorted(os.listdir(out))
        assert len(entries) == 5  # three checkpoints, the staging dir, its lock
        complete = [str(out / f"checkpoint-{s}") for s in (1, 2, 3)]
        assert sort_checkpoints(str(out)) == complete
        assert sort_checkpoints(str(out), use_mtime=True) == complete
        assert get_last_checkpoint(str(out)) == complete[-1]
        rotate_checkpoints(str(out), save_total_limit=2)
        assert ckpts.steps() == [2, 3]
        assert staging.is_dir()
        # Accelerate (automatic naming) sorts every entry by its first digit run.
        for name in os.listdir(out):
            assert re.findall(r"[\/]?([0-9]+)(?=[^\/]*$)", str(out / name)), name
    assert ckpts.steps() == [2, 3, 4]
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]


def test_best_checkpoint_is_kept_pointed_at_and_recorded_with_its_real_path(
    tmp_path: Path,
) -> None:
    """load_best_model_at_end with save_total_limit=1: the best checkpoint is named by
    checkpoint_best and kept, trainer_state.json records its path in output_dir (not the
    staging dir), and at the end only the best one is left, as Trainer does."""
    out = tmp_path / "out"
    trainer = make_trainer(
        out,
        max_steps=6,
        save_steps=2,
        eval_steps=2,
        eval_strategy="steps",
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
    )
    trainer.train()
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    best = trainer.state.best_model_checkpoint
    assert best is not None
    assert Path(best).parent == out
    assert ckpts.steps() == [int(Path(best).name.split("-")[1])]
    assert os.readlink(out / BEST_LINK) == Path(best).name
    state = json.loads((Path(best) / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == best  # as it was when it became the best
    assert trainer.args.save_total_limit == 1  # restored after train()


def test_save_only_model_commits_a_model_only_checkpoint_marked_not_resumable(
    tmp_path: Path,
) -> None:
    """save_only_model=True: the checkpoint holds the model, tokenizer and trainer state,
    no optimizer or RNG state, and its manifest says it cannot be resumed from."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, save_steps=1, save_only_model=True, save_total_limit=1).train()
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    assert ckpts.steps() == [2]
    files = set(os.listdir(ckpts.path_of(2)))
    assert "model.safetensors" in files
    assert "trainer_state.json" in files
    assert not {"optimizer.pt", "rng_state.pth", "scheduler.pt"} & files
    ckpt = ckpts.verify(2)
    assert ckpt.manifest.metadata["resumable"] is False
    assert ckpt.manifest.metadata["global_step"] == 2


def test_last_checkpoint_and_resume_true_on_roots_without_a_complete_checkpoint(
    tmp_path: Path,
) -> None:
    """No output dir: None, and train(resume_from_checkpoint=True) raises ValueError;
    checkpoint-N written before atomic_ckpt and nothing complete: a clear refusal."""
    out = tmp_path / "out"
    assert last_checkpoint(out) is None
    with pytest.raises(ValueError, match=r"^No valid checkpoint found in output directory \("):
        make_trainer(out, max_steps=1).train(resume_from_checkpoint=True)
    (out / "checkpoint-3").mkdir(parents=True)
    with pytest.raises(UnmarkedCheckpointsError, match="mark-complete"):
        last_checkpoint(out)


def test_last_checkpoint_refuses_a_root_of_checkpoints_it_cannot_read(tmp_path: Path) -> None:
    """checkpoint-N whose marker is of a newer format version, nothing else: the resume is
    refused (UnusableCheckpointsError saying why), not a fresh start over it."""
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / "checkpoint_complete").write_text(
        '{"format": "atomic_ckpt", "version": 3}'
    )
    with pytest.raises(UnusableCheckpointsError, match="version 3"):
        last_checkpoint(out)
    with pytest.raises(UnusableCheckpointsError, match="version 3"):
        make_trainer(out, max_steps=1).train(resume_from_checkpoint=True)


def test_clean_on_resume_removes_a_killed_save_but_never_a_live_one(tmp_path: Path) -> None:
    """last_checkpoint(clean=True) removes an orphaned staging dir (its writer is gone)
    and leaves a live one alone."""
    out = tmp_path / "out"
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    commit_steps(ckpts, 1)
    live = ckpts.begin(2)
    orphan = out / f"{TMP_INFIX}checkpoint-3.{'ab' * 16}"
    orphan.mkdir()
    (out / f"{orphan.name}.lock").write_bytes(b"")  # its dead writer's lock file
    assert last_checkpoint(out, clean=True) == str(out / "checkpoint-1")
    assert not orphan.exists()
    assert live.path.is_dir()
    live.abort()


def test_an_untested_version_warns_and_a_changed_private_method_is_refused() -> None:
    """A transformers version outside the tested range only warns, naming the range and
    the private methods; a Trainer whose private methods changed is refused at import."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_transformers(transformers.__version__) is False  # the installed one
    for untested in ("4.46.3", "5.25.0", "6.0.0"):
        with pytest.warns(UntestedVersionWarning) as caught:
            assert check_transformers(untested) is True
        message = str(caught[0].message)
        assert f"transformers {untested} is installed" in message
        assert "tested with transformers 4.47.0 to 5.24.x" in message
        assert "Trainer._save_checkpoint, Trainer._get_output_dir" in message

    class Changed:
        def _save_checkpoint(self, model: Any, trial: Any, metrics: Any = None) -> None: ...

        def _get_output_dir(self, trial: Any) -> str:
            return ""

    with pytest.raises(ImportError, match="_save_checkpoint"):
        check_transformers(transformers.__version__, Changed)
    assert set(integration.PRIVATE_METHODS) == {
        "_save_checkpoint",
        "_get_output_dir",
        "_push_from_checkpoint",
        "_load_from_checkpoint",
        "_load_optimizer_and_scheduler",
        "_load_rng_state",
    }


def test_the_root_lock_is_gone_once_a_commit_returns_and_old_names_are_still_cleaned(
    tmp_path: Path,
) -> None:
    """A root at rest holds its checkpoints only; entries of the plain form (0.1's, and what
    plain roots write: ``<name>.tmp-<hex>``, its lock) that a killed save left in this
    prefixed root are still removed by clean()."""
    ckpts = CheckpointDir(tmp_path / "out", prefix="checkpoint_")
    commit_steps(ckpts, 1)
    assert os.listdir(ckpts.root) == ["checkpoint_1"]
    old = ckpts.root / f"checkpoint_2{TMP_INFIX}{'cd' * 16}"
    old.mkdir()
    (ckpts.root / f"{old.name}.lock").write_bytes(b"")
    assert sorted(p.name for p in ckpts.clean()) == [old.name, f"{old.name}.lock"]
    assert os.listdir(ckpts.root) == ["checkpoint_1"]


def test_the_signature_is_trainers_with_the_mixins_options() -> None:
    """inspect.signature (IDEs, docs, tools) shows Trainer's parameters, then the mixin's
    keyword options, for AtomicTrainer and a user's mixin class; a subclass with its own
    __init__ shows that one."""
    from transformers import Trainer

    from atomic_ckpt.integrations.transformers import AtomicCheckpointMixin

    stock = list(inspect.signature(Trainer).parameters.values())
    ours = inspect.signature(AtomicTrainer).parameters
    assert list(ours.values())[: len(stock)] == stock
    assert list(ours)[len(stock) :] == [
        "verify_on_resume",
        "durable",
        "dedup",
        "replace_unusable",
    ]
    assert ours["durable"].kind is inspect.Parameter.KEYWORD_ONLY

    class Mine(AtomicCheckpointMixin, Trainer):
        pass

    class Own(AtomicTrainer):
        def __init__(self, model: Any) -> None: ...

    assert inspect.signature(Mine) == inspect.signature(AtomicTrainer)
    assert list(inspect.signature(Own).parameters) == ["model"]
