"""The remote root's API on S3 (moto over HTTP), GCS (fake-gcs-server), Azure (Azurite)
and memory://: commit, read back bit-exact,
replace, delete, prune, clean, fetch, verify."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from _remote_support import S3, SMALL_PART, read_tree, write_tree

from atomic_ckpt import (
    CheckpointDir,
    CheckpointNotFoundError,
    CommitStateError,
    VerificationError,
)
from atomic_ckpt.remote import ATTEMPT_KEY, RemoteCheckpointDir, UnsupportedStoreError


@pytest.fixture(params=["s3", "memory", "gs", "az"])
def rdir(request: pytest.FixtureRequest, tmp_path: Path) -> RemoteCheckpointDir:
    """The same API on every backend (GCS and Azure on their emulators)."""
    if request.param == "memory":
        return RemoteCheckpointDir(
            f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "staging"
        )
    if request.param in ("gs", "az"):
        server = request.getfixturevalue(f"{request.param}_server")
        return RemoteCheckpointDir(
            f"{request.param}://{server.new_bucket()}/run",
            storage_options=server.options(),
            staging_dir=tmp_path / "staging",
            part_size=SMALL_PART,
            multipart_threshold=2 * SMALL_PART,
        )
    remote: RemoteCheckpointDir = request.getfixturevalue("remote")
    return remote


def test_commit_and_fetch_bit_exact(rdir: RemoteCheckpointDir, tmp_path: Path) -> None:
    """A committed step is listed, and fetch returns every byte, a marker that verifies
    locally, the metadata, and the empty directories and symlinks."""
    with rdir.commit(5, metadata={"loss": 0.5}) as path:
        expected = write_tree(path, 1, big=2 * SMALL_PART + 123)
        (path / "emptydir").mkdir()
        (path / "latest.bin").symlink_to("model.bin")
    assert not path.exists(), "the local staging directory is removed"
    assert rdir.steps() == [5]
    ckpt = rdir.latest()
    assert ckpt is not None
    assert ckpt.step == 5
    assert ckpt.manifest.metadata["loss"] == 0.5
    fetched = rdir.fetch(5, tmp_path / "out" / "5")
    assert read_tree(fetched.path) == expected
    assert (fetched.path / "emptydir").is_dir()
    assert (fetched.path / "latest.bin").readlink() == Path("model.bin")
    local = CheckpointDir(tmp_path / "out").verify(5)
    assert local.manifest.metadata[ATTEMPT_KEY] == ckpt.attempt
    assert rdir.verify(5).step == 5


def test_exception_in_block_commits_nothing(rdir: RemoteCheckpointDir) -> None:
    """An error inside the block uploads nothing and leaves the previous step as it was."""
    with rdir.commit(1) as path:
        write_tree(path, 1)
    staged: list[Path] = []

    def failing_save() -> None:
        with rdir.commit(2) as path:
            staged.append(path)
            write_tree(path, 2)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_save()
    assert rdir.steps() == [1]
    assert not staged[0].exists()
    assert [e.step for e in rdir.entries()] == [1]


def test_replace_changes_contents_and_drops_old_data(
    rdir: RemoteCheckpointDir, tmp_path: Path
) -> None:
    """Committing an existing step replaces it (If-Match on the old manifest); the old
    attempt's objects are deleted."""
    with rdir.commit(3) as path:
        write_tree(path, 1)
    first = rdir.get(3)
    with rdir.commit(3) as path:
        expected = write_tree(path, 2)
    second = rdir.get(3)
    assert second.attempt != first.attempt
    assert second.etag != first.etag
    assert read_tree(rdir.fetch(3, tmp_path / "3").path) == expected
    attempts = {e.attempts for e in rdir.entries()}
    assert attempts == {1}


def test_replace_conflict_when_step_changed_since_begin(rdir: RemoteCheckpointDir) -> None:
    """A commit replaces what it saw at begin: if another commit replaced the step
    meanwhile, it loses with StepConflictError (a FileExistsError) and leaves no data."""
    from atomic_ckpt import StepConflictError

    with rdir.commit(3) as path:
        write_tree(path, 1)
    slow = rdir.begin(3)
    write_tree(slow.path, 2)
    with rdir.commit(3) as path:
        expected_winner = write_tree(path, 3)
    with pytest.raises(StepConflictError, match="another writer"):
        slow.publish()
    winner = rdir.get(3)
    assert winner.manifest.files[0].size == len(expected_winner[sorted(expected_winner)[0]])
    assert {e.attempts for e in rdir.entries()} == {1}, "the loser's attempt is deleted"
    assert isinstance(StepConflictError("x"), FileExistsError)


