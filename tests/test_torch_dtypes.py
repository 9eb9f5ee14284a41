"""Every dtype both safetensors and torch know round-trips through a checkpoint: saved,
resumed with and without ``verify``, checked and adopted by ``mark_complete``. The table
the library reads them with comes from safetensors, not a hand list."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors.torch import save_file

from atomic_ckpt import CheckpointDir
from atomic_ckpt import torch as atorch

# What the pinned safetensors writes from torch: every name it maps to a torch dtype.
BOTH = {name: dtype for name, dtype in safetensors.torch._TYPES.items() if dtype is not None}


def _values(dtype: torch.dtype) -> torch.Tensor:
    """A 2x3 tensor of ``dtype`` whose bytes are not all zero."""
    return torch.arange(1, 7, dtype=torch.float32).reshape(2, 3).to(dtype)


class Buffers(torch.nn.Module):
    """A model whose state is one buffer of every dtype."""

    def __init__(self, fill: bool) -> None:
        super().__init__()
        for name, dtype in BOTH.items():
            value = _values(dtype) if fill else torch.zeros(2, 3, dtype=dtype)
            self.register_buffer(name.lower(), value)


def test_the_table_covers_the_dtypes_the_test_relies_on() -> None:
    """The pinned safetensors knows complex64 and both fnuz float8s (issue 30)."""
    assert {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"} <= BOTH.keys()


@pytest.mark.parametrize("verify", [False, True], ids=["unverified", "verified"])
def test_resume_loads_every_dtype_safetensors_writes(tmp_path: Path, verify: bool) -> None:
    """``resume`` loads a buffer of each dtype, bit for bit, ``verify`` or not."""
    ckpts = CheckpointDir(tmp_path / "run")
    atorch.save_state(ckpts, 1, model=Buffers(fill=True))
    model = Buffers(fill=False)
    state = atorch.resume(ckpts, model=model, verify=verify)
    assert state is not None
    for name, dtype in BOTH.items():
        got = getattr(model, name.lower())
        assert got.dtype == dtype
        assert got.view(torch.uint8).tolist() == _values(dtype).view(torch.uint8).tolist(), name


@pytest.mark.parametrize("name", sorted(BOTH))
def test_check_contents_and_mark_complete_accept_every_dtype(tmp_path: Path, name: str) -> None:
    """A valid safetensors file of each dtype is "ok" to ``check_contents`` and adopted."""
    ckpts = CheckpointDir(tmp_path / "run")
    step = ckpts.path_of(3)
    step.mkdir(parents=True)
    save_file({"t": _values(BOTH[name])}, step / "model.safetensors")
    (check,) = ckpts.check_contents(3)
    assert check.format == "safetensors"
    assert check.problem is None
    ckpts.mark_complete(3)
    assert ckpts.steps() == [3]


@pytest.mark.parametrize("name", sorted(BOTH))
def test_a_truncated_file_of_every_dtype_is_still_refused(tmp_path: Path, name: str) -> None:
    """Knowing the dtype is what lets the check see that its data is cut short."""
    ckpts = CheckpointDir(tmp_path / "run")
    step = ckpts.path_of(3)
    step.mkdir(parents=True)
    target = step / "model.safetensors"
    save_file({"t": _values(BOTH[name])}, target)
    target.write_bytes(target.read_bytes()[:-1])
    (check,) = ckpts.check_contents(3)
    assert check.problem is not None
    assert "truncated" in check.problem
