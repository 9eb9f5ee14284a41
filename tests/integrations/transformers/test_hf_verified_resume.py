"""``AtomicTrainer(verify_on_resume=True).train(resume_from_checkpoint=True)``: the newest
checkpoint that verifies is resumed, and Trainer's own loads are served from the pages the
verification hashed (held until each load returns): each byte is read from storage once."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from treeutil import evict, storage_bytes

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch
import transformers
from hf_trainer_child import dataset, tokenizer
from packaging.version import Version
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from atomic_ckpt import CheckpointDir
from atomic_ckpt.integrations.transformers import AtomicTrainer

torch.set_num_threads(1)


class SpyTrainer(AtomicTrainer):
    """Notes which checkpoint files are still mapped when each of Trainer's loads starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: dict[str, set[str]] = {}

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        self.held["model"] = set(self._atomic_views)
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self.held["optimizer"] = set(self._atomic_views)
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        self.held["rng"] = set(self._atomic_views)
        super()._load_rng_state(checkpoint)


def make_trainer(out: Path, *, width: int = 32, verify: bool, **args: Any) -> SpyTrainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=width, n_head=2, vocab_size=64))
    options: dict[str, Any] = {
        "per_device_train_batch_size": 2,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "save_strategy": "steps",
        "learning_rate": 1e-2,
        **args,
    }
    return SpyTrainer(
        model=model,
        args=TrainingArguments(output_dir=str(out), **options),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        verify_on_resume=verify,
    )


