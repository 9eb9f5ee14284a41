"""save_state(carry_frozen=True) (issue 32 item 3): frozen parameters and constant buffers
go into a file of their own, carried from the previous checkpoint when every tensor's hash
matches, written when one differs; every checkpoint still loads (and verifies) alone."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402

from atomic_ckpt import CheckpointDir  # noqa: E402
from atomic_ckpt.torch import (  # noqa: E402
    FROZEN_FILE,
    MODEL_FILE,
    STATE_FILE,
    STATE_FILES,
    load_state,
    resume,
    save_state,
)

LINKS = ("reflink", "hardlink", "copy")


class Net(torch.nn.Module):
    """A frozen embedding, a trainable layer, a constant and a running buffer."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(32, 8)
        self.layer = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.arange(8.0))
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.embed.requires_grad_(False)


def _train(model: torch.nn.Module, opt: Any) -> None:
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    opt.step()
    opt.zero_grad()


def _keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def _how(caplog: pytest.LogCaptureFixture, step: int) -> str:
    """What the log line of ``step``'s frozen file says."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "atomic_ckpt.torch"
        and r.getMessage().startswith(f"step {step}: ")
        and r.levelno == logging.INFO
    ]
    assert len(lines) == 1, lines
    return lines[0]


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _saves(ckpts: CheckpointDir, model: Net, steps: range, **kw: Any) -> Any:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for step in steps:
        _train(model, opt)
        save_state(ckpts, step, model=model, optimizer=opt, carry_frozen=True, **kw)
    return opt


@pytest.fixture(autouse=True)
def _info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="atomic_ckpt.torch")


def test_unchanged_frozen_tensors_are_carried_and_the_link_kind_is_logged(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 1 writes the frozen file; step 2, after a training step that touched only the
    trainable layer, carries it (a hard link on ext4/tmpfs: the same inode) and says so."""
    model = Net()
    _saves(ckpts, model, range(1, 3), constant_buffers=["scale"])
    assert "written: no earlier checkpoint" in _how(caplog, 1)
    line = _how(caplog, 2)
    assert "carried from step 1 by" in line
    how = line.rsplit(" ", 1)[1]
    assert how in LINKS
    first, second = (ckpts.path_of(s) / FROZEN_FILE for s in (1, 2))
    if how == "hardlink":
        assert os.stat(first).st_ino == os.stat(second).st_ino
    assert _keys(second) == {"embed.weight", "scale"}
    assert _keys(ckpts.path_of(2) / MODEL_FILE) == {"layer.weight", "layer.bias", "count"}
    ckpts.verify(2)
    fresh = Net(seed=1)
    assert not _same(fresh, model)
    load_state(ckpts.get(2), model=fresh)
    assert _same(fresh, model)


