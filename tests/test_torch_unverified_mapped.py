"""An unverified resume reads the model as a verified one does (issue 30 item 21): mapped,
read ahead, its tensors copied once into the model; never slower than ``verify=True``
(``benchmarks/resume.py`` measures the two side by side; no timings here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from treeutil import evict, storage_bytes

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import atomic_ckpt.torch as atorch  # noqa: E402
from atomic_ckpt import CheckpointDir  # noqa: E402
from atomic_ckpt.torch import MODEL_FILE, load_state, resume, save_state  # noqa: E402


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    return model, opt


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_an_unverified_resume_loads_the_model_from_a_mapping_never_the_file_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors' file loader (two copies: new tensors, then the model) is never called;
    the model file is mapped once, and the state equals the saved one."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    saved, opt = _model(1)
    save_state(ckpts, 1, model=saved, optimizer=opt)
    mapped: list[Path] = []
    real = atorch._mapped

    def counting(path: Path) -> Any:
        mapped.append(path)
        view = real(path)
        assert view is not None, "the model file was not mapped"
        return view

    def no_file_load(*args: object, **kwargs: object) -> object:
        raise AssertionError("the unverified resume read the model through the file loader")

    monkeypatch.setattr(atorch, "_mapped", counting)
    monkeypatch.setattr(atorch, "load_model", no_file_load)
    model, opt2 = _model(2)
    assert not _same(model, saved)
    state = resume(ckpts, model=model, optimizer=opt2)
    assert state is not None
    assert state.step == 1
    assert mapped == [ckpts.path_of(1) / MODEL_FILE]
    assert _same(model, saved)
    assert opt2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()


def test_an_unmappable_model_file_falls_back_to_the_file_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file cannot be mapped (a filesystem without mmap), the load reads it by
    its path as before, and a missing model file is still FileNotFoundError."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    saved, _ = _model(3)
    ckpt = save_state(ckpts, 1, model=saved)
    monkeypatch.setattr(atorch, "_mapped", lambda path: None)
    model, _ = _model(4)
    load_state(ckpt, model=model)
    assert _same(model, saved)
    monkeypatch.undo()
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / atorch.STATE_FILE).write_text('{"step": 1}\n')
    with pytest.raises(FileNotFoundError):
        load_state(loose, model=model)


def test_an_unverified_resume_reads_the_checkpoint_from_storage_once(tmp_path: Path) -> None:
    """From a cold cache the unverified resume reads about the checkpoint's size."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux)")
    ckpts = CheckpointDir(tmp_path / "ckpts")
    torch.manual_seed(5)
    big = torch.nn.Linear(1024, 1024)
    save_state(ckpts, 1, model=big)
    ckpt = ckpts.latest()
    assert ckpt is not None
    total = sum(e.size for e in ckpt.manifest.files if e.type == "file")
    target = torch.nn.Linear(1024, 1024)
    resume(ckpts, model=target)  # imports and first-use costs, not counted
    os.sync()
    evict(ckpt.path)
    before = storage_bytes()
    assert resume(ckpts, model=target) is not None
    read = storage_bytes() - before
    assert torch.equal(target.weight, big.weight)
    if read == 0:  # a filesystem without storage (tmpfs): nothing to count
        pytest.skip(f"{tmp_path} reads nothing from storage")
    assert read < 1.5 * total + (1 << 20), (read, total)


def test_an_unverified_resume_of_a_carry_frozen_state_maps_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``carry_frozen=True`` the state is two safetensors files: the unverified resume
    maps both (as the verified one reads both from its views) and never calls the file
    loader, which copied each tensor twice; the state equals the saved one."""
    from atomic_ckpt.torch import FROZEN_FILE, _frozen

    ckpts = CheckpointDir(tmp_path / "ckpts")
    saved, opt = _model(5)
    saved[0].requires_grad_(False)
    save_state(ckpts, 1, model=saved, optimizer=opt, carry_frozen=True)
    assert (ckpts.path_of(1) / FROZEN_FILE).is_file()
    mapped: list[str] = []
    real = atorch._mapped

    def counting(path: Path) -> Any:
        mapped.append(path.name)
        return real(path)

    def no_file_load(*args: object, **kwargs: object) -> object:
        raise AssertionError("the unverified resume read a state file through the file loader")

    monkeypatch.setattr(atorch, "_mapped", counting)
    monkeypatch.setattr(_frozen, "_mapped", counting, raising=False)
    monkeypatch.setattr(_frozen, "load_file", no_file_load)
    model, opt2 = _model(6)
    state = resume(ckpts, model=model, optimizer=opt2)
    assert state is not None
    assert sorted(mapped) == sorted([MODEL_FILE, FROZEN_FILE])
    assert _same(model, saved)