def test_delete_prune_retain(rdir: RemoteCheckpointDir) -> None:
    """prune keeps the newest; retain keeps by a metric; the latest is never deleted."""
    for step, loss in [(1, 0.9), (2, 0.1), (3, 0.5), (4, 0.7)]:
        with rdir.commit(step, metadata={"loss": loss}) as path:
            write_tree(path, step)
    deleted = rdir.retain(keep_last=1, metric="loss")
    assert sorted(deleted) == [rdir.url_of(1), rdir.url_of(3)]
    assert rdir.steps() == [2, 4]
    assert rdir.prune(keep_last=1) == [rdir.url_of(2)]
    assert rdir.steps() == [4]
    with pytest.raises(ValueError, match="keep_last"):
        rdir.prune(keep_last=0)
    assert rdir.delete(4) == rdir.url_of(4)
    assert rdir.latest() is None
    with pytest.raises(CheckpointNotFoundError):
        rdir.get(4)
    assert rdir.fs is not None


def test_clean_removes_only_old_unreferenced_attempts(rdir: RemoteCheckpointDir) -> None:
    """clean() removes an attempt no manifest names once it is older than the grace period,
    and never a committed checkpoint's objects."""
    with rdir.commit(1) as path:
        expected = write_tree(path, 1)
    orphan = rdir.begin(2)  # uploads, then "crashes" before the commit point
    write_tree(orphan.path, 2)
    from atomic_ckpt.remote import _protocol

    store = rdir._store
    files = [
        _protocol.Upload(orphan.path / rel, f"2/{orphan.attempt}/{rel}", len(data))
        for rel, data in write_tree(orphan.path, 2).items()
    ]
    store.upload(files)
    assert [e.status for e in rdir.entries()] == ["complete", "uncommitted"]
    assert rdir.clean(grace=3600) == []
    assert rdir.clean(grace=0, dry_run=True) == [rdir.url_of(2) + f"/{orphan.attempt}/"]
    assert rdir.clean(grace=0) == [rdir.url_of(2) + f"/{orphan.attempt}/"]
    assert [e.status for e in rdir.entries()] == ["complete"]
    assert rdir.steps() == [1]
    orphan.abort()
    ckpt = rdir.get(1)
    assert sum(e.size for e in ckpt.manifest.files) == sum(len(b) for b in expected.values())


def test_damaged_checkpoint_is_not_reported(rdir: RemoteCheckpointDir, tmp_path: Path) -> None:
    """A manifest whose objects are not all there (deleted behind the library's back) is
    skipped by the scanner and refused by get/fetch; verify catches changed bytes."""
    with rdir.commit(1) as path:
        write_tree(path, 1)
    with rdir.commit(2) as path:
        write_tree(path, 2)
    ckpt = rdir.get(2)
    rdir._store.delete([f"2/{ckpt.attempt}/model.bin"])
    assert rdir.steps() == [1]
    latest = rdir.latest()
    assert latest is not None
    assert latest.step == 1
    with pytest.raises(CheckpointNotFoundError):
        rdir.fetch(2, tmp_path / "2")
    assert [e.status for e in rdir.entries()] == ["complete", "incomplete"]
    one = rdir.get(1)
    key = f"1/{one.attempt}/optim/state.bin"
    data, _ = rdir._store.get(key) or (b"", "")
    flipped = bytes([data[0] ^ 1]) + data[1:]
    rdir._store.delete([key])
    src = tmp_path / "flip"
    src.write_bytes(flipped)
    from atomic_ckpt.remote import _store

    rdir._store.upload([_store.Upload(src, key, len(flipped))])
    with pytest.raises(VerificationError, match="checksum"):
        rdir.verify(1)
    with pytest.raises(VerificationError):
        rdir.fetch(1, tmp_path / "1")
    assert not (tmp_path / "1").exists()
    assert rdir.latest(verify=True) is None


def test_unsupported_url_is_refused() -> None:
    """A store with no conditional writes through fsspec (file://, gs://) is refused at once."""
    with pytest.raises(UnsupportedStoreError, match="CheckpointDir"):
        RemoteCheckpointDir("file:///tmp/x")
    with pytest.raises(ValueError, match="not a URL"):
        RemoteCheckpointDir("/tmp/x")


def test_s3_needs_a_bucket(s3_server: S3) -> None:
    """s3:// without a bucket is a ValueError naming the form expected."""
    with pytest.raises(ValueError, match="bucket"):
        RemoteCheckpointDir("s3://", storage_options=s3_server.options())


