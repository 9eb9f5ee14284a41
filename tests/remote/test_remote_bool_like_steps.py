"""A remote root takes a step the way a local one does: a bool is no step, nor is anything
bool-like (a numpy ``bool_``, a torch bool tensor, which converts to 0 or 1 through
``__index__``); an integer of any kind (numpy, torch, IntEnum) is one."""

from __future__ import annotations

import enum
import uuid
from pathlib import Path

import numpy as np
import pytest

from atomic_ckpt import CheckpointDir, InvalidStepError
from atomic_ckpt.remote import RemoteCheckpointDir

torch = pytest.importorskip("torch")


class Epoch(enum.IntEnum):
    THREE = 3


def _root(tmp_path: Path) -> RemoteCheckpointDir:
    return RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")


@pytest.mark.parametrize(
    "flag", [True, np.True_, torch.tensor(True)], ids=["bool", "numpy", "torch"]
)
def test_a_remote_root_refuses_a_bool_like_step_as_a_local_one_does(
    tmp_path: Path, flag: object
) -> None:
    """``RemoteCheckpointDir.begin(torch.tensor(True))`` began step 1 (its own step check
    took ``__index__`` and refused only a real bool) where ``CheckpointDir.begin`` raises
    InvalidStepError: both refuse it, before anything is staged."""
    rdir = _root(tmp_path)
    with pytest.raises(InvalidStepError, match="non-negative int"):
        CheckpointDir(tmp_path / "local").begin(flag)  # type: ignore[arg-type]
    for call in (rdir.begin, rdir.url_of, rdir.get, rdir.verify):
        with pytest.raises(InvalidStepError, match="non-negative int"):
            call(flag)  # type: ignore[operator]
    assert rdir.entries() == []


@pytest.mark.parametrize(
    "step", [np.int64(3), torch.tensor(3), Epoch.THREE], ids=["numpy", "torch", "IntEnum"]
)
def test_a_remote_root_takes_an_integer_of_any_kind_as_a_step(tmp_path: Path, step: object) -> None:
    """An integer that is not an int (a numpy or 0-d torch integer, an IntEnum) is the step
    it equals, on a remote root as on a local one."""
    rdir = _root(tmp_path)
    with rdir.commit(step) as path:  # type: ignore[arg-type]
        (path / "w").write_bytes(b"3")
    assert rdir.steps() == [3]
    assert rdir.url_of(step).endswith("/3")  # type: ignore[arg-type]
