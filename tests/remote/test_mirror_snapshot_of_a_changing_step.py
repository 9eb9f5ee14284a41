"""A Mirror's snapshot of a local step that another writer replaces or deletes while the
snapshot is being taken (attack s15-atk33 on issue 33, gs:// and az:// emulators): the
remote must get one whole save or nothing, and a vanished step must be a clear error."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError
from atomic_ckpt.remote import Mirror, RemoteCheckpointDir, _mirror

OLD = {"a.bin": b"OLD-a" * 100, "b.bin": b"OLD-b" * 100}
NEW = {"a.bin": b"NEW-a" * 100, "b.bin": b"NEW-b" * 100}


def _save(local: CheckpointDir, step: int, files: dict[str, bytes]) -> None:
    with local.commit(step) as path:
        for name, data in files.items():
            (path / name).write_bytes(data)


def _after_first_link(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Run ``action()`` once, right after the snapshot's first hard link is made."""
    real = os.link
    fired: list[bool] = []

    def link(src: Any, dst: Any, **kwargs: Any) -> None:
        real(src, dst, **kwargs)
        if not fired:
            fired.append(True)
            action()

    monkeypatch.setattr(os, "link", link)


def test_a_step_replaced_during_the_snapshot_is_mirrored_whole_or_not_at_all(
    cloud_remote: RemoteCheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local replace racing the snapshot leaves the remote step all-old, all-new or absent."""
    local = CheckpointDir(tmp_path / "local")
    _save(local, 5, OLD)
    _after_first_link(monkeypatch, lambda: _save(local, 5, NEW))
    mirror = Mirror(local, cloud_remote)
    try:
        mirror.mirror(5)
        mirror.wait()
    except Exception:
        pass  # refusing the changed step is fine; publishing a mix is not
    finally:
        monkeypatch.undo()
        mirror.close()
    if cloud_remote.steps():
        got = cloud_remote.fetch(5, tmp_path / "got").path
        contents = {name: (got / name).read_bytes() for name in OLD}
        assert contents in (OLD, NEW), f"the remote step mixes two local saves: {contents}"


def test_a_step_deleted_during_the_snapshot_is_checkpoint_not_found(
    cloud_remote: RemoteCheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local delete racing the snapshot is CheckpointNotFoundError, as for a missing step."""
    local = CheckpointDir(tmp_path / "local")
    _save(local, 5, OLD)
    _save(local, 6, NEW)
    _after_first_link(monkeypatch, lambda: local.delete(5))
    with Mirror(local, cloud_remote) as mirror, pytest.raises(CheckpointNotFoundError):
        mirror.mirror(5)
    assert cloud_remote.steps() == []


def _replace_on_link(
    monkeypatch: pytest.MonkeyPatch, local: CheckpointDir, times: int
) -> list[int]:
    """Replace local step 5 right after each of the first ``times`` snapshots' first link;
    return the list the replacements are counted in."""
    real = os.link
    fired: list[int] = []
    state = {"new_snapshot": True}

    def link(src: Any, dst: Any, **kwargs: Any) -> None:
        real(src, dst, **kwargs)
        if state["new_snapshot"] and len(fired) < times:
            fired.append(1)
            _save(local, 5, {k: v + bytes([len(fired)]) for k, v in NEW.items()})
        state["new_snapshot"] = False

    monkeypatch.setattr(os, "link", link)
    real_snapshot = _mirror._snapshot

    def snapshot(*args: Any) -> Any:
        state["new_snapshot"] = True
        return real_snapshot(*args)

    monkeypatch.setattr(_mirror, "_snapshot", snapshot)
    return fired


def test_a_step_replaced_during_the_snapshot_is_mirrored_as_the_new_save_whole(
    cloud_remote: RemoteCheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot is taken again after a replace: the remote gets the new save, whole."""
    local = CheckpointDir(tmp_path / "local")
    _save(local, 5, OLD)
    fired = _replace_on_link(monkeypatch, local, times=1)
    with Mirror(local, cloud_remote) as mirror:
        mirror.mirror(5)
        monkeypatch.undo()
    assert fired == [1]
    got = cloud_remote.fetch(5, tmp_path / "got").path
    assert {name: (got / name).read_bytes() for name in NEW} == {
        k: v + b"\x01" for k, v in NEW.items()
    }


def test_a_step_replaced_on_every_snapshot_is_refused_with_nothing_queued(
    cloud_remote: RemoteCheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step replaced during each of the SNAPSHOT_TRIES snapshots is StepChangedError."""
    local = CheckpointDir(tmp_path / "local")
    _save(local, 5, OLD)
    fired = _replace_on_link(monkeypatch, local, times=_mirror.SNAPSHOT_TRIES)
    with Mirror(local, cloud_remote) as mirror:
        with pytest.raises(_mirror.StepChangedError, match="mirror it again") as info:
            mirror.mirror(5)
        monkeypatch.undo()
        assert mirror.pending is None
    assert isinstance(info.value, RuntimeError)
    assert len(fired) == _mirror.SNAPSHOT_TRIES
    assert cloud_remote.steps() == []
    assert not list((tmp_path / "staging").glob("atomic_ckpt-mirror.tmp-*"))


def test_a_snapshot_made_of_copies_is_checked_as_well(
    cloud_remote: RemoteCheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where links are refused (EXDEV: copies), a replace mid-snapshot is caught too."""
    local = CheckpointDir(tmp_path / "local")
    _save(local, 5, OLD)
    real_copy = shutil.copy2
    fired: list[bool] = []

    def no_link(src: Any, dst: Any, **kwargs: Any) -> None:
        raise OSError(errno.EXDEV, "cross-device link")

    def copy2(src: Any, dst: Any, **kwargs: Any) -> Any:
        out = real_copy(src, dst, **kwargs)
        if not fired:
            fired.append(True)
            _save(local, 5, NEW)
        return out

    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(shutil, "copy2", copy2)
    with Mirror(local, cloud_remote) as mirror:
        mirror.mirror(5)
        monkeypatch.undo()
    assert fired == [True]
    got = cloud_remote.fetch(5, tmp_path / "got").path
    assert {name: (got / name).read_bytes() for name in NEW} == NEW