def test_core_never_imports_fsspec_and_remote_names_its_extra() -> None:
    """Importing atomic_ckpt (and its CLI) loads no fsspec; without fsspec, importing
    atomic_ckpt.remote fails with one line naming the extra to install."""
    import subprocess
    import sys

    code = (
        "import sys, atomic_ckpt, atomic_ckpt.cli\n"
        "assert 'fsspec' not in sys.modules and 's3fs' not in sys.modules, 'imported'\n"
        "sys.modules['fsspec'] = None\n"
        "try:\n"
        "    import atomic_ckpt.remote\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert (
        out.strip()
        == "atomic_ckpt.remote needs fsspec: pip install 'atomic_ckpt[s3]' (or [gcs], [azure])"
    )


def test_bad_metadata_and_steps_are_refused_before_any_upload(rdir: RemoteCheckpointDir) -> None:
    """Metadata that is not JSON (or uses the reserved key) and negative or bool steps are
    refused by begin, before anything is staged or uploaded."""
    from atomic_ckpt import InvalidStepError

    with pytest.raises(ValueError, match="JSON"):
        rdir.begin(1, metadata={"x": object()})
    with pytest.raises(ValueError, match="reserved"):
        rdir.begin(1, metadata={"x": {"$atomic_ckpt.float": "NaN"}})
    with pytest.raises(ValueError, match="reserved"):
        rdir.begin(1, metadata={ATTEMPT_KEY: "x"})
    with pytest.raises(InvalidStepError):
        rdir.begin(-1)
    with pytest.raises(InvalidStepError):
        rdir.begin(True)
    assert rdir.entries() == []


def test_a_missing_bucket_is_an_error_not_a_missing_step(s3_server: S3, tmp_path: Path) -> None:
    """On a bucket that does not exist, every call raises NoSuchBucketError (an OSError, not
    a FileNotFoundError or CheckpointNotFoundError: nothing says the step is absent) naming
    the bucket and what to do; a missing step in a bucket that exists stays not-found."""
    from atomic_ckpt.remote import NoSuchBucketError

    bucket = f"t-missing-{uuid.uuid4().hex[:12]}"
    gone = RemoteCheckpointDir(
        f"s3://{bucket}/run", storage_options=s3_server.options(), staging_dir=tmp_path / "st"
    )
    calls = {
        "get": lambda: gone.get(3),
        "fetch": lambda: gone.fetch(3, tmp_path / "dest"),
        "verify": lambda: gone.verify(3),
        "steps": gone.steps,
        "checkpoints": gone.checkpoints,
        "latest": gone.latest,
        "latest(verify=True)": lambda: gone.latest(verify=True),
        "entries": gone.entries,
        "delete": lambda: gone.delete(3),
        "prune": lambda: gone.prune(keep_last=1),
        "clean": lambda: gone.clean(grace=0),
        "begin": lambda: gone.begin(3),
    }
    for what, call in calls.items():
        with pytest.raises(NoSuchBucketError) as caught:
            call()
        assert not isinstance(caught.value, FileNotFoundError), what
        assert isinstance(caught.value, OSError), what
        assert f"bucket {bucket!r} does not exist" in str(caught.value), what
        assert "create it" in str(caught.value), what
    assert not (tmp_path / "dest").exists()
    assert not issubclass(NoSuchBucketError, CheckpointNotFoundError)


def test_fetching_a_checkpoint_whose_checksums_this_python_cannot_compute_refuses_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest naming an algorithm this Python lacks (here: as if xxhash were missing):
    a VerificationError that names it, raised before anything is downloaded or created."""
    import atomic_ckpt.remote._fetch as fetch_module

    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    with rdir.commit(2) as path:
        (path / "model.bin").write_bytes(b"weights")
    lacking = {k: v for k, v in fetch_module.CHECKSUMS.items() if k != "xxh3_128"}
    monkeypatch.setattr(fetch_module, "CHECKSUMS", lacking)
    with pytest.raises(VerificationError, match="'xxh3_128', which this Python cannot") as caught:
        rdir.fetch(2, tmp_path / "out" / "2")
    assert caught.value.problems
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_inside_a_remote_commit_never_ends_it(tmp_path: Path) -> None:
    """In the child: publish() is CommitStateError, and an exception leaving the block (or
    abort()) leaves the parent's staging directory alone; the parent then publishes all."""
    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    commit = rdir.begin(3)
    (commit.path / "before.bin").write_bytes(b"before the fork")
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 99
        try:
            try:
                commit.publish()
                status = 1
            except CommitStateError as exc:
                status = 0 if "forked inside the commit" in str(exc) else 2
            commit.abort()
            try:
                with commit:
                    raise KeyError("the child fails")
            except KeyError:
                pass
            if status == 0 and not (commit.path / "before.bin").is_file():
                status = 3
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    (commit.path / "after.bin").write_bytes(b"after the child exited")
    commit.publish()
    fetched = rdir.fetch(3, tmp_path / "out" / "3")
    assert read_tree(fetched.path) == {
        "before.bin": b"before the fork",
        "after.bin": b"after the child exited",
    }