def test_a_changed_frozen_tensor_is_written_again(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """A frozen weight changed in place (no grad, so no optimizer saw it) and a constant
    buffer changed: their hashes differ, the file is written anew and loads the new values."""
    model = Net()
    opt = _saves(ckpts, model, range(1, 2), constant_buffers=["scale"])
    with torch.no_grad():
        model.embed.weight[3].add_(1.0)
    save_state(ckpts, 2, model=model, optimizer=opt, carry_frozen=True, constant_buffers=["scale"])
    assert "written: 1 tensors differ from step 1's (embed.weight)" in _how(caplog, 2)
    model.get_buffer("scale").mul_(2)
    save_state(ckpts, 3, model=model, optimizer=opt, carry_frozen=True, constant_buffers=["scale"])
    assert "1 tensors differ from step 2's (scale)" in _how(caplog, 3)
    inodes = {os.stat(ckpts.path_of(s) / FROZEN_FILE).st_ino for s in (1, 2, 3)}
    assert len(inodes) == 3
    fresh = Net(seed=1)
    load_state(ckpts.get(3), model=fresh)
    assert _same(fresh, model)
    old = Net(seed=1)
    load_state(ckpts.get(1), model=old)
    assert not torch.equal(old.embed.weight, model.embed.weight)


def test_deleting_the_source_or_copying_the_carrier_alone_loses_nothing(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """Step 2 carried its frozen file from step 1; with step 1 deleted step 2 verifies and
    loads, and a copy of step 2 alone, the root removed, loads too."""
    model = Net()
    _saves(ckpts, model, range(1, 3))
    assert "carried from step 1" in _how(caplog, 2)
    ckpts.delete(1)
    assert ckpts.steps() == [2]
    ckpts.verify(2)
    copy = tmp_path / "elsewhere"
    shutil.copytree(ckpts.path_of(2), copy)
    shutil.rmtree(ckpts.root)
    fresh = Net(seed=1)
    state = load_state(copy, model=fresh)
    assert state.step == 2
    assert _same(fresh, model)


def test_a_copy_without_the_frozen_file_says_what_is_missing(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """The model file names its frozen file: a copy that left it behind is a clear
    FileNotFoundError, not a load of half the model (even with strict=False)."""
    _saves(ckpts, Net(), range(1, 2))
    copy = tmp_path / "partial"
    copy.mkdir()
    for name in (MODEL_FILE, STATE_FILE):
        shutil.copy(ckpts.path_of(1) / name, copy / name)
    with pytest.raises(FileNotFoundError, match=FROZEN_FILE):
        load_state(copy, model=Net(seed=1), strict=False)


def test_the_frozen_set_changing_between_saves(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Unfreezing the embedding and freezing the layer moves tensors between the files: the
    frozen file is written (its names differ), each checkpoint loads its own values; a
    model with nothing frozen writes no frozen file at all."""
    model = Net()
    opt = _saves(ckpts, model, range(1, 2))
    expected_1 = {k: v.clone() for k, v in model.state_dict().items()}
    model.embed.requires_grad_(True)
    model.layer.requires_grad_(False)
    save_state(ckpts, 2, model=model, optimizer=opt, carry_frozen=True)
    assert "3 tensors differ from step 1's (embed.weight, layer.bias, layer.weight)" in (
        _how(caplog, 2)
    )
    assert _keys(ckpts.path_of(2) / FROZEN_FILE) == {"layer.weight", "layer.bias"}
    assert _keys(ckpts.path_of(2) / MODEL_FILE) == {"embed.weight", "scale", "count"}
    model.layer.requires_grad_(True)
    save_state(ckpts, 3, model=model, carry_frozen=True)
    assert "no frozen tensors" in _how(caplog, 3)
    assert not (ckpts.path_of(3) / FROZEN_FILE).exists()
    for step in (2, 3):
        fresh = Net(seed=1)
        load_state(ckpts.get(step), model=fresh)
        assert _same(fresh, model)
    fresh = Net(seed=1)
    load_state(ckpts.get(1), model=fresh)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected_1.items())


def test_verified_loads_read_both_files_from_the_hashed_views(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """resume(verify=True) and load_state(VerifiedCheckpoint) load the carried frozen file;
    replaced on disk after the verify, the load still gets the verified bytes."""
    model = Net()
    opt = _saves(ckpts, model, range(1, 3))
    assert "carried" in _how(caplog, 2)
    fresh = Net(seed=1)
    state = resume(ckpts, model=fresh, optimizer=opt, verify=True)
    assert state is not None
    assert state.step == 2
    assert _same(fresh, model)
    verified = ckpts.resume_verified(STATE_FILES)
    assert verified is not None
    assert FROZEN_FILE in verified.files
    frozen = ckpts.path_of(2) / FROZEN_FILE
    os.unlink(frozen)  # (never written through: the inode is step 1's too)
    frozen.write_bytes(b"\0" * 64)
    fresh = Net(seed=1)
    load_state(verified, model=fresh)
    assert _same(fresh, model)


def test_a_verified_checkpoint_without_the_frozen_view_is_refused(ckpts: CheckpointDir) -> None:
    """A VerifiedCheckpoint that kept the model file but not the frozen file it names is a
    ValueError naming the frozen file, never a read of the unverified path."""
    _saves(ckpts, Net(), range(1, 2))
    verified = ckpts.resume_verified([MODEL_FILE, STATE_FILE])
    assert verified is not None
    with pytest.raises(ValueError, match=FROZEN_FILE):
        load_state(verified, model=Net(seed=1))


def test_resume_verify_skips_a_step_whose_frozen_file_was_damaged(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 3 wrote its own frozen file (a weight changed); damaged in place, step 3 does
    not verify and resume(verify=True) loads step 2 (whose carried file is step 1's)."""
    model = Net()
    opt = _saves(ckpts, model, range(1, 3))
    at_2 = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    save_state(ckpts, 3, model=model, optimizer=opt, carry_frozen=True)
    assert "written" in _how(caplog, 3)
    damaged = ckpts.path_of(3) / FROZEN_FILE
    damaged.write_bytes(b"x" * damaged.stat().st_size)
    fresh = Net(seed=1)
    with caplog.at_level(logging.WARNING):
        state = resume(ckpts, model=fresh, verify=True)
    assert state is not None
    assert state.step == 2
    assert any("skipping checkpoint" in r.getMessage() for r in caplog.records)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in at_2.items())


def test_a_source_changed_after_its_commit_is_not_carried(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 1's frozen data is overwritten in place, its header (and hashes) kept: the
    hashes still match, but the carry finds the file changed since its commit, so the file
    is written from the model instead (a warning says why) and step 2 holds true values."""
    model = Net()
    opt = _saves(ckpts, model, range(1, 2))
    frozen = ckpts.path_of(1) / FROZEN_FILE
    data = bytearray(frozen.read_bytes())
    data[-4:] = b"\xff\xff\xff\xff"
    st = os.stat(frozen)
    with open(frozen, "r+b") as f:  # in place: the fault this test is about
        f.write(data)
    # (a later modification time, as a write a clock tick later leaves)
    os.utime(frozen, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    save_state(ckpts, 2, model=model, optimizer=opt, carry_frozen=True)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("carrying frozen.safetensors from step 1 failed" in r.getMessage() for r in warned)
    assert "carrying it from step 1 failed" in _how(caplog, 2)
    assert os.stat(frozen).st_ino != os.stat(ckpts.path_of(2) / FROZEN_FILE).st_ino
    ckpts.verify(2)
    fresh = Net(seed=1)
    load_state(ckpts.get(2), model=fresh)
    assert _same(fresh, model)


def test_a_previous_checkpoint_without_a_frozen_file_means_a_write(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 1 saved without carry_frozen (one model file): step 2 writes its frozen file."""
    model = Net()
    save_state(ckpts, 1, model=model)
    save_state(ckpts, 2, model=model, carry_frozen=True)
    assert "step 1 has no frozen.safetensors with hashes" in _how(caplog, 2)
    fresh = Net(seed=1)
    load_state(ckpts.get(2), model=fresh)
    assert _same(fresh, model)


def test_tied_frozen_weights_are_stored_once_and_restored_tied(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """A frozen head tied to the frozen embedding is one tensor in the frozen file (as
    save_model stores it), carried, and loads strictly."""

    class Tied(torch.nn.Module):
        def __init__(self, seed: int) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.embed = torch.nn.Embedding(16, 4)
            self.head = torch.nn.Linear(4, 16, bias=False)
            self.head.weight = self.embed.weight
            self.embed.requires_grad_(False)
            self.layer = torch.nn.Linear(4, 4)

    model = Tied(0)
    for step in (1, 2):
        save_state(ckpts, step, model=model, carry_frozen=True)
    assert "carried" in _how(caplog, 2)
    assert len(_keys(ckpts.path_of(2) / FROZEN_FILE)) == 1
    fresh = Tied(1)
    load_state(ckpts.get(2), model=fresh)
    assert torch.equal(fresh.head.weight, model.embed.weight)
    assert fresh.head.weight is fresh.embed.weight


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"carry_frozen": True, "model": None}, TypeError, "needs model="),
        ({"constant_buffers": ["scale"]}, ValueError, "only applies with carry_frozen=True"),
        ({"carry_frozen": "yes"}, TypeError, "True or False"),
        ({"carry_frozen": True, "constant_buffers": "scale"}, TypeError, "collection"),
        ({"carry_frozen": True, "constant_buffers": ["nope"]}, ValueError, "no buffer"),
        ({"carry_frozen": True, "constant_buffers": ["layer.bias"]}, ValueError, "a parameter"),
        ({"carry_frozen": True, "constant_buffers": ["scratch"]}, ValueError, "non-persistent"),
    ],
)
def test_bad_options_are_clear_errors_before_anything_is_written(
    ckpts: CheckpointDir, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Each misuse is refused with a message saying what to do, and no checkpoint is made."""
    options: dict[str, Any] = {"model": Net(), **kwargs}
    with pytest.raises(error, match=match):
        save_state(ckpts, 1, **options)
    assert ckpts.steps() == []


def test_tensor_digests_are_the_xxh3_128_of_their_bytes() -> None:
    """A tensor's digest is xxhash's own hexdigest of its bytes, for every dtype and shape
    the frozen file holds (a 0-d tensor, an empty one)."""
    import xxhash

    from atomic_ckpt.torch import _hash

    tensors = [
        torch.randn(300, 7),
        torch.arange(5, dtype=torch.int8),
        torch.ones(()),
        torch.randn(9).to(torch.bfloat16),
        torch.zeros(0, 4),
        torch.tensor([True, False]),
    ]
    for t in tensors:
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        assert _hash.digest(t) == xxhash.xxh3_128_hexdigest(raw)
