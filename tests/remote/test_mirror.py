"""Background uploads on S3 (moto over HTTP): Mirror (commit locally, mirror behind) and
AsyncRemoteCommitter (stage and commit to the store in a background thread)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
from _remote_support import S3, Fault, Gate, read_tree, write_tree

from atomic_ckpt import CheckpointDir, CommitterClosedError
from atomic_ckpt.remote import AsyncRemoteCommitter, Mirror, RemoteCheckpointDir


def test_mirror_blocks_only_for_the_local_commit(
    serial_remote: RemoteCheckpointDir, s3_server: S3, s3_url: str, tmp_path: Path
) -> None:
    """While the upload of step 1 is held, commit(1) has returned with step 1 complete
    locally, and the remote shows nothing; once released, the remote has it, bit-exact."""
    remote = serial_remote
    local = CheckpointDir(tmp_path / "local")
    other = RemoteCheckpointDir(s3_url, storage_options=s3_server.options())
    remote.check_conditional_writes()  # the probe is not what the gate holds
    gate = Gate("PutObject", "/model.bin")
    gate.install(remote)
    mirror = Mirror(local, remote, snapshot_dir=tmp_path / "snap")
    try:
        with mirror.commit(1) as path:
            expected = write_tree(path, 1)
        assert local.steps() == [1]
        assert gate.held.wait(60), "the upload started and is held"
        assert other.steps() == []
        assert [e.status for e in other.entries()] == ["uncommitted"]
    finally:
        gate.release()
        mirror.close()
    assert other.steps() == [1]
    assert read_tree(other.fetch(1, tmp_path / "got").path) == expected
    assert [c.step for c in mirror.uploaded] == [1]
    assert list((tmp_path / "snap").iterdir()) == [], "snapshots are removed"


def test_mirror_survives_local_pruning_and_keeps_the_newest(
    remote: RemoteCheckpointDir, tmp_path: Path
) -> None:
    """Local retention may delete a checkpoint while it is queued or uploading: the mirror
    uploads its snapshot (hard links). After close() the remote holds the newest step."""
    local = CheckpointDir(tmp_path / "local")
    with Mirror(local, remote) as mirror:
        for step in range(1, 5):
            with mirror.commit(step) as path:
                expected = write_tree(path, step)
            local.prune(keep_last=1)
    assert local.steps() == [4]
    assert remote.latest() is not None
    assert remote.steps()[-1] == 4
    assert read_tree(remote.fetch(4, tmp_path / "got").path) == expected
    with pytest.raises(CommitterClosedError):
        mirror.mirror(4)


def test_mirror_failure_surfaces_on_the_next_call(
    s3_server: S3, s3_url: str, tmp_path: Path
) -> None:
    """A failed upload is raised by the next commit, which then commits nothing; the
    remote never shows the failed step; the local checkpoint is intact."""
    retries = {"retries": {"max_attempts": 2, "mode": "standard"}}
    remote = RemoteCheckpointDir(s3_url, storage_options=s3_server.options(config_kwargs=retries))
    remote.check_conditional_writes()
    remote.fs.retries = 1
    fault = Fault("PutObject", "500", "/model.bin", times=None)
    fault.install(remote)
    local = CheckpointDir(tmp_path / "local")
    mirror = Mirror(local, remote)
    with mirror.commit(1) as path:
        write_tree(path, 1)
    while mirror.pending is not None:  # the upload runs, and fails, in the background
        time.sleep(0.01)
    assert fault.fired >= 1
    entered = []
    with pytest.raises(OSError, match=r"InternalError|injected"), mirror.commit(2) as path:
        entered.append(path)
    assert entered == []
    mirror.close()  # the error was raised once
    assert local.steps() == [1]
    assert remote.steps() == []


def test_async_remote_committer(remote: RemoteCheckpointDir, tmp_path: Path) -> None:
    """AsyncRemoteCommitter commits save functions to the store in the background; a
    failure is raised by the next call."""
    with AsyncRemoteCommitter(remote) as saver:
        saver.save(1, functools.partial(write_tree, seed=1))
        saver.save(2, functools.partial(write_tree, seed=2))
    assert remote.steps() == [1, 2]
    expected = write_tree(tmp_path / "expected", 2)
    assert read_tree(remote.fetch(2, tmp_path / "got").path) == expected

    def broken(path: Path) -> None:
        raise RuntimeError("save failed")

    saver = AsyncRemoteCommitter(remote)
    saver.save(3, broken)
    with pytest.raises(RuntimeError, match="save failed"):
        saver.save(4, functools.partial(write_tree, seed=4))
    saver.close()
    assert remote.steps() == [1, 2]
