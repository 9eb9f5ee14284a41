"""``AtomicCheckpointIO(verify_on_load=True)``: each saved ``.ckpt`` carries its checksum (in
its zip comment), a load checks it first and deserializes from the very pages hashed (each
byte fetched from storage once), and a damaged file is refused with an error naming it."""

from __future__ import annotations

import contextlib
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from treeutil import evict, storage_bytes

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import lightning.pytorch as pl
import torch
from tiny import tiny_model

from atomic_ckpt import VerificationError
from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint, _checked
from atomic_ckpt.integrations.lightning._strategy import _AtomicShardedSave


def fit(root: Path, io: AtomicCheckpointIO, steps: int, ckpt_path: str | None = None) -> Any:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = tiny_model(pl, torch.optim.Adam)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        plugins=[io],
        callbacks=[AtomicModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=2)],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return model


def same(a: Any, b: Any) -> bool:
    """Equal nested state (tensors compared bit for bit)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def flip(path: Path, at: int) -> bytes:
    """Flip one bit of ``path`` at offset ``at`` (the size stays); the original bytes."""
    data = path.read_bytes()
    damaged = bytearray(data)
    damaged[at] ^= 0x01
    path.write_bytes(bytes(damaged))
    assert path.read_bytes() != data
    assert path.stat().st_size == len(data)
    return data


def test_a_verified_resume_loads_the_same_state_as_an_unverified_one(tmp_path: Path) -> None:
    """A fit resumed from ``last.ckpt`` with verify_on_load ends where an unverified resume
    ends, and the verified load returns the very dict the unverified one does."""
    root = tmp_path / "ckpts"
    fit(root, AtomicCheckpointIO(), steps=4)
    last = root / "last.ckpt"
    assert b"atomic_ckpt " in zipfile.ZipFile(last).comment  # the checksum it carries
    plain = AtomicCheckpointIO().load_checkpoint(last)
    verified = AtomicCheckpointIO(verify_on_load=True).load_checkpoint(last)
    assert same(plain, verified)
    assert same(torch.load(last, weights_only=True), plain)  # still a plain torch.save file

    start = tmp_path / "start.ckpt"  # the resumed fits save over last.ckpt
    shutil.copyfile(last, start)
    a = fit(root, AtomicCheckpointIO(), steps=6, ckpt_path=str(start))
    b = fit(root, AtomicCheckpointIO(verify_on_load=True), steps=6, ckpt_path=str(start))
    assert same(a.state_dict(), b.state_dict())
    assert not same(a.state_dict(), fit(tmp_path / "fresh", AtomicCheckpointIO(), 2).state_dict())


def test_a_damaged_file_is_refused_with_an_error_naming_it(tmp_path: Path) -> None:
    """One bit flipped in a tensor's bytes (same size): the unverified load takes the damage
    silently, the verified one raises VerificationError naming the file and loads nothing."""
    io = AtomicCheckpointIO(verify_on_load=True)
    path = tmp_path / "epoch=0.ckpt"
    weights = torch.arange(1 << 12, dtype=torch.float32)
    io.save_checkpoint({"w": weights}, path)
    data = path.read_bytes()
    at = data.index(weights.numpy().tobytes()) + 1000  # inside the tensor's data
    flip(path, at)
    loaded = AtomicCheckpointIO().load_checkpoint(path)
    assert not torch.equal(loaded["w"], weights)  # what verification is for
    with pytest.raises(VerificationError, match="checksum") as caught:
        io.load_checkpoint(path)
    assert caught.value.path == path
    assert str(path) in str(caught.value)
    assert "verify_on_load=False" in str(caught.value)


def test_a_file_without_a_checksum_is_refused_and_checksum_none_saves_none(
    tmp_path: Path,
) -> None:
    """A plain torch.save file (another CheckpointIO's), a ``checksum=None`` save, a
    truncated file and a damaged record are refused by a verified load; an unknown
    algorithm is refused at construction."""
    plain = tmp_path / "plain.ckpt"
    torch.save({"w": torch.ones(3)}, plain)
    none = tmp_path / "none.ckpt"
    AtomicCheckpointIO(checksum=None).save_checkpoint({"w": torch.ones(3)}, none)
    assert zipfile.ZipFile(none).comment == b""
    io = AtomicCheckpointIO(verify_on_load=True)
    for path in (plain, none):
        with pytest.raises(VerificationError, match="carries no checksum"):
            io.load_checkpoint(path)
    good = tmp_path / "good.ckpt"
    AtomicCheckpointIO(checksum="sha256").save_checkpoint({"w": torch.ones(3)}, good)
    assert torch.equal(io.load_checkpoint(good)["w"], torch.ones(3))
    data = good.read_bytes()
    torn = tmp_path / "torn.ckpt"
    torn.write_bytes(data[: len(data) // 2])
    with pytest.raises(VerificationError, match=r"not a complete torch\.save file"):
        io.load_checkpoint(torn)
    flip(good, len(data) - 3)  # inside the record's JSON
    with pytest.raises(VerificationError, match=r"damaged|checksum"):
        io.load_checkpoint(good)
    with pytest.raises(ValueError, match="unknown checksum"):
        AtomicCheckpointIO(checksum="md5")


def test_a_verified_load_fetches_each_byte_from_storage_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a cold cache, hashing and loading a 24 MiB file reads it from storage once (a
    hash, then a separate read by path, would read it twice); the file was hashed through
    one mapping, and torch.load ran while it was held."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux)")
    path = tmp_path / "big.ckpt"
    state = {"w": torch.randn(6 << 20), "step": 7}
    AtomicCheckpointIO().save_checkpoint(state, path)
    size = path.stat().st_size
    mapped: list[str] = []
    real_map = _checked.map_file

    def counting_map(target: str, algorithm: str | None) -> tuple[memoryview, str | None]:
        mapped.append(target)
        return real_map(target, algorithm)

    monkeypatch.setattr(_checked, "map_file", counting_map)
    io = AtomicCheckpointIO(verify_on_load=True)

    evict(path)
    before = storage_bytes()
    loaded = io.load_checkpoint(path)
    read = storage_bytes() - before
    assert mapped == [str(path)]
    assert same(loaded, state)
    if read == 0:  # a filesystem without storage (tmpfs): nothing to count
        pytest.skip(f"{tmp_path} reads nothing from storage")
    assert 0.9 * size <= read <= 1.1 * size, (read, size)

    # The measure tells once from twice: hashing, dropping the pages, then loading.
    evict(path)
    before = storage_bytes()
    with _checked.verified(path):
        pass
    evict(path)
    io.verify_on_load = False
    io.load_checkpoint(path)
    assert storage_bytes() - before >= 1.8 * size


class _FakeStrategy:
    """What the sharded mixin calls on its Lightning base: broadcast and load_checkpoint."""

    def __init__(self, io: AtomicCheckpointIO) -> None:
        self.checkpoint_io = io
        self.loaded: list[str] = []

    def broadcast(self, obj: Any) -> Any:
        return obj

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        self.loaded.append(os.fspath(checkpoint_path))
        return torch.load(checkpoint_path, weights_only=True)


class _Sharded(_AtomicShardedSave, _FakeStrategy):
    pass


def test_the_sharded_strategies_verify_files_and_refuse_directories(tmp_path: Path) -> None:
    """The sharded strategies load without the CheckpointIO: with its verify_on_load, a
    full-state file is checked first (a damaged one never reaches the loader) and a
    checkpoint directory, whose shards carry no checksums, is refused."""
    path, other = tmp_path / "full.ckpt", tmp_path / "other.ckpt"
    for each in (path, other):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(64)}, each)
    strategy = _Sharded(AtomicCheckpointIO(verify_on_load=True))
    assert torch.equal(strategy.load_checkpoint(path)["w"], torch.ones(64))
    flip(path, 100)
    with pytest.raises(VerificationError, match=str(path)):
        strategy.load_checkpoint(path)
    assert len(strategy.loaded) == 1  # the damaged file was never loaded
    assert strategy.loaded[0].startswith("/proc/self/fd/")  # the file verified, not a name
    sharded = tmp_path / "epoch=0.ckpt"
    sharded.mkdir()
    with pytest.raises(ValueError, match="sharded checkpoint directory"):
        strategy.load_checkpoint(sharded)
    unverified = _Sharded(AtomicCheckpointIO())
    unverified.load_checkpoint(other)  # no verify_on_load: the strategy's own load
    assert unverified.loaded == [str(other)]


def test_a_verified_load_returns_the_bytes_it_hashed_even_if_the_file_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is replaced by a one-bit-flipped copy right after the checksum matched: the
    load returns the verified tensor (read from the mapping hashed), never the damaged one."""
    io = AtomicCheckpointIO(verify_on_load=True)
    path = tmp_path / "epoch=0.ckpt"
    weights = torch.arange(1 << 12, dtype=torch.float32)
    io.save_checkpoint({"w": weights}, path)
    at = path.read_bytes().index(weights.numpy().tobytes()) + 1000
    real = _checked.verified
    fired = []

    @contextlib.contextmanager
    def then_replace(target: Any) -> Iterator[Any]:
        with real(target) as view:
            copy = tmp_path / "damaged.ckpt"
            shutil.copyfile(path, copy)
            flip(copy, at)
            os.replace(copy, path)  # a new inode under the name, after the hash
            fired.append(True)
            yield view

    monkeypatch.setattr(_checked, "verified", then_replace)
    loaded = io.load_checkpoint(path)
    assert fired == [True]
    assert torch.equal(loaded["w"], weights)
    assert not torch.equal(torch.load(path, weights_only=True)["w"], weights)  # damaged now


def test_a_sharded_strategy_loads_the_file_it_verified_even_if_the_name_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 item 7: right after the checksum matched, the file is replaced by a copy with
    one bit flipped. The strategy (which reads by the path it is given) still loads the
    verified tensor: it was handed the descriptor the check opened, not the name; the
    strategy's own broadcast is skipped for that call (each rank's descriptor is its own)
    and is back afterwards."""
    io = AtomicCheckpointIO(verify_on_load=True)
    path = tmp_path / "epoch=0.ckpt"
    weights = torch.arange(1 << 12, dtype=torch.float32)
    io.save_checkpoint({"w": weights}, path)
    at = path.read_bytes().index(weights.numpy().tobytes()) + 1000
    real = _checked.verified
    fired = []

    @contextlib.contextmanager
    def then_replace(target: Any, **kwargs: Any) -> Iterator[Any]:
        with real(target, **kwargs) as view:
            copy = tmp_path / "damaged.ckpt"
            shutil.copyfile(path, copy)
            flip(copy, at)
            os.replace(copy, path)  # a new inode under the name, after the hash
            fired.append(kwargs)
            yield view

    monkeypatch.setattr(_checked, "verified", then_replace)
    strategy = _Sharded(io)
    loaded = strategy.load_checkpoint(path)
    assert fired, "the replacement did not run after the check"
    assert "fd" in fired[0]
    assert torch.equal(loaded["w"], weights)
    assert not torch.equal(torch.load(path, weights_only=True)["w"], weights)  # damaged now
    assert "broadcast" not in vars(strategy)  # the class's own again
    with pytest.raises(VerificationError, match="checksum"):  # the damage is caught next
        strategy.load_checkpoint(path)
