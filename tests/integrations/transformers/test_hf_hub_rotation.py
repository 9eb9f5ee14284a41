"""Rotation never deletes a checkpoint while Trainer's background Hub upload of it runs
(issue 30 item 24): with ``hub_strategy="checkpoint"`` Trainer uploads ``checkpoint-N``
itself on HfApi's thread (``run_as_future``) and goes on training; the checkpoint is kept
until that upload ends, then rotated away.

No network: ``HfApi.run_as_future`` runs each upload on a thread held at a gate (a slow
link), and ``HfApi.create_commit`` (where ``upload_folder`` ends, after listing the folder)
reads every file it would send."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

import torch  # noqa: E402
import transformers  # noqa: E402
from hf_trainer_child import dataset, tokenizer  # noqa: E402
from huggingface_hub import HfApi  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments  # noqa: E402

from atomic_ckpt import CheckpointDir  # noqa: E402
from atomic_ckpt.integrations.transformers import AtomicTrainer, _hub  # noqa: E402

pytestmark = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5,
    reason="the Hub fakes patch HfApi methods, which transformers 4.x does not go through",
)

torch.set_num_threads(1)


class SlowHub:
    """Uploads wait at :attr:`gate`; each commit reads the files it would send."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.threads: list[threading.Thread] = []
        self.sent: list[tuple[str, list[Path]]] = []
        self.errors: list[BaseException] = []

    def run_later(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def work() -> None:
            assert self.gate.wait(60), "the gate never opened"
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                self.errors.append(exc)
                future.set_exception(exc)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        self.threads.append(thread)
        return future

    def create_commit(self, **kw: Any) -> Any:
        files = [Path(op.path_or_fileobj) for op in kw["operations"]]
        for path in files:
            path.read_bytes()  # what an upload does: it must be there, whole
        self.sent.append((kw["commit_message"], files))
        return SimpleNamespace(oid="0" * 40, commit_url="", pr_url=None)

    def open_and_drain(self) -> None:
        self.gate.set()
        for thread in self.threads:
            thread.join(60)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> SlowHub:
    fake = SlowHub()
    monkeypatch.setattr(HfApi, "create_commit", lambda api, **kw: fake.create_commit(**kw))
    monkeypatch.setattr(HfApi, "run_as_future", lambda api, *a, **kw: fake.run_later(*a, **kw))
    monkeypatch.setattr(
        HfApi, "create_repo", lambda api, repo_id, **kw: SimpleNamespace(repo_id=repo_id)
    )
    monkeypatch.setattr(HfApi, "_validate_yaml", lambda api, content, **kw: None)
    monkeypatch.setattr(huggingface_hub.hf_api, "is_xet_available", lambda: False, raising=False)
    yield fake
    fake.gate.set()


def _train(out: Path, hub: SlowHub) -> tuple[AtomicTrainer, list[list[int]]]:
    """Steps 1-6, a save every 2, save_total_limit=1, hub_strategy="checkpoint": the uploads
    of checkpoint-2 and -4 are held until step 5 ends; the steps on disk at each step's
    end (before that step's save: Trainer saves after ``on_step_end``)."""
    on_disk: list[list[int]] = []

    class Watch(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            on_disk.append(CheckpointDir(out, prefix="checkpoint-").steps())
            if state.global_step == 5:
                hub.open_and_drain()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=6,
        save_steps=2,
        save_strategy="steps",
        save_total_limit=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        push_to_hub=True,
        hub_model_id="someone/tiny",
        hub_strategy="checkpoint",
        hub_always_push=True,
    )
    trainer = AtomicTrainer(
        model=model,
        args=args,
        train_dataset=dataset(),
        processing_class=tokenizer(),
        callbacks=[Watch()],
    )
    trainer.train()
    return trainer, on_disk


def test_a_checkpoint_being_uploaded_is_kept_until_its_upload_ends(
    hub: SlowHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """checkpoint-2 outlives the rotation at step 4 (its upload is held), every upload reads
    its checkpoint whole, and once the uploads end the rotation leaves checkpoint-6 alone."""
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="atomic_ckpt.integrations.transformers"):
        _, on_disk = _train(out, hub)
    assert hub.gate.is_set()
    assert len(hub.threads) >= 4
    assert hub.errors == []
    checkpoint_pushes = [files for message, files in hub.sent if message.endswith("checkpoint")]
    uploaded = {f.parent.name for files in checkpoint_pushes for f in files}
    assert {"checkpoint-2", "checkpoint-4"} <= uploaded
    assert on_disk[4] == [2, 4]  # after step 4's save: kept for its upload (limit 1)
    assert any(
        "keeping" in r.getMessage() and "checkpoint-2" in r.getMessage() for r in caplog.records
    )
    assert CheckpointDir(out, prefix="checkpoint-").steps() == [6]


def test_without_the_hold_the_rotation_deletes_what_an_upload_still_reads(
    hub: SlowHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run with the upload tracking switched off: the rotation at step 4 deletes
    checkpoint-2 under its held upload, which then fails (what the hold prevents)."""
    monkeypatch.setattr(_hub._Uploading, "steps", lambda self, ckpts: set())
    out = tmp_path / "out"
    _, on_disk = _train(out, hub)
    assert on_disk[4] == [4]
    assert hub.errors, "the upload of the deleted checkpoint did not fail"
