"""A verified load reads only the bytes it verified, everywhere (issue 30, the outside
attack of main): ``resume(verify=True)``, its early-pickle shortcut included, and
``load_state(VerifiedCheckpoint)`` never read a file of the checkpoint by its path, never
follow a symlink inside it, and deserialize the pickles and the JSON from bytes whose
hash they checked themselves; the model's safetensors come from the mapping that was
hashed, which a replacement of the file (by rename, as every commit does) cannot change."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import atomic_ckpt.torch as atorch  # noqa: E402
from atomic_ckpt import MARKER, CheckpointDir, VerificationError, VerifiedCheckpoint  # noqa: E402
from atomic_ckpt.torch import (  # noqa: E402
    FROZEN_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    STATE_FILES,
    load_state,
    resume,
    save_state,
)


class Net(torch.nn.Module):
    """A trained layer and a frozen one (``carry_frozen`` puts it in FROZEN_FILE)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)
        self.head.requires_grad_(False)


def _objects(seed: int, lr: float = 0.1) -> tuple[Net, Any, Any]:
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.SGD(model.body.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=lr)
    return model, opt, sched


def _save(ckpts: CheckpointDir, step: int, seed: int, lr: float) -> Net:
    model, opt, sched = _objects(seed, lr)
    save_state(
        ckpts, step, model=model, optimizer=opt, scheduler=sched, epoch=seed, carry_frozen=True
    )
    return model


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _commit_with_a_link(tmp_path: Path, name: str) -> tuple[CheckpointDir, Path]:
    """Step 1 committed with ``name`` a symlink to a file outside the checkpoint (the same
    file of another save, which the manifest never hashed); returns the root and the link."""
    scratch = CheckpointDir(tmp_path / "scratch")
    _save(scratch, 1, seed=1, lr=0.1)
    _save(scratch, 2, seed=2, lr=0.5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(scratch.path_of(2) / name, elsewhere / name)
    ckpts = CheckpointDir(tmp_path / "run")
    with ckpts.begin(1) as commit:
        for entry in os.scandir(scratch.path_of(1)):
            if entry.name in STATE_FILES and entry.name != name:
                shutil.copy(entry.path, commit.path / entry.name)
        os.symlink(elsewhere / name, commit.path / name)
    commit.publish()
    link = ckpts.path_of(1) / name
    assert link.is_symlink()
    return ckpts, link


LINKED = [MODEL_FILE, FROZEN_FILE, STATE_FILE, OPTIMIZER_FILE, SCHEDULER_FILE]


@pytest.mark.parametrize("name", LINKED)
@pytest.mark.parametrize("pickles", [True, False], ids=["with-pickles", "model-only"])
def test_a_verified_resume_never_follows_a_symlink_inside_a_committed_checkpoint(
    tmp_path: Path, name: str, pickles: bool
) -> None:
    """A committed checkpoint whose ``name`` is a link to a file elsewhere verifies (the
    manifest records the link), but resume(verify=True) refuses to load through it: a
    VerificationError (an OSError) naming the file and saying it is a symlink; nothing is
    loaded into the model."""
    ckpts, link = _commit_with_a_link(tmp_path, name)
    model, opt, sched = _objects(seed=9)
    mine = _objects(seed=9)[0]
    objects = {"optimizer": opt, "scheduler": sched} if pickles else {}
    if not pickles and name in (OPTIMIZER_FILE, SCHEDULER_FILE):
        assert resume(ckpts, model=model, verify=True) is not None  # not read: not refused
        return
    with pytest.raises(VerificationError, match="symlink") as caught:
        resume(ckpts, model=model, verify=True, **objects)
    assert str(link) in str(caught.value)
    assert isinstance(caught.value, OSError)
    assert _same(model, mine)


@pytest.mark.parametrize("name", LINKED)
def test_load_state_of_a_verified_checkpoint_never_follows_a_symlink_in_it(
    tmp_path: Path, name: str
) -> None:
    """``load_state(resume_verified(STATE_FILES))`` refuses a linked file the same way."""
    ckpts, link = _commit_with_a_link(tmp_path, name)
    verified = ckpts.resume_verified(STATE_FILES)
    assert verified is not None
    model, opt, sched = _objects(seed=9)
    with pytest.raises(VerificationError, match="symlink") as caught:
        load_state(verified, model=model, optimizer=opt, scheduler=sched)
    assert str(link) in str(caught.value)


def test_a_symlink_put_in_place_of_a_file_after_the_commit_is_not_followed(
    tmp_path: Path,
) -> None:
    """Step 2's model file replaced by a link after its commit: step 2 does not verify,
    so the verified resume loads step 1 (never the link's target)."""
    ckpts = CheckpointDir(tmp_path / "run")
    first = _save(ckpts, 1, seed=1, lr=0.1)
    _save(ckpts, 2, seed=2, lr=0.2)
    target = tmp_path / "other.safetensors"
    shutil.copy(ckpts.path_of(2) / MODEL_FILE, target)
    os.unlink(ckpts.path_of(2) / MODEL_FILE)
    os.symlink(target, ckpts.path_of(2) / MODEL_FILE)
    model, opt, sched = _objects(seed=9)
    state = resume(ckpts, model=model, optimizer=opt, scheduler=sched, verify=True)
    assert state is not None
    assert state.step == 1
    assert _same(model, first)


def _write_in_place(path: Path, data: bytes) -> None:
    """``data`` written over ``path``'s bytes (same inode, same size), its mtime restored."""
    st = path.stat()
    assert len(data) == st.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _other_bytes(tmp_path: Path, name: str, lr: float) -> bytes:
    """``name`` as a save with learning rate ``lr`` writes it (same seed: same size)."""
    other = CheckpointDir(tmp_path / f"other-{lr}")
    _save(other, 1, seed=1, lr=lr)
    return (other.path_of(1) / name).read_bytes()


def test_the_early_pickles_are_the_bytes_hashed_not_merely_the_same_inode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """optimizer.pt is overwritten in place (same inode, size and mtime) before the resume
    and put back before the verify hashes it: the early deserialization read bytes that
    were never verified, so its result is dropped and the verified bytes are loaded."""
    ckpts = CheckpointDir(tmp_path / "run")
    _save(ckpts, 1, seed=1, lr=0.1)
    opt_file = ckpts.path_of(1) / OPTIMIZER_FILE
    committed = opt_file.read_bytes()
    forged = _other_bytes(tmp_path, OPTIMIZER_FILE, lr=0.5)
    assert forged != committed
    _write_in_place(opt_file, forged)
    loaded_early = threading.Event()
    real_load, real_verified = atorch._load_pickle, CheckpointDir.resume_verified

    def load(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_load(*args, **kwargs)
        finally:
            loaded_early.set()

    put_back: list[bool] = []

    def verified(self: CheckpointDir, *args: Any, **kwargs: Any) -> VerifiedCheckpoint | None:
        assert loaded_early.wait(timeout=60)
        _write_in_place(opt_file, committed)  # what the manifest hashed, back in place
        put_back.append(True)
        return real_verified(self, *args, **kwargs)

    monkeypatch.setattr(atorch, "_load_pickle", load)
    monkeypatch.setattr(CheckpointDir, "resume_verified", verified)
    model, opt, sched = _objects(seed=9, lr=0.9)
    state = resume(ckpts, model=model, optimizer=opt, scheduler=sched, verify=True)
    assert put_back == [True]
    assert state is not None
    assert opt.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("name", [OPTIMIZER_FILE, SCHEDULER_FILE, STATE_FILE])
def test_an_in_place_write_after_the_verify_is_never_loaded(tmp_path: Path, name: str) -> None:
    """The pickles and the JSON are copied out of the verified view and hashed again before
    they are parsed: bytes written into the file in place after the verify (the view is
    MAP_PRIVATE: no snapshot) make load_state raise VerificationError naming the file."""
    ckpts = CheckpointDir(tmp_path / "run")
    _save(ckpts, 1, seed=1, lr=0.1)
    verified = ckpts.resume_verified(STATE_FILES)
    assert verified is not None
    target = ckpts.path_of(1) / name
    if name == STATE_FILE:
        forged = target.read_bytes().replace(b'"epoch": 1', b'"epoch": 7')
    else:
        forged = _other_bytes(tmp_path, name, lr=0.5)
    assert forged != target.read_bytes()
    _write_in_place(target, forged)
    model, opt, sched = _objects(seed=9, lr=0.9)
    with pytest.raises(VerificationError, match="changed since it was verified") as caught:
        load_state(verified, model=model, optimizer=opt, scheduler=sched)
    assert str(target) in str(caught.value)
    assert opt.param_groups[0]["lr"] == 0.9


@pytest.mark.parametrize("name", [MODEL_FILE, FROZEN_FILE, OPTIMIZER_FILE, STATE_FILE])
def test_a_file_replaced_by_rename_after_the_verify_loads_the_verified_bytes(
    tmp_path: Path, name: str
) -> None:
    """The documented guarantee for the model's safetensors too: a file replaced after the
    verify (by rename, its size and mtime the same) is not what load_state loads."""
    ckpts = CheckpointDir(tmp_path / "run")
    saved = _save(ckpts, 1, seed=1, lr=0.1)
    verified = ckpts.resume_verified(STATE_FILES)
    assert verified is not None
    target = ckpts.path_of(1) / name
    other = CheckpointDir(tmp_path / "other")
    _save(other, 1, seed=2, lr=0.5)
    replacement = target.with_name(name + ".new")
    shutil.copy(other.path_of(1) / name, replacement)
    if name == STATE_FILE:
        replacement.write_bytes(target.read_bytes().replace(b'"epoch": 1', b'"epoch": 7'))
    assert replacement.read_bytes() != target.read_bytes()
    assert replacement.stat().st_size == target.stat().st_size
    st = target.stat()
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(replacement, target)
    model, opt, sched = _objects(seed=9, lr=0.9)
    state = load_state(verified, model=model, optimizer=opt, scheduler=sched)
    assert _same(model, saved)
    assert opt.param_groups[0]["lr"] == 0.1
    assert state.epoch == 1


def test_the_early_shortcut_requires_a_verified_view_of_every_file_it_loads(
    tmp_path: Path,
) -> None:
    """A checkpoint whose marker records no files (a legacy, empty marker) has no verified
    bytes: resume(verify=True) refuses it (VerificationError saying so) instead of reading
    its files by path, as its early shortcut did."""
    ckpts = CheckpointDir(tmp_path / "run")
    _save(ckpts, 1, seed=1, lr=0.1)
    (ckpts.path_of(1) / MARKER).write_bytes(b"")  # a legacy marker: complete, nothing recorded
    assert ckpts.latest() is not None
    model, opt, _ = _objects(seed=9)
    mine = _objects(seed=9)[0]
    with pytest.raises(VerificationError, match="records no files"):
        resume(ckpts, model=model, optimizer=opt, verify=True)
    assert _same(model, mine)
