"""What the benchmarks write: raw files and a real training state, and the plain writes of them.

Each ``Payload`` holds one case's tensors in memory and hands them out in the
shape every saver wants: files written one by one (``write``, for ``unsafe``,
``floor`` and a commit), a flat tensor dict (safetensors), the object given
to ``torch.save``, and the state dict given to ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model

from atomic_ckpt import CheckpointDir


def fsync_path(path: Path) -> None:
    """fsync the file at ``path`` (opened read-only: fsync needs no write access)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes | memoryview, *, fsync: bool) -> None:
    """Write ``data`` to a new file at ``path`` with plain os.write calls; fsync it if asked."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


class Payload:
    """The tensors of one case, and the files a plain (non-peer) save writes."""

    name: str
    nbytes: int
    nfiles: int

    def write(self, directory: Path, *, fsync: bool) -> None:
        """Write this case's files into ``directory`` (fsync each one if asked)."""
        raise NotImplementedError

    def tensors(self) -> dict[str, torch.Tensor]:
        """A flat name -> tensor dict for torch.save / safetensors."""
        raise NotImplementedError

    def torch_state(self) -> Any:
        """The object handed to ``torch.save``."""
        return self.tensors()

    def commit(self, ckpts: CheckpointDir) -> None:
        """A durable commit of this case's files as step 1 of ``ckpts``, as a user would make it."""
        self.commit_plain(ckpts)

    def commit_plain(self, ckpts: Any) -> None:
        """``with ckpts.commit(1)``, writing the files: the API every atomic_ckpt version has."""
        with ckpts.commit(1) as staging:
            self.write(staging, fsync=False)

    def dcp_state(self) -> dict[str, Any]:
        """The state dict handed to torch.distributed.checkpoint.save."""
        return self.tensors()


class FilesPayload(Payload):
    """``count`` raw files of ``size`` random bytes each (one tensor per file)."""

    def __init__(self, name: str, count: int, size: int) -> None:
        self.name, self.nfiles, self.nbytes = name, count, count * size
        gen = torch.Generator().manual_seed(0)
        self._tensors = {
            f"shard_{i:05d}.bin": torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
            for i in range(count)
        }
        self._views = {k: memoryview(t.numpy()) for k, t in self._tensors.items()}

    def write(self, directory: Path, *, fsync: bool) -> None:
        for name, view in self._views.items():
            write_bytes(directory / name, view, fsync=fsync)

    def tensors(self) -> dict[str, torch.Tensor]:
        return self._tensors


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyLM(torch.nn.Module):
    """A small GPT-like model (untied embedding and head)."""

    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.ln(x))
        return out


def _write_state_inline(
    directory: Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """What ``atomic_ckpt.torch.write_state`` writes (for a checkout without it)."""
    save_model(model, str(directory / "model.safetensors"))
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    (directory / "training_state.json").write_text(json.dumps({"step": step}) + "\n")


class StatePayload(Payload):
    """A real training state: a transformer-like model and its Adam state after one step."""

    def __init__(self, name: str, vocab: int, d: int, layers: int) -> None:
        torch.manual_seed(0)
        self.name = name
        self.model = TinyLM(vocab, d, layers)
        self.optim = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        idx = torch.randint(0, vocab, (2, 16))
        logits = self.model(idx)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.nbytes = 3 * params  # weights + exp_avg + exp_avg_sq
        self.nfiles = 3
        try:
            from atomic_ckpt.torch import save_state, write_state
        except ImportError:
            self._write, self._save = _write_state_inline, None
        else:
            self._write, self._save = write_state, save_state

    def write(self, directory: Path, *, fsync: bool) -> None:
        self._write(directory, step=1, model=self.model, optimizer=self.optim)
        if fsync:
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                if entry.is_file(follow_symlinks=False):
                    fsync_path(Path(entry.path))

    def tensors(self) -> dict[str, torch.Tensor]:
        flat = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for pid, state in self.optim.state_dict()["state"].items():
            for k, v in state.items():
                flat[f"optim.{pid}.{k}"] = v
        return flat

    def torch_state(self) -> Any:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def commit(self, ckpts: CheckpointDir) -> None:
        if self._save is None:
            self.commit_plain(ckpts)
        else:  # the library's own helper, as a user would call it
            self._save(ckpts, 1, model=self.model, optimizer=self.optim)

    def dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd}
