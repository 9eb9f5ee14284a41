"""Type-checked (never run) by test_typing_remote.py: atomic_ckpt.remote as a user calls it."""

from __future__ import annotations

from pathlib import Path
from typing import assert_type

import atomic_ckpt.remote
from atomic_ckpt import Checkpoint, CheckpointDir, RetentionPolicy
from atomic_ckpt.remote import (
    AsyncRemoteCommitter,
    Mirror,
    RemoteCheckpoint,
    RemoteCheckpointDir,
    RemoteCommit,
    RemoteEntry,
)


def use(local: CheckpointDir) -> None:
    ckpts = RemoteCheckpointDir("s3://bucket/run", storage_options={"anon": False})
    with ckpts.commit(3, metadata={"loss": 0.1}, retain=RetentionPolicy(keep_last=2)) as path:
        assert_type(path, Path)
    handle = ckpts.begin(4)
    assert_type(handle, RemoteCommit)
    assert_type(handle.path, Path)
    assert_type(handle.publish(), RemoteCheckpoint)
    assert_type(ckpts.latest(), RemoteCheckpoint | None)
    assert_type(ckpts.get(3), RemoteCheckpoint)
    assert_type(ckpts.verify(3), RemoteCheckpoint)
    assert_type(ckpts.steps(), list[int])
    assert_type(ckpts.entries(), list[RemoteEntry])
    assert_type(ckpts.fetch(3, "restore/3"), Checkpoint)
    assert_type(ckpts.upload(5, Path("ckpts/5")), RemoteCheckpoint)
    assert_type(ckpts.prune(keep_last=1), list[str])
    assert_type(ckpts.retain(keep_last=1, metric="loss"), list[str])
    assert_type(ckpts.clean(grace=60.0, dry_run=True), list[str])
    assert_type(ckpts.delete(3), str)
    with Mirror(local, ckpts) as mirror:
        with mirror.commit(6) as p:
            assert_type(p, Path)
        assert_type(mirror.pending, int | None)
        assert_type(mirror.uploaded, list[RemoteCheckpoint])
    with AsyncRemoteCommitter(ckpts) as saver:
        saver.save(7, lambda directory: None)
    root = atomic_ckpt.remote.open("gs://bucket/run", storage_options={"token": "anon"})
    assert_type(root, RemoteCheckpointDir | CheckpointDir)
    with root.commit(8) as p:
        assert_type(p, Path)
    assert_type(root.steps(), list[int])
