"""Background uploads on S3 (moto over HTTP; some on GCS and Azure too): Mirror (commit
locally, mirror behind) and AsyncRemoteCommitter (stage and commit to the store in a
background thread)."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import textwrap
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
    any_remote: RemoteCheckpointDir, tmp_path: Path
) -> None:
    """Local retention may delete a checkpoint while it is queued or uploading: the mirror
    uploads its snapshot (hard links). After close() the remote holds the newest step."""
    local = CheckpointDir(tmp_path / "local")
    with Mirror(local, any_remote) as mirror:
        for step in range(1, 5):
            with mirror.commit(step) as path:
                expected = write_tree(path, step)
            local.prune(keep_last=1)
    assert local.steps() == [4]
    assert any_remote.latest() is not None
    assert any_remote.steps()[-1] == 4
    assert read_tree(any_remote.fetch(4, tmp_path / "got").path) == expected
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


def test_async_remote_committer(any_remote: RemoteCheckpointDir, tmp_path: Path) -> None:
    """AsyncRemoteCommitter commits save functions to the store in the background; a
    failure is raised by the next call."""
    with AsyncRemoteCommitter(any_remote) as saver:
        saver.save(1, functools.partial(write_tree, seed=1))
        saver.save(2, functools.partial(write_tree, seed=2))
    assert any_remote.steps() == [1, 2]
    expected = write_tree(tmp_path / "expected", 2)
    assert read_tree(any_remote.fetch(2, tmp_path / "got").path) == expected

    def broken(path: Path) -> None:
        raise RuntimeError("save failed")

    saver = AsyncRemoteCommitter(any_remote)
    saver.save(3, broken)
    with pytest.raises(RuntimeError, match="save failed"):
        saver.save(4, functools.partial(write_tree, seed=4))
    saver.close()
    assert any_remote.steps() == [1, 2]


# ---------------------------------------------------------------- interpreter exit

_UNOBSERVED_AT_EXIT = """
    import gc, sys, time
    sys.path.insert(0, sys.argv[4])
    from _remote_support import Fault, write_tree
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.remote import AsyncRemoteCommitter, Mirror, RemoteCheckpointDir

    endpoint, url, how = sys.argv[1:4]
    retries = {"retries": {"max_attempts": 1, "mode": "standard"}}
    remote = RemoteCheckpointDir(
        url, storage_options={"endpoint_url": endpoint, "config_kwargs": retries}
    )
    remote.check_conditional_writes()
    remote.fs.retries = 1
    fault = Fault("PutObject", "500", "/model.bin", times=None)
    fault.install(remote)

    def run() -> None:
        if how.startswith("async"):
            saver = AsyncRemoteCommitter(remote)
            saver.save(7, lambda path: write_tree(path, 7))
            while saver.pending is not None:
                time.sleep(0.01)
            return
        mirror = Mirror(CheckpointDir(sys.argv[5]), remote)
        with mirror.commit(7) as path:
            write_tree(path, 7)
        while mirror.pending is not None:  # the upload runs, and fails, in the background
            time.sleep(0.01)
        if how == "observed":
            try:
                mirror.close()
            except OSError as exc:
                print("close raised", type(exc).__name__, file=sys.stderr)
        if how == "kept":
            globals()["kept"] = mirror

    run()
    gc.collect()  # "dropped": nothing refers to the mirror (or committer) any more
    print("fault fired", fault.fired, file=sys.stderr)
    # no close(): the script simply ends here
