"""What an example script (``run_clm.py``-style) meets with ``AtomicTrainer``: the final
``save_model``/``save_state`` leave every file whole and durable, ``--resume_from_checkpoint
True`` from the command line is the automatic resume, and every start removes what killed
saves left in ``output_dir``."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer_api import make_trainer  # noqa: E402
from transformers import HfArgumentParser, Trainer, TrainingArguments  # noqa: E402

import atomic_ckpt._core.l2_syscalls.fs as _fs  # noqa: E402
from atomic_ckpt import MARKER, TMP_INFIX, CheckpointDir  # noqa: E402
from atomic_ckpt.integrations.transformers import AtomicTrainer, last_checkpoint  # noqa: E402

LOGGER = "atomic_ckpt.integrations.transformers"


def orphan_of_a_killed_save(out: Path, step: int) -> list[Path]:
    """The hidden staging dir and unlocked lock file a save SIGKILLed mid-write leaves."""
    orphan = out / f"{TMP_INFIX}checkpoint-{step}.{'ab' * 16}"
    orphan.mkdir(parents=True)
    (orphan / "model.safetensors").write_bytes(b"half")
    lock = out / f"{orphan.name}.lock"
    lock.write_bytes(b"")
    return [orphan, lock]


def parsed_args(out: Path, *extra: str) -> TrainingArguments:
    """TrainingArguments as an example script parses them from its command line."""
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        args=["--output_dir", str(out), "--report_to", "none", "--use_cpu", "true", *extra]
    )
    assert isinstance(args, TrainingArguments)
    return args


@pytest.mark.parametrize("word", ["True", "true", "latest", "LATEST"])
def test_resume_from_checkpoint_true_on_an_example_scripts_command_line_resumes(
    tmp_path: Path, word: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``--resume_from_checkpoint True`` (a string to HfArgumentParser, which stock Trainer
    takes for a path) resumes from the newest complete checkpoint, as ``True`` does."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=4, save_steps=2).train()
    assert CheckpointDir(out, prefix="checkpoint-").steps() == [2, 4]
    args = parsed_args(out, "--resume_from_checkpoint", word, "--max_steps", "6")
    assert args.resume_from_checkpoint == word  # what the script hands to train()
    trainer = make_trainer(out, max_steps=6, save_steps=2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    assert f"resuming from {out / 'checkpoint-4'}" in caplog.text
    assert trainer.state.global_step == 6


def test_stock_trainer_takes_the_word_for_a_path(tmp_path: Path) -> None:
    """Why the keyword exists: stock Trainer, handed the parsed ``"True"``, looks for a
    directory named True and fails."""
    out = tmp_path / "out"
    stock = make_trainer(out, max_steps=2)
    stock.__class__ = Trainer  # the same trainer without the mixin
    with pytest.raises(ValueError, match="find a valid checkpoint at True"):
        stock.train(resume_from_checkpoint="True")


def test_a_directory_named_like_the_keyword_is_taken_as_that_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a directory ``latest`` exists, ``resume_from_checkpoint="latest"`` names it (a
    path), as it always did; the keyword is only for a name that is no directory."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, save_steps=2).train()
    monkeypatch.chdir(tmp_path)
    os.symlink(out / "checkpoint-2", tmp_path / "latest")
    seen: list[Any] = []
    trainer = make_trainer(out, max_steps=3, save_steps=10)
    monkeypatch.setattr(
        AtomicTrainer, "_resume_point", lambda self, output_dir: seen.append(output_dir)
    )
    trainer.train(resume_from_checkpoint="latest")
    assert seen == []  # no automatic resume: the path was used
    assert trainer.state.global_step == 3


STARTS = [
    "explicit path",
    "fresh run",
    "last_checkpoint",
    "automatic",
    "automatic word",
    "automatic verified",
]


@pytest.mark.parametrize("start", STARTS)
def test_every_start_removes_what_killed_saves_left_and_says_so(
    tmp_path: Path, start: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every way to start ``train``: a resume from an explicit path, a fresh run into an
    existing output_dir, the path ``last_checkpoint(out)`` returns (without ``clean``),
    ``resume_from_checkpoint=True``, ``"true"`` (an example script's command line), and
    True with ``verify_on_resume``: each removes a killed save's staging dir and lock
    first (logged as a warning each) and resumes where it was told to; a live save's
    staging dir is left alone."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, save_steps=2).train()
    leftovers = orphan_of_a_killed_save(out, 4)
    live = CheckpointDir(out, prefix="checkpoint-").begin(9)
    trainer = make_trainer(out, max_steps=3, save_steps=10)
    resume: str | bool | None = {
        "explicit path": str(out / "checkpoint-2"),
        "fresh run": None,
        "last_checkpoint": last_checkpoint(out),
        "automatic": True,
        "automatic word": "true",
        "automatic verified": True,
    }[start]
    trainer._atomic_verify = start == "automatic verified"
    loaded: list[str] = []
    real_load = AtomicTrainer._load_from_checkpoint

    def load(self: AtomicTrainer, checkpoint: str, model: Any = None) -> None:
        loaded.append(checkpoint)
        real_load(self, checkpoint, model)

    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(AtomicTrainer, "_load_from_checkpoint", load)
        trainer.train(resume_from_checkpoint=resume)
    assert loaded == ([] if start == "fresh run" else [str(out / "checkpoint-2")])
    for path in leftovers:
        assert not path.exists()
        assert f"removed {path}, left by a killed save" in caplog.text
    assert live.path.is_dir()
    live.abort()


def test_the_final_save_model_and_save_state_are_durable_and_where_users_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After train(), save_model() and save_state() (what run_clm does last) leave
    model.safetensors, config.json, the tokenizer files and trainer_state.json at their
    usual paths in output_dir, each fsynced before it was renamed into place and the
    directory fsynced after; nothing of the staging is left, and the bytes are those stock
    Trainer writes."""
    out = tmp_path / "out"
    trainer = make_trainer(out, max_steps=2, save_steps=10)
    trainer.train()
    synced_files: list[str] = []
    synced_dirs: list[str] = []
    renames: list[tuple[str, str]] = []
    real_file, real_dir, real_rename = _fs.fsync_file, _fs.fsync_dir, _fs.rename

    def fsync_file(path: str | os.PathLike[str]) -> None:
        synced_files.append(os.fspath(path))
        real_file(path)

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        synced_dirs.append(os.fspath(path))
        real_dir(path)

    def rename(src: Path, dst: Path) -> None:
        assert os.fspath(src) in synced_files, f"{src} renamed before it was fsynced"
        renames.append((os.fspath(src), os.fspath(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(_fs, "fsync_file", fsync_file)
    monkeypatch.setattr(_fs, "fsync_dir", fsync_dir)
    monkeypatch.setattr(_fs, "rename", rename)
    trainer.save_model()
    trainer.save_state()
    finals = {Path(dst).name for _, dst in renames}
    assert {"model.safetensors", "config.json", "trainer_state.json"} <= finals
    assert {"tokenizer.json", "training_args.bin"} <= finals
    assert str(out) in synced_dirs  # the renames themselves made durable
    assert not [n for n in os.listdir(out) if TMP_INFIX in n]
    assert not (out / MARKER).exists()  # output_dir stays a plain model directory

    stock_dir = tmp_path / "stock"
    Trainer.save_model(trainer, str(stock_dir))
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (stock_dir / name).read_bytes(), name


def test_a_final_save_that_fails_leaves_the_previous_model_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save_model that raises half-way (the weights half written) leaves the model
    already in output_dir byte for byte, and no staging directory or lock behind."""
    out = tmp_path / "out"
    trainer = make_trainer(out, max_steps=2, save_steps=10)
    trainer.train()
    trainer.save_model()
    before = (out / "model.safetensors").read_bytes()
    fired: list[str] = []

    def failing_save(self: Trainer, output_dir: str | None = None, state_dict: Any = None) -> None:
        Path(output_dir or "", "model.safetensors").write_bytes(b"torn")
        fired.append(str(output_dir))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Trainer, "_save", failing_save)
    with pytest.raises(OSError, match="No space left"):
        trainer.save_model()
    assert fired, "the failing save never ran"
    assert (out / "model.safetensors").read_bytes() == before
    assert not [n for n in os.listdir(out) if TMP_INFIX in n]


def test_save_metrics_replaces_each_results_file_atomically_and_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_clm's ``save_metrics("train", ...)`` then ``save_metrics("eval", ...)``: the same
    files as stock Trainer (``<split>_results.json``, ``all_results.json`` holding both), each
    written aside, fsynced, renamed into place, the directory fsynced; nothing left aside."""
    out = tmp_path / "out"
    trainer = make_trainer(out, max_steps=1, save_steps=10)
    out.mkdir(parents=True, exist_ok=True)
    synced: list[str] = []
    renamed: list[str] = []
    real_file, real_dir, real_rename = _fs.fsync_file, _fs.fsync_dir, _fs.rename

    def fsync_file(path: str | os.PathLike[str]) -> None:
        synced.append(os.fspath(path))
        real_file(path)

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        synced.append(os.fspath(path))
        real_dir(path)

    def rename(src: Path, dst: Path) -> None:
        assert os.fspath(src) in synced, f"{src} renamed before it was fsynced"
        if Path(dst).parent == out:
            renamed.append(Path(dst).name)
            synced.append("renamed")
        real_rename(src, dst)

    monkeypatch.setattr(_fs, "fsync_file", fsync_file)
    monkeypatch.setattr(_fs, "fsync_dir", fsync_dir)
    monkeypatch.setattr(_fs, "rename", rename)
    trainer.save_metrics("train", {"train_loss": 1.5})
    assert sorted(renamed) == ["all_results.json", "train_results.json"]
    assert str(out) in synced[synced.index("renamed") :]  # the renames made durable
    renamed.clear()
    synced.clear()
    trainer.save_metrics("eval", {"eval_loss": 2.5})
    assert sorted(renamed) == ["all_results.json", "eval_results.json"]
    assert str(out) in synced[synced.index("renamed") :]
    monkeypatch.undo()
    stock = tmp_path / "stock"
    stock.mkdir()
    monkeypatch.setattr(trainer.args, "output_dir", str(stock))
    Trainer.save_metrics(trainer, "train", {"train_loss": 1.5})
    Trainer.save_metrics(trainer, "eval", {"eval_loss": 2.5})
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        assert (out / name).read_bytes() == (stock / name).read_bytes(), name
    assert sorted(os.listdir(out)) == sorted(os.listdir(stock))


def killed_in_child(work: Any, kill_at: int) -> int:
    """Run ``work()`` in a forked child that dies (``os._exit``, as SIGKILL: no cleanup runs)
    at its ``kill_at``-th rename; returns how many renames the child reached."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        seen = [0]
        real = _fs.rename

        def rename(src: Path, dst: Path) -> None:
            seen[0] += 1
            if seen[0] == kill_at:
                os.write(write, str(seen[0]).encode())
                os._exit(9)
            real(src, dst)

        _fs.rename = rename  # type: ignore[assignment]
        try:
            work()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reached = pipe.read()
    os.waitpid(pid, 0)
    return int(reached or 0)


FINAL_SAVES = {
    "save_model": lambda t: t.save_model(),
    "save_state": lambda t: t.save_state(),
    "save_metrics": lambda t: t.save_metrics("train", {"train_loss": 1.5}),
}


@pytest.mark.parametrize("call", sorted(FINAL_SAVES))
def test_a_final_save_killed_before_a_rename_leaves_nothing_the_next_start_keeps(
    tmp_path: Path, call: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A script killed inside its final ``save_model``/``save_state``/``save_metrics``, just
    before a file is renamed into place: the file written for it (a whole model's size for
    ``model.safetensors``) is removed by the next start (a fresh run into ``output_dir``),
    with a warning; no ``.tmp-`` name is left in ``output_dir``."""
    out = tmp_path / "out"
    trainer = make_trainer(out, max_steps=1, save_steps=10)
    trainer.train()
    assert killed_in_child(lambda: FINAL_SAVES[call](trainer), 1) == 1, "no kill"
    assert [n for n in os.listdir(out) if TMP_INFIX in n], "the kill left nothing to clean"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        make_trainer(out, max_steps=1, save_steps=10).train()
    assert [n for n in os.listdir(out) if TMP_INFIX in n and "root.lock" not in n] == []
    assert "left by a killed save" in caplog.text


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_a_killed_save_model_into_another_directory_is_cleaned_by_the_next_save_there(
    tmp_path: Path, kill_at: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``save_model("final")``, a directory that is not ``output_dir`` (where no start ever
    cleans), killed before its ``kill_at``-th rename: the next ``save_model("final")``
    removes the killed one's staging directory (a whole model at real scale, kept forever
    before) with a warning, and leaves every file whole: the model loads."""
    out, final = tmp_path / "out", tmp_path / "final"
    trainer = make_trainer(out, max_steps=1, save_steps=10)
    trainer.train()
    assert killed_in_child(lambda: trainer.save_model(str(final)), kill_at) == kill_at
    assert [n for n in os.listdir(final) if TMP_INFIX in n], "the kill left nothing"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.save_model(str(final))
    assert [n for n in os.listdir(final) if TMP_INFIX in n and "root.lock" not in n] == []
    assert "left by a killed save" in caplog.text
    loaded = transformers.GPT2LMHeadModel.from_pretrained(final)
    for name, tensor in trainer.model.state_dict().items():
        assert loaded.state_dict()[name].equal(tensor), name
