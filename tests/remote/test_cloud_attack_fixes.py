"""Defects found by attacking gs:// and az:// as a user would (issue 33), each shown against
the emulators: a commit point that goes through another request than the probe checked
(a GCS manifest past the client's multipart limit goes as a resumable upload, an Azure
one past ``max_single_put_size`` as staged blocks and a Put Block List), and a 404 from
something that is no container read as "no such checkpoint"."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from _emulators import Emulator, Hook, HttpFault, Send, fast_root, importable, missing

from atomic_ckpt import StepConflictError
from atomic_ckpt.remote import NoSuchBucketError, RemoteCheckpointDir, UnsupportedStoreError

LIMIT = 64 << 10
"""The single-request limit the tests set, so that a manifest of a few hundred entries
passes it (the clients' own: 8 MiB on GCS, 64 MiB on Azure; ~40,000 entries on GCS)."""


def _many_entries(path: Path, seed: int) -> None:
    """A checkpoint whose manifest is over :data:`LIMIT`: one file, 400 directories with
    long names (entries that need no object, so nothing big is uploaded)."""
    (path / "w").write_bytes(b"writer %d" % seed)
    for i in range(400):
        (path / f"{i:04d}{'d' * 200}").mkdir()


class _Requests:
    """Every request a store sends: (method, URL, the start of its body)."""

    def __init__(self, store: Any) -> None:
        self.seen: list[tuple[str, str, bytes]] = []
        Hook(self._around).install(store)

    def _around(self, send: Send, request: Any, *a: Any, **kw: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else b""
        self.seen.append((str(request.method), str(request.url), body[:4096]))
        return send(request, *a, **kw)

    def probes(self, marker: str) -> list[str]:
        """The URLs of the probe's requests that contain ``marker``."""
        return [
            url
            for _, url, body in self.seen
            if ("atomic_ckpt-probe" in url or b"atomic_ckpt-probe" in body) and marker in url
        ]


def test_a_gcs_manifest_past_the_multipart_limit_is_probed_on_the_resumable_path(
    gs_server: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest larger than google-cloud-storage's multipart limit is written as a
    resumable upload, whose ifGenerationMatch fake-gcs-server ignores: two writers of a
    new step would both "win". The probe checks that path before such a commit uploads
    anything, so the store is refused (UnsupportedStoreError naming the resumable
    upload), no step is visible and nothing is left in the bucket; a small manifest's
    commit on the same root still goes through the multipart path the first probe passed."""
    if not importable("google.cloud.storage.blob"):
        missing("needs google-cloud-storage (the [gcs] extra)")
    blob_module = importlib.import_module("google.cloud.storage.blob")
    monkeypatch.setattr(blob_module, "_MAX_MULTIPART_SIZE", LIMIT)
    url = f"gs://{gs_server.new_bucket()}/run"
    first, second = (fast_root(gs_server, url, tmp_path / f"w{i}") for i in (1, 2))
    sent = _Requests(first._store)
    handles = [first.begin(1), second.begin(1)]  # both from "no step 1"
    for seed, handle in enumerate(handles):
        _many_entries(handle.path, seed)
    outcomes = []
    for handle in handles:
        try:
            handle.publish()
            outcomes.append("committed")
        except StepConflictError:
            outcomes.append("conflict")
        except UnsupportedStoreError as exc:
            outcomes.append("refused" if "resumable" in str(exc) else str(exc))
    assert outcomes == ["refused", "refused"], "never two winners; refused naming the way"
    assert sent.probes("uploadType=resumable"), "the probe went the resumable way"
    assert first.steps() == []
    assert first._store.find("") == {}, "refused before anything was uploaded"
    with first.commit(2) as path:  # a small manifest: the multipart path, probed and enforced
        (path / "w").write_bytes(b"small")
    assert first.steps() == [2]


def test_an_azure_manifest_past_max_single_put_size_is_probed_on_the_block_list_path(
    az_server: Emulator, tmp_path: Path
) -> None:
    """With ``max_single_put_size`` below the manifest's size, azure-storage-blob writes it
    as staged blocks and a Put Block List carrying If-None-Match/If-Match: the probe
    checks that request too before the first such commit (Azurite enforces it there), and
    of two writers of a new step exactly one wins."""
    url = f"az://{az_server.new_bucket()}/run"
    options = {**az_server.options(), "client_kwargs": {"max_single_put_size": LIMIT}}
    first, second = (
        RemoteCheckpointDir(url, storage_options=options, staging_dir=tmp_path / f"w{i}")
        for i in (1, 2)
    )
    sent = _Requests(first._store)
    handles = [first.begin(1), second.begin(1)]
    for seed, handle in enumerate(handles):
        _many_entries(handle.path, seed)
    handles[0].publish()
    with pytest.raises(StepConflictError):
        handles[1].publish()
    assert sent.probes("comp=blocklist"), "the probe wrote a block list"
    assert first.get(1).manifest.file_count == 1
    assert [p for p in first._store.find("") if "probe" in p] == []


def test_a_404_listing_from_something_that_is_no_container_is_no_missing_checkpoint(
    az_server: Emulator, gs_server: Emulator, tmp_path: Path
) -> None:
    """An az:// root whose endpoint answers a container listing 404 without
    ``ContainerNotFound`` (here: fake-gcs-server, a wrong endpoint) raises
    NoSuchBucketError naming the container and the endpoint, not a FileNotFoundError
    that reads as "no checkpoint here" (``steps``, ``latest``, ``entries``, ``begin``);
    nor is a blob read or delete answered 404 without ``BlobNotFound`` a missing blob
    (``get`` and ``delete`` said "no complete checkpoint for step 1")."""
    conn = az_server.connection_string().replace(az_server.endpoint, gs_server.endpoint)
    wrong = RemoteCheckpointDir(
        "az://ctr/run", storage_options={"connection_string": conn}, staging_dir=tmp_path
    )
    for what, call in {
        "steps": wrong.steps,
        "latest": wrong.latest,
        "entries": wrong.entries,
        "clean": lambda: wrong.clean(grace=0),
        "get": lambda: wrong.get(1),
        "delete": lambda: wrong.delete(1),
    }.items():
        with pytest.raises(NoSuchBucketError, match="container 'ctr'") as caught:
            call()
        assert not isinstance(caught.value, FileNotFoundError), what


def test_an_azure_file_name_with_a_backslash_is_refused_before_its_upload(
    az_server: Emulator, tmp_path: Path
) -> None:
    """Azure Blob Storage (and Azurite) store a blob named ``a\\b`` as ``a/b``: such a file
    could never be found again under its name. The commit is refused with a ValueError
    naming the file and what to do before anything is uploaded; the step keeps what it had."""
    rdir = fast_root(az_server, f"az://{az_server.new_bucket()}/run", tmp_path)
    with rdir.commit(1) as path:
        (path / "w").write_bytes(b"old")
    before = rdir._store.find("")
    with pytest.raises(ValueError, match=r"bs\\x.*rename it"), rdir.commit(1) as path:
        (path / "bs\\x").write_bytes(b"new")
    assert rdir._store.find("") == before
    assert rdir.get(1).manifest.file_count == 1


def test_a_gcs_upload_session_the_server_lost_is_no_missing_file(
    gs_server: Emulator, tmp_path: Path
) -> None:
    """A resumable upload whose session the server no longer knows (404 on a chunk: it
    expired, or the server restarted; fake-gcs-server forgets its sessions) failed the
    commit with a FileNotFoundError "upload of ...: not found", which reads as a local
    file gone or a missing checkpoint. It is an OSError saying the upload session was
    lost and to commit again; the old checkpoint stays whole and visible."""
    url = f"gs://{gs_server.new_bucket()}/run"
    rdir = fast_root(gs_server, url, tmp_path)
    with rdir.commit(1) as path:
        (path / "w").write_bytes(b"old")
    fault = HttpFault("PUT", "404", match="upload_id=")
    fault.install(rdir._store)
    with pytest.raises(OSError, match="upload session") as caught, rdir.commit(2) as path:
        (path / "big").write_bytes(b"x" * (11 << 20))
    assert fault.fired == 1, "a chunk of the resumable upload was answered 404"
    assert not isinstance(caught.value, FileNotFoundError)
    assert rdir.url in str(caught.value)
    assert rdir.steps() == [1]
