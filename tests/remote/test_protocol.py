"""The protocol's guards on S3 (moto over HTTP): the refusal of a store without conditional
writes, and prune and clean running while an upload is live."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from _remote_support import S3, Gate, read_tree, write_tree

from atomic_ckpt import CheckpointError
from atomic_ckpt.remote import RemoteCheckpointDir, UnsupportedStoreError


class _IgnoreConditions:
    """Make PutObject drop the named conditional parameters before they are sent: what an
    S3-compatible server that does not know them does with them."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.dropped = 0

    def install(self, rdir: RemoteCheckpointDir) -> None:
        rdir.fs.s3.meta.events.register("before-parameter-build.s3.PutObject", self._strip)

    def _strip(self, params: dict[str, Any], **_: Any) -> None:
        for name in self.names:
            if params.pop(name, None) is not None:
                self.dropped += 1


@pytest.mark.parametrize(
    ("ignored", "why"),
    [
        (("IfNoneMatch", "IfMatch"), "create-only write"),
        (("IfMatch",), "wrong ETag"),
    ],
    ids=["no-conditions", "no-if-match"],
)
def test_store_without_conditional_writes_is_refused(
    remote: RemoteCheckpointDir, tmp_path: Path, ignored: tuple[str, ...], why: str
) -> None:
    """A store that ignores If-None-Match (or If-Match) is detected by the probe before
    anything is staged or uploaded: the commit raises UnsupportedStoreError, saying why."""
    hook = _IgnoreConditions(*ignored)
    hook.install(remote)
    ran = []
    with pytest.raises(UnsupportedStoreError, match=why), remote.commit(1) as path:
        ran.append(path)
    assert hook.dropped >= 1, "the conditions were stripped"
    assert ran == [], "the block never ran"
    assert remote._store.find("") == {}, "nothing was uploaded (the probe removed itself)"
    assert isinstance(UnsupportedStoreError("x"), OSError)


def test_probe_runs_once_and_honest_store_passes(remote: RemoteCheckpointDir) -> None:
    """Against moto (which honours both conditions) the probe passes, once per root."""
    remote.check_conditional_writes()
    count = []
    remote.fs.s3.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: count.append(request.url)
    )
    with remote.commit(1) as path:
        write_tree(path, 1)
    assert not any(".atomic_ckpt-probe" in url for url in count)
    assert remote.steps() == [1]


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_prune_and_clean_during_a_live_upload(
    serial_remote: RemoteCheckpointDir, s3_server: S3, s3_url: str, tmp_path: Path
) -> None:
    """While an upload of step 3 is held after some of its objects landed, clean() (with
    its grace period) and prune() run from another client: clean leaves the live attempt
    alone, prune deletes only old complete steps, and step 3 then commits bit-exact."""
    remote = serial_remote
    for step in (1, 2):
        with remote.commit(step) as path:
            write_tree(path, step)
    other = RemoteCheckpointDir(s3_url, storage_options=s3_server.options())
    gate = Gate("PutObject", "/optim/state.bin")
    gate.install(remote)

    def commit3() -> dict[str, bytes]:
        with remote.commit(3) as path:
            return write_tree(path, 3)

    thread, out = _in_thread(commit3)
    try:
        assert gate.held.wait(60), "the upload reached the gate"
        assert [e.status for e in other.entries()] == ["complete", "complete", "uncommitted"]
        assert other.clean(grace=600) == []
        assert other.prune(keep_last=1) == [other.url_of(1)]
    finally:
        gate.release()
        thread.join(60)
    assert isinstance(out[0], dict), out
    assert other.steps() == [2, 3]
    assert read_tree(other.fetch(3, tmp_path / "3").path) == out[0]


def test_clean_without_grace_cannot_make_a_live_upload_commit_broken(
    serial_remote: RemoteCheckpointDir, s3_server: S3, s3_url: str
) -> None:
    """clean(grace=0) during a live upload deletes its first objects; the upload's listing
    check (step 2 of the protocol) then refuses to commit: a clear error, no broken step."""
    remote = serial_remote
    with remote.commit(1) as path:
        write_tree(path, 1)
    other = RemoteCheckpointDir(s3_url, storage_options=s3_server.options())
    gate = Gate("PutObject", "/optim/state.bin")
    gate.install(remote)

    def commit2() -> None:
        with remote.commit(2) as path:
            write_tree(path, 2)

    thread, out = _in_thread(commit2)
    try:
        assert gate.held.wait(60)
        removed = other.clean(grace=0)
        assert len(removed) == 1
        assert removed[0].startswith(other.url_of(2) + "/")
    finally:
        gate.release()
        thread.join(60)
    assert isinstance(out[0], CheckpointError), out
    assert "does not match its listing" in str(out[0])
    assert other.steps() == [1]


def test_reader_racing_a_replace_sees_old_or_new_never_neither(
    remote: RemoteCheckpointDir, s3_server: S3, s3_url: str, tmp_path: Path
) -> None:
    """A reader that read step 3's old manifest, then finds its objects deleted by a
    replace that completed meanwhile, reads the new manifest: the step is not missing."""
    with remote.commit(3) as path:
        write_tree(path, 1)
    old = remote.get(3)
    reader = RemoteCheckpointDir(s3_url, storage_options=s3_server.options())
    gate = Gate("ListObjectsV2", old.attempt)
    gate.install(reader)
    thread, out = _in_thread(lambda: reader.get(3))
    try:
        assert gate.held.wait(60), "the reader has the old manifest and is about to list"
        with remote.commit(3) as path:
            expected = write_tree(path, 2)
        assert remote._store.find(f"3/{old.attempt}/") == {}, "the old data is gone"
    finally:
        gate.release()
        thread.join(60)
    got = out[0]
    assert not isinstance(got, BaseException), got
    assert got.attempt != old.attempt
    assert read_tree(reader.fetch(3, tmp_path / "3").path) == expected
