"""``push_to_hub=True`` with a real ``AtomicTrainer`` and a stand-in for the Hub: every
``hub_strategy`` uploads what a plain ``Trainer`` uploads, read once the checkpoint is
committed, and never a staging directory, lock or other temporary entry of the root.

No network: ``HfApi.create_commit`` (where ``upload_folder`` ends, after it has listed and
filtered the folder) records what would be sent and checks it can be read; the uploads
Trainer starts in a thread run at once (``HfApi.run_as_future``), so "when" is the moment
Trainer asks for the push.
"""

from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass, field
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
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from atomic_ckpt import MARKER, TMP_INFIX, CheckpointDir  # noqa: E402
from atomic_ckpt.integrations.transformers import AtomicTrainer  # noqa: E402

torch.set_num_threads(1)


@dataclass
class Upload:
    """One commit to the stand-in Hub: its message, the repo paths with the local file
    each was read from, and the complete checkpoints of the run at that moment."""

    message: str
    files: dict[str, Path]
    complete: list[int]


@dataclass
class Hub:
    out: Path
    uploads: list[Upload] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def create_commit(self, *, repo_id: str, operations: Any, **kw: Any) -> Any:
        files = {}
        for op in operations:
            local = Path(op.path_or_fileobj)
            local.read_bytes()  # what an upload does: it must be there, whole
            files[op.path_in_repo] = local
        complete = CheckpointDir(self.out, prefix="checkpoint-").steps()
        self.uploads.append(Upload(kw["commit_message"], files, complete))
        return SimpleNamespace(  # the fields upload_folder copies (huggingface_hub < 1: all)
            oid="0" * 40,
            commit_url="",
            pr_url=None,
            commit_message=kw["commit_message"],
            commit_description=kw.get("commit_description") or "",
        )

    def run_now(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            self.errors.append(exc)
            future.set_exception(exc)
        return future


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Hub:
    """A Hub stand-in (see the module docstring); ``hub.out`` is set per run."""
    fake = Hub(tmp_path)
    monkeypatch.setattr(HfApi, "create_commit", lambda api, **kw: fake.create_commit(**kw))
    monkeypatch.setattr(HfApi, "run_as_future", lambda api, *a, **kw: fake.run_now(*a, **kw))
    monkeypatch.setattr(
        HfApi, "create_repo", lambda api, repo_id, **kw: SimpleNamespace(repo_id=repo_id)
    )
    monkeypatch.setattr(HfApi, "_validate_yaml", lambda api, content, **kw: None)
    # transformers 4.x calls huggingface_hub.create_repo, a method bound at import to the
    # module's own HfApi (so the patch above misses it), from Trainer.__init__.
    monkeypatch.setattr(
        transformers.trainer,
        "create_repo",
        lambda repo_id, **kw: SimpleNamespace(repo_id=repo_id),
        raising=False,
    )
    # The one-commit path of upload_folder (the other streams through Xet; releases
    # without Xet have only this path, hence raising=False).
    monkeypatch.setattr(huggingface_hub.hf_api, "is_xet_available", lambda: False, raising=False)
    return fake


def train(cls: type[Trainer], out: Path, strategy: str) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=4,
        save_steps=2,
        save_strategy="steps",
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        push_to_hub=True,
        hub_model_id="someone/tiny",
        hub_strategy=strategy,
        hub_always_push=True,  # every save pushes (none is skipped as still in progress)
    )
    trainer = cls(model=model, args=args, train_dataset=dataset(), processing_class=tokenizer())
    trainer.train()
    trainer.push_to_hub()
    return trainer


def shape(uploads: list[Upload]) -> list[tuple[str, set[str]]]:
    return [(u.message, set(u.files)) for u in uploads]


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints", "end"])
def test_every_hub_strategy_pushes_what_was_committed_after_the_commit(
    hub: Hub, tmp_path: Path, strategy: str
) -> None:
    """While another writer's save is in flight in the same root, each push of step N is
    made once checkpoint-N is complete, a checkpoint push reads the committed directory,
    nothing temporary is ever uploaded, and the uploads are a plain Trainer's (plus the
    manifest inside pushed checkpoints)."""
    hub.out = tmp_path / "plain"
    train(Trainer, hub.out, strategy)
    plain, hub.uploads = hub.uploads, []

    hub.out = out = tmp_path / "atomic"
    live = CheckpointDir(out, prefix="checkpoint-").begin(1000)  # another writer, mid-save
    (live.path / "optimizer.pt").write_bytes(b"in flight")
    train(AtomicTrainer, out, strategy)
    live.abort()

    assert hub.errors == []
    assert hub.uploads, "the Hub stand-in was never called"
    assert len(hub.uploads) == {"end": 1, "every_save": 3}.get(strategy, 5)
    expected = [
        (message, files | {f"{f.split('/')[0]}/{MARKER}" for f in files if "/" in f})
        for message, files in shape(plain)
    ]
    assert shape(hub.uploads) == expected
    for upload in hub.uploads:
        for name, local in upload.files.items():
            assert TMP_INFIX not in name, name
            assert not name.endswith(".lock"), name
            assert TMP_INFIX not in str(local.relative_to(out)), local
        if upload.message.startswith("Training in progress, step "):
            step = int(upload.message.split()[4].rstrip(","))
            assert step in upload.complete, (upload.message, upload.complete)
        if upload.message.endswith(", checkpoint"):
            committed = out / f"checkpoint-{step}"
            assert {p.parent for p in upload.files.values()} == {committed}
            assert {p.name for p in upload.files.values()} == set(os.listdir(committed))
