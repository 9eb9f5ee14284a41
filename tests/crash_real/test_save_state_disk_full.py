"""``save_state`` (with and without ``carry_frozen=True``) on a disk that fills up is the
commit's :class:`~atomic_ckpt.DiskFullError` (what to do: free space), as a full disk is
for any commit, not the serializer's own error (torch's ``RuntimeError: [enforce fail at
inline_container.cc] unexpected pos``, or a ``SafetensorError``)."""

from __future__ import annotations

import os

import pytest
from _real_mounts import Mounter, mount_or_skip

from atomic_ckpt import CheckpointDir, DiskFullError

torch = pytest.importorskip("torch")

from atomic_ckpt.torch import FROZEN_FILE, save_state  # noqa: E402

pytestmark = pytest.mark.root


def _fill(directory: str, leave: int) -> None:
    """Fill the filesystem of ``directory``, then free about ``leave`` bytes."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(path, max(0, os.path.getsize(path) - leave))


@pytest.mark.parametrize("carry_frozen", [True, False])
def test_save_state_on_a_full_disk_is_a_disk_full_error(
    mounter: Mounter, carry_frozen: bool
) -> None:
    """The second save, with ~300 KB free, raises DiskFullError; step 1 stays whole."""
    fs = mount_or_skip(mounter, "tmpfs", size_mb=3)
    ckpts = CheckpointDir(fs.path / "ckpts")
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"emb": torch.nn.Embedding(4096, 64), "layer": torch.nn.Linear(64, 512)}
    )
    model["emb"].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model["layer"].weight.grad = torch.randn_like(model["layer"].weight)
    opt.step()
    save_state(ckpts, 1, model=model, optimizer=opt, carry_frozen=carry_frozen)
    _fill(str(fs.path), leave=300_000)
    with pytest.raises(DiskFullError):
        save_state(ckpts, 2, model=model, optimizer=opt, carry_frozen=carry_frozen)
    assert ckpts.steps() == [1]
    ckpts.verify(1)
    if carry_frozen:
        assert os.lstat(ckpts.path_of(1) / FROZEN_FILE).st_nlink == 1