"""


def _run_unobserved(s3: S3, url: str, tmp: Path, how: str) -> subprocess.CompletedProcess[str]:
    here = str(Path(__file__).resolve().parent)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_UNOBSERVED_AT_EXIT),
            s3.endpoint,
            url,
            how,
            here,
            str(tmp / "local"),
        ],
        capture_output=True,
        text=True,
        env=s3.env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("how", ["kept", "dropped"])
def test_an_unobserved_mirror_failure_makes_the_exit_status_non_zero(
    s3_server: S3, s3_url: str, tmp_path: Path, how: str
) -> None:
    """A script whose last mirror upload failed, with nothing left to raise it (the Mirror
    still referenced or already collected), exits 1 naming the step, not 0."""
    proc = _run_unobserved(s3_server, s3_url, tmp_path, how)
    assert re.search(r"fault fired [1-9]", proc.stderr), proc.stderr  # the fault was hit
    assert proc.returncode == 1, proc.stderr
    assert "mirror upload of step 7 failed and nothing waited for it" in proc.stderr
    assert "Mirror.close()" in proc.stderr
    assert CheckpointDir(tmp_path / "local").steps() == [7]


def test_an_observed_mirror_failure_leaves_the_exit_status_alone(
    s3_server: S3, s3_url: str, tmp_path: Path
) -> None:
    """A failed upload that close() raised (and the script handled) does not change the exit
    status: only failures nothing reported do."""
    proc = _run_unobserved(s3_server, s3_url, tmp_path, "observed")
    assert re.search(r"fault fired [1-9]", proc.stderr), proc.stderr  # the fault was hit
    assert "close raised" in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "nothing waited" not in proc.stderr


def test_a_dropped_async_remote_committer_failure_makes_the_exit_status_non_zero(
    s3_server: S3, s3_url: str, tmp_path: Path
) -> None:
    """An AsyncRemoteCommitter whose failed commit nothing raised exits 1 naming the step,
    even when the committer itself was garbage-collected before the exit."""
    proc = _run_unobserved(s3_server, s3_url, tmp_path, "async")
    assert re.search(r"fault fired [1-9]", proc.stderr), proc.stderr  # the fault was hit
    assert proc.returncode == 1, proc.stderr
    assert "background commit of step 7 failed and nothing waited for it" in proc.stderr


# ---------------------------------------------------------------- bucket to bucket


def test_a_fetched_checkpoint_mirrors_and_commits_to_another_bucket(
    remote: RemoteCheckpointDir, s3_server: S3, tmp_path: Path
) -> None:
    """A checkpoint fetched from one bucket (its marker names that bucket's attempt) can be
    mirrored, uploaded and committed with its metadata to another bucket: the copy keeps
    the user's metadata and names its own attempt; a user's own value under the reserved
    key is still refused."""
    import uuid

    import s3fs

    from atomic_ckpt.remote import ATTEMPT_KEY

    with remote.commit(3, metadata={"loss": 0.25}) as path:
        expected = write_tree(path, 3)
    local = CheckpointDir(tmp_path / "local")
    fetched = remote.fetch(3, local.path_of(3))
    assert fetched.manifest.metadata[ATTEMPT_KEY] == remote.get(3).attempt

    other_bucket = f"t-{uuid.uuid4().hex[:20]}"
    s3fs.S3FileSystem(**s3_server.options()).mkdir(other_bucket)
    other = RemoteCheckpointDir(
        f"s3://{other_bucket}/run", storage_options=s3_server.options(), staging_dir=tmp_path
    )
    with Mirror(local, other) as mirror:
        mirror.mirror(3)
    copied = other.get(3)
    assert copied.manifest.metadata == {"loss": 0.25, ATTEMPT_KEY: copied.attempt}
    assert copied.attempt != remote.get(3).attempt
    assert read_tree(other.verify(3) and other.fetch(3, tmp_path / "back").path) == expected

    metadata = dict(fetched.manifest.metadata)
    assert other.upload(4, fetched.path, metadata=metadata).manifest.metadata["loss"] == 0.25
    with other.commit(5, metadata=metadata) as path:
        write_tree(path, 5)
    assert other.get(5).manifest.metadata == {"loss": 0.25, ATTEMPT_KEY: other.get(5).attempt}
    with AsyncRemoteCommitter(other) as saver:
        saver.save(6, functools.partial(write_tree, seed=6), metadata=metadata)
    assert other.steps() == [3, 4, 5, 6]
    with pytest.raises(ValueError, match="reserved"):
        other.begin(7, metadata={ATTEMPT_KEY: "mine"})
