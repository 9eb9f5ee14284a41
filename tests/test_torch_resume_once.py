"""A verified resume reads each byte once: it hashes what it loads, and loads what it hashed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from treeutil import evict, storage_bytes

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import atomic_ckpt.torch as atorch  # noqa: E402
from atomic_ckpt import CheckpointDir, VerifiedCheckpoint  # noqa: E402
from atomic_ckpt.torch import MODEL_FILE, OPTIMIZER_FILE, STATE_FILES, resume, save_state  # noqa: E402


class Mixed(torch.nn.Module):
    """Tied weights and buffers of several dtypes: what a real model's state holds."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(40, 8)
        self.head = torch.nn.Linear(8, 40, bias=False)
        self.head.weight = self.embed.weight
        self.half = torch.nn.Linear(8, 8).to(torch.bfloat16)
        self.register_buffer("count", torch.arange(5, dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("f16", torch.randn(3, 2).half())
        self.register_buffer("empty", torch.zeros(0, 4))


def _state(seed: int) -> tuple[Mixed, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Mixed()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = model.head(model.embed(torch.tensor([1, 2]))).sum()
    loss.backward()
    opt.step()
    return model, opt


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _commit(ckpts: CheckpointDir, step: int, seed: int) -> Mixed:
    model, opt = _state(seed)
    save_state(ckpts, step, model=model, optimizer=opt)
    return model


def test_a_verified_resume_loads_the_same_state_as_an_unverified_one(tmp_path: Path) -> None:
    """Tied weights, bf16/f16/int64/bool/empty tensors and the optimizer round-trip."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    saved = _commit(ckpts, 3, seed=1)
    plain, verified = _state(9)[0], _state(9)
    state = resume(ckpts, model=plain)
    assert state is not None
    assert state.step == 3
    vstate = resume(ckpts, model=verified[0], optimizer=verified[1], verify=True)
    assert vstate is not None
    assert vstate.step == 3
    assert _same(plain, saved)
    assert _same(verified[0], saved)
    assert verified[0].head.weight is verified[0].embed.weight  # still tied after the load


def test_a_verified_resume_opens_no_file_again_after_hashing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loaders get the hashed bytes: the model comes from the hashed mapping (safetensors'
    file loader is never called), and from a cold cache the checkpoint comes off storage once."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    _commit(ckpts, 1, seed=2)
    ckpt = ckpts.latest()
    assert ckpt is not None
    total = sum(e.size for e in ckpt.manifest.files if e.type == "file")

    def no_file_load(*args: object, **kwargs: object) -> object:
        raise AssertionError("the model file was opened again")

    monkeypatch.setattr(atorch, "load_model", no_file_load)
    model, opt = _state(5)
    os.sync()
    evict(ckpt.path)
    before = storage_bytes()
    state = resume(ckpts, model=model, optimizer=opt, verify=True)
    read = storage_bytes() - before
    assert state is not None
    if read:  # 0 where the filesystem has no storage (tmpfs)
        assert read < 1.5 * total + (1 << 20), (read, total)  # once, plus markers and readahead


def test_a_newest_checkpoint_that_does_not_verify_is_skipped_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage the newest model file (same size): the verified resume loads the older step,
    warning about the newer one; an unverified resume would have loaded the damage."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    older = _commit(ckpts, 1, seed=3)
    _commit(ckpts, 2, seed=4)
    model_file = ckpts.path_of(2) / MODEL_FILE
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF
    model_file.write_bytes(bytes(data))
    model = _state(7)[0]
    with caplog.at_level(logging.WARNING):
        state = resume(ckpts, model=model, verify=True)
    assert state is not None
    assert state.step == 1
    assert _same(model, older)
    assert any("does not verify" in r.getMessage() for r in caplog.records)


def test_resume_verified_returns_the_bytes_it_hashed(tmp_path: Path) -> None:
    """CheckpointDir.resume_verified: the checkpoint, and exactly the asked-for files' bytes."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    _commit(ckpts, 4, seed=6)
    found = ckpts.resume_verified([*STATE_FILES, "not-there.bin"])
    assert isinstance(found, VerifiedCheckpoint)
    assert found.checkpoint.step == 4
    assert set(found.files) == {MODEL_FILE, OPTIMIZER_FILE, atorch.STATE_FILE}
    for name, data in found.files.items():
        assert bytes(data) == (found.checkpoint.path / name).read_bytes()
    assert CheckpointDir(tmp_path / "none").resume_verified(STATE_FILES) is None


@pytest.mark.parametrize(
    "damage",
    [
        b"\x01",  # shorter than the 8-byte length
        (10**9).to_bytes(8, "little") + b"{}",  # a header longer than the data
        (2).to_bytes(8, "little") + b"[]",  # a header that is not an object
        (54).to_bytes(8, "little")
        + b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}'
        + bytes(8),  # 4 floats are 16 bytes, not 8
        (4).to_bytes(8, "little") + b"{]}}",  # not JSON
    ],
)
def test_safetensors_bytes_are_parsed_as_untrusted_input(damage: bytes) -> None:
    """Malformed safetensors bytes raise ValueError, never crash or read out of bounds."""
    with pytest.raises(ValueError, match="safetensors"):
        atorch._safetensors_tensors(memoryview(bytearray(damage)))


def _opt_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for s in opt.state_dict()["state"].values() for t in s.values()]


def _same_opt(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = _opt_state(a), _opt_state(b)
    return len(sa) == len(sb) and all(torch.equal(x, y) for x, y in zip(sa, sb, strict=True))


def test_the_pickles_are_deserialized_while_the_checkpoint_is_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimizer's torch.load starts before the verify returns (on another thread), so
    reading it overlaps hashing the rest; it is applied only after the verify."""
    import threading

    ckpts = CheckpointDir(tmp_path / "ckpts")
    _commit(ckpts, 1, seed=2)
    started = threading.Event()
    loaded_before_verified: list[bool] = []
    real_load, real_verified = atorch._load_pickle, CheckpointDir.resume_verified

    def load(*args: object, **kwargs: object) -> object:
        started.set()
        return real_load(*args, **kwargs)  # type: ignore[arg-type]

    def verified(self: CheckpointDir, *args: object, **kwargs: object) -> object:
        loaded_before_verified.append(started.wait(timeout=30))
        return real_verified(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(atorch, "_load_pickle", load)
    monkeypatch.setattr(CheckpointDir, "resume_verified", verified)
    model, opt = _state(5)
    assert resume(ckpts, model=model, optimizer=opt, verify=True) is not None
    assert loaded_before_verified == [True]


def test_a_damaged_newest_optimizer_state_is_not_loaded_even_though_it_was_read_early(
    tmp_path: Path,
) -> None:
    """The newest's optimizer.pt is deserialized while it is verified; it fails the verify,
    so the older checkpoint's optimizer state is what the optimizer ends up with."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    older_model, older_opt = _state(3)
    save_state(ckpts, 1, model=older_model, optimizer=older_opt)
    _commit(ckpts, 2, seed=4)
    opt_file = ckpts.path_of(2) / OPTIMIZER_FILE
    data = bytearray(opt_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a tensor: torch.load still succeeds
    opt_file.write_bytes(bytes(data))
    model, opt = _state(7)
    state = resume(ckpts, model=model, optimizer=opt, verify=True)
    assert state is not None
    assert state.step == 1
    assert _same(model, older_model)
    assert _same_opt(opt, older_opt)


def test_nothing_is_loaded_into_the_model_when_no_checkpoint_verifies(tmp_path: Path) -> None:
    """Every checkpoint damaged: the resume refuses, and the objects keep their own state."""
    from atomic_ckpt import UnusableCheckpointsError

    ckpts = CheckpointDir(tmp_path / "ckpts")
    _commit(ckpts, 1, seed=3)
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        f = ckpts.path_of(1) / name
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    model, opt = _state(7)
    mine_model, mine_opt = _state(7)
    with pytest.raises(UnusableCheckpointsError, match="does not verify"):
        resume(ckpts, model=model, optimizer=opt, verify=True)
    assert _same(model, mine_model)
    assert _same_opt(opt, mine_opt)


def test_a_checkpoint_replaced_while_it_is_verified_is_loaded_from_what_was_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1 re-committed between the early open of its pickles and the verify: the early
    results (the old files) are dropped; the optimizer gets the state that was verified."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    _commit(ckpts, 1, seed=3)
    new_model, new_opt = _state(8)
    real_verified = CheckpointDir.resume_verified
    replaced: list[bool] = []

    def verified(self: CheckpointDir, *args: object, **kwargs: object) -> object:
        save_state(ckpts, 1, model=new_model, optimizer=new_opt)  # replaces the stale 1/
        replaced.append(True)
        return real_verified(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CheckpointDir, "resume_verified", verified)
    model, opt = _state(7)
    assert resume(ckpts, model=model, optimizer=opt, verify=True) is not None
    assert replaced == [True]
    assert _same(model, new_model)
    assert _same_opt(opt, new_opt)
