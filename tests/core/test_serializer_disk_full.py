"""A serializer that fails on a full disk with its own error, not an OSError (torch's C++
writer: ``RuntimeError: ... unexpected pos``; safetensors: ``SafetensorError: ... No space
left on device (os error 28)``), aborts the commit with :class:`~atomic_ckpt.DiskFullError`,
its own error the cause; any other error of the block propagates as it is."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from atomic_ckpt import CheckpointDir, DiskFullError
from atomic_ckpt._core.l1_names import errors as _errors


class FakeSafetensorError(Exception):
    """Like safetensors' error: a plain Exception naming the errno in its message."""


def _statvfs_free(monkeypatch: pytest.MonkeyPatch, free: int) -> list[str]:
    """Make os.statvfs report ``free`` bytes available; the paths it was asked about."""
    asked: list[str] = []
    real = os.statvfs

    def fake(path: Any) -> Any:
        asked.append(os.fspath(path))
        st = real(path)

        class St:
            f_frsize = st.f_frsize
            f_bavail = free // st.f_frsize

        return St()

    monkeypatch.setattr(_errors.os, "statvfs", fake)
    return asked


def test_a_runtime_error_on_a_full_disk_is_a_disk_full_error(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's RuntimeError with under 1 MiB free: DiskFullError (ENOSPC) from it."""
    asked = _statvfs_free(monkeypatch, 4096)
    boom = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2")
    with pytest.raises(DiskFullError) as info, ckpts.commit(1):
        raise boom
    assert asked, "the free space was never checked"
    assert info.value.__cause__ is boom
    assert info.value.errno == errno.ENOSPC
    assert ckpts.steps() == []
    assert sorted(os.listdir(ckpts.root)) == []


def test_a_runtime_error_with_room_left_stays_itself(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same RuntimeError with plenty of space free is not taken for a full disk."""
    asked = _statvfs_free(monkeypatch, 10 << 30)
    with pytest.raises(RuntimeError, match="unexpected pos") as info, ckpts.commit(1):
        raise RuntimeError("unexpected pos 1 vs 2")
    assert asked
    assert not isinstance(info.value, DiskFullError)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("Error while serializing: I/O error: No space left on device (os error 28)", 28),
        ("Error while serializing: I/O error: Disk quota exceeded (os error 122)", 122),
    ],
)
def test_an_error_whose_message_names_enospc_is_a_disk_full_error(
    ckpts: CheckpointDir, message: str, code: int
) -> None:
    """A SafetensorError-like error saying ENOSPC or EDQUOT: DiskFullError with that errno."""
    with pytest.raises(DiskFullError) as info, ckpts.commit(1):
        raise FakeSafetensorError(message)
    assert info.value.errno == code
    assert isinstance(info.value.__cause__, FakeSafetensorError)


def test_a_value_error_on_a_full_disk_stays_itself(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a RuntimeError (a C++ writer's) is checked against the free space."""
    _statvfs_free(monkeypatch, 0)
    with pytest.raises(ValueError, match="bad shape"), ckpts.commit(1):
        raise ValueError("bad shape")