def weights(trainer: AtomicTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_a_verified_resume_ends_where_an_unverified_one_does(tmp_path: Path) -> None:
    """From copies of one run's checkpoints, resuming with and without verification trains
    to bit-identical weights; the verified one held the files each load reads while it read
    them, and nothing once train returned."""
    first = tmp_path / "first"
    make_trainer(first, verify=False, max_steps=4, save_steps=2).train()
    plain, verified = tmp_path / "plain", tmp_path / "verified"
    shutil.copytree(first, plain)
    shutil.copytree(first, verified)

    a = make_trainer(plain, verify=False, max_steps=6, save_steps=2)
    a.train(resume_from_checkpoint=True)
    b = make_trainer(verified, verify=True, max_steps=6, save_steps=2)
    b.train(resume_from_checkpoint=True)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.held == {"model": set(), "optimizer": set(), "rng": set()}  # unverified: none
    assert {"model.safetensors", "config.json", "optimizer.pt"} <= b.held["model"]
    assert "optimizer.pt" in b.held["optimizer"]
    assert "model.safetensors" not in b.held["optimizer"]  # released once it was loaded
    assert {"rng_state.pth", "trainer_state.json"} <= b.held["rng"]
    assert "optimizer.pt" not in b.held["rng"]
    assert b._atomic_views == {}


def test_a_newest_checkpoint_that_does_not_verify_is_passed_over_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bit of checkpoint-4's optimizer state flipped (same size): the verified resume
    warns about checkpoint-4 and resumes from checkpoint-2, loading checkpoint-2's files."""
    out = tmp_path / "out"
    make_trainer(out, verify=False, max_steps=4, save_steps=2).train()
    damaged = out / "checkpoint-4" / "optimizer.pt"
    data = damaged.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(flipped))
    assert damaged.read_bytes() != data
    assert damaged.stat().st_size == len(data)

    trainer = make_trainer(out, verify=True, max_steps=5, save_steps=2)
    with caplog.at_level(logging.INFO):
        trainer.train(resume_from_checkpoint=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any("checkpoint-4" in m and "does not verify" in m for m in messages)
    assert any(
        m == f"resuming from {out / 'checkpoint-2'}, the newest complete checkpoint"
        for m in messages
    )
    assert "optimizer.pt" in trainer.held["optimizer"]  # checkpoint-2's, mapped and verified


def test_a_verified_resume_reads_each_byte_of_the_checkpoint_from_storage_once(
    tmp_path: Path,
) -> None:
    """From a cold cache, verifying checkpoint-4 (~20 MiB: model, optimizer, RNG, state) and
    letting Trainer load it reads about its size from storage, not twice that."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux)")
    out = tmp_path / "out"
    make_trainer(out, width=256, verify=False, max_steps=4, save_steps=4).train()
    warm = tmp_path / "warm"  # a first resume, so that what it imports is not counted
    shutil.copytree(out, warm)
    make_trainer(warm, width=256, verify=True, max_steps=5, save_steps=4).train(
        resume_from_checkpoint=True
    )
    ckpt = CheckpointDir(out, prefix="checkpoint-").get(4)
    total = sum(e.size for e in ckpt.manifest.files if e.type == "file")
    assert total > 16 << 20

    trainer = make_trainer(out, width=256, verify=True, max_steps=5, save_steps=4)
    os.sync()
    evict(ckpt.path)
    before = storage_bytes()
    trainer.train(resume_from_checkpoint=True)
    read = storage_bytes() - before
    assert {"model.safetensors", "optimizer.pt"} <= trainer.held["model"]
    if read == 0:  # a filesystem without storage (tmpfs): nothing to count
        pytest.skip(f"{tmp_path} reads nothing from storage")
    assert 0.9 * total <= read <= 1.1 * total, (read, total)


# Before 5.18 Trainer itself cannot resume a multi-process run on CPU under this torch (it
# loads the optimizer with map_location="cpu:0"), with or without atomic_ckpt.
@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.18"),
    reason="transformers < 5.18 cannot resume a multi-process CPU run (map_location='cpu:0')",
)
def test_on_two_ranks_each_rank_holds_what_it_loads_and_a_bad_shard_sends_both_back(
    tmp_path: Path,
) -> None:
    """Two gloo ranks, verify_on_resume: each rank hashes and holds the shared files and its
    own rng_state_<r>.pth, never the other's; the newest checkpoint with rank 1's RNG file
    damaged (same size) makes both ranks resume from the one before."""
    from hf_launch import launch

    out = tmp_path / "out"
    cfg: dict[str, object] = {"out": str(out), "steps": 4, "save_steps": 2}
    assert launch(cfg, world=2, tmp=tmp_path).ok
    result = tmp_path / "result.json"
    resumed = {**cfg, "steps": 6, "resume": True, "verify": True, "result": str(result)}
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    run = launch(resumed, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    for r in (0, 1):
        chosen, held = json.loads(Path(f"{result}.rank{r}").read_text())
        assert Path(chosen).name == "checkpoint-4"
        names = set(held.split(","))
        assert {"model.safetensors", "optimizer.pt", f"rng_state_{r}.pth"} <= names
        assert f"rng_state_{1 - r}.pth" not in names

    damaged = copy / "checkpoint-4" / "rng_state_1.pth"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    run = launch({**resumed, "out": str(copy)}, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    for r in (0, 1):
        chosen, _ = json.loads(Path(f"{result}.rank{r}").read_text())
        assert Path(chosen).name == "checkpoint-2"
    assert "rank 1" in run.logs[0]
    assert "rng_state_1.pth" in run.logs[0]


# ------------------------------------------------ issue 30 item 23: a path, read once too


class ReadCounter:
    """Counts, per checkpoint file, the verification's reads of it: mapped (and kept) or
    hashed (and dropped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from atomic_ckpt._core.l3_formats import verify as _verify

        self.mapped: dict[str, int] = {}
        self.hashed: dict[str, int] = {}
        real_map, real_hash = _verify.map_file, _verify.checksum_file

        def map_file(path: str, *args: Any, **kwargs: Any) -> Any:
            name = Path(path).name
            self.mapped[name] = self.mapped.get(name, 0) + 1
            return real_map(path, *args, **kwargs)

        def checksum_file(path: str, *args: Any, **kwargs: Any) -> Any:
            name = Path(path).name
            self.hashed[name] = self.hashed.get(name, 0) + 1
            return real_hash(path, *args, **kwargs)

        monkeypatch.setattr(_verify, "map_file", map_file)
        monkeypatch.setattr(_verify, "checksum_file", checksum_file)

    def reads(self) -> dict[str, int]:
        names = set(self.mapped) | set(self.hashed)
        return {n: self.mapped.get(n, 0) + self.hashed.get(n, 0) for n in names}


def _checkpoint_files(out: Path, step: int) -> set[str]:
    ckpt = CheckpointDir(out, prefix="checkpoint-").get(step)
    return {e.path for e in ckpt.manifest.files if e.type == "file"}


def test_a_path_from_last_checkpoint_verify_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """last_checkpoint(verify=True), then train(resume_from_checkpoint=that path): every file
    of the checkpoint is read once by the verification, mapped, and Trainer's loads run
    while those mappings are held (served from the pages hashed); nothing is verified
    again, and the string is a plain path to other code."""
    from atomic_ckpt.integrations.transformers import last_checkpoint

    out = tmp_path / "out"
    make_trainer(out, verify=False, max_steps=4, save_steps=4).train()
    counter = ReadCounter(monkeypatch)
    path = last_checkpoint(out, verify=True)
    assert path == str(out / "checkpoint-4")
    assert os.fspath(path) == path
    files = _checkpoint_files(out, 4)
    assert counter.reads() == dict.fromkeys(files, 1)
    assert counter.hashed == {}  # mapped and kept, never hashed and dropped
    trainer = make_trainer(out, verify=False, max_steps=5, save_steps=4)
    trainer.train(resume_from_checkpoint=path)
    assert trainer.state.global_step == 5
    assert counter.reads() == dict.fromkeys(files, 1)  # train() verified nothing again
    assert {"model.safetensors", "optimizer.pt"} <= trainer.held["model"]
    assert "optimizer.pt" in trainer.held["optimizer"]
    assert {"rng_state.pth", "trainer_state.json"} <= trainer.held["rng"]
    assert trainer._atomic_views == {}


def test_a_path_passed_with_verify_on_resume_is_verified_and_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify_on_resume=True and resume_from_checkpoint=<checkpoint-2>: that checkpoint (not
    the newest) is verified, each file read once, and loaded from the pages hashed."""
    out = tmp_path / "out"
    make_trainer(out, verify=False, max_steps=4, save_steps=2).train()
    counter = ReadCounter(monkeypatch)
    trainer = make_trainer(out, verify=True, max_steps=5, save_steps=10)
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert trainer.state.global_step == 5
    assert counter.reads() == dict.fromkeys(_checkpoint_files(out, 2), 1)
    assert {"model.safetensors", "optimizer.pt"} <= trainer.held["model"]
    assert {"rng_state.pth", "trainer_state.json"} <= trainer.held["rng"]


def test_a_damaged_path_passed_with_verify_on_resume_is_refused(tmp_path: Path) -> None:
    """A path the caller chose that does not verify raises VerificationError naming the file
    (never swapped for another checkpoint); a directory that is not checkpoint-N is a
    ValueError saying how to go on."""
    from atomic_ckpt import VerificationError

    out = tmp_path / "out"
    make_trainer(out, verify=False, max_steps=4, save_steps=2).train()
    damaged = out / "checkpoint-4" / "optimizer.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    trainer = make_trainer(out, verify=True, max_steps=5, save_steps=10)
    with pytest.raises(VerificationError, match=r"optimizer\.pt"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert trainer.held == {}  # nothing was loaded
    other = tmp_path / "elsewhere"
    shutil.copytree(out / "checkpoint-2", other)
    with pytest.raises(ValueError, match="not a checkpoint-N directory"):
        trainer.train(resume_from_checkpoint=str(other))


def test_a_path_from_last_checkpoint_verify_comes_from_storage_once(tmp_path: Path) -> None:
    """From a cold cache, last_checkpoint(verify=True) and a resume from the path it returns
    read about the checkpoint's size from storage (a verify, then loads by path after the
    pages went, would read it twice)."""
    from atomic_ckpt.integrations.transformers import last_checkpoint

    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux)")
    out = tmp_path / "out"
    make_trainer(out, width=256, verify=False, max_steps=4, save_steps=4).train()
    warm = tmp_path / "warm"  # a first resume, so that what it imports is not counted
    shutil.copytree(out, warm)
    make_trainer(warm, width=256, verify=False, max_steps=5, save_steps=4).train(
        resume_from_checkpoint=last_checkpoint(warm, verify=True)
    )
    ckpt = CheckpointDir(out, prefix="checkpoint-").get(4)
    total = sum(e.size for e in ckpt.manifest.files if e.type == "file")
    trainer = make_trainer(out, width=256, verify=False, max_steps=5, save_steps=4)
    os.sync()
    evict(ckpt.path)
    before = storage_bytes()
    trainer.train(resume_from_checkpoint=last_checkpoint(out, verify=True))
    read = storage_bytes() - before
    if read == 0:  # a filesystem without storage (tmpfs): nothing to count
        pytest.skip(f"{tmp_path} reads nothing from storage")
    assert 0.9 * total <= read <= 1.1 * total, (read, total)
