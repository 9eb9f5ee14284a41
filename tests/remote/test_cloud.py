"""gs:// and az:// against their emulators (fake-gcs-server, Azurite), shown the way the S3
tests show it: the probe refuses a server that ignores preconditions, racing writer
processes get one winner, a writer SIGKILLed before any request leaves no visible step
and ``clean`` collects its attempt, a failed request leaves the old checkpoint visible,
missing buckets and bad credentials are clear errors, large files go in parts. Every
injected fault and kill is asserted to have fired."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from _emulators import Emulator, Hook, HttpFault, Send, env_without_cloud, fast_root
from _remote_support import SMALL_PART, read_tree, write_tree

from atomic_ckpt.cli import main
from atomic_ckpt.remote import NoSuchBucketError, RemoteCheckpointDir, UnsupportedStoreError

CHILD = Path(__file__).resolve().parent / "_cloud_child.py"
BIG = SMALL_PART + 4321
"""One file uploaded in two parts (chunks, blocks): kills land between them."""


_open = fast_root


def _fetch(rdir: RemoteCheckpointDir, step: int, tmp: Path) -> dict[str, bytes]:
    return read_tree(rdir.fetch(step, tmp / f"fetched-{step}-{len(list(tmp.iterdir()))}").path)


# ---------------------------------------------------------------- the probe


def test_probe_refuses_gcs_media_uploads_whose_precondition_is_ignored(
    gs_server: Emulator, tmp_path: Path
) -> None:
    """fake-gcs-server ignores ifGenerationMatch=0 on uploadType=media: a store whose
    commit point went that way is refused by the probe (UnsupportedStoreError naming the
    create-only write) before anything is staged; the real store's multipart path passes."""
    rdir = _open(gs_server, f"gs://{gs_server.new_bucket()}/run", tmp_path)
    store = rdir._store
    sent = []

    def media_create(key: str, data: bytes) -> str:
        url = f"{gs_server.endpoint}/upload/storage/v1/b/{store.bucket_name}/o"  # type: ignore[attr-defined]
        params = {"uploadType": "media", "name": store._key(key), "ifGenerationMatch": "0"}  # type: ignore[attr-defined]
        response = store.session.post(url, params=params, data=data)  # type: ignore[attr-defined]
        sent.append(response.status_code)
        if response.status_code == 412:
            raise AssertionError("the server enforced it: this test shows nothing")
        response.raise_for_status()
        return str(response.json()["generation"])

    original = store.create
    store.create = media_create  # type: ignore[method-assign]
    ran = []
    with pytest.raises(UnsupportedStoreError, match="ifGenerationMatch=0"), rdir.commit(1) as p:
        ran.append(p)
    assert sent == [200, 200], "both media creates were sent and accepted"
    assert ran == []
    assert store.find("") == {}, "the probe removed its object"
    store.create = original  # type: ignore[method-assign]
    rdir.check_conditional_writes()  # the multipart path: enforced, so accepted


def _strip_preconditions(send: Send, request: Any, *a: Any, **kw: Any) -> Any:
    parts = urllib.parse.urlsplit(request.url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "ifGenerationMatch"]
    stripped = len(query) != len(urllib.parse.parse_qsl(parts.query))
    request.url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    for header in ("If-None-Match", "If-Match"):
        stripped |= request.headers.pop(header, None) is not None
    if stripped:
        _STRIPPED.append(request.url)
    return send(request, *a, **kw)


_STRIPPED: list[str] = []


def test_probe_refuses_a_server_that_drops_the_preconditions(
    emulator: Emulator, cloud_url: str, tmp_path: Path
) -> None:
    """Preconditions that never reach the server, as with a server that does not know them:
    on GCS a proxy strips ifGenerationMatch; on Azure (whose shared-key signature covers the
    headers, so no proxy can strip them) the writes go without If-None-Match/If-Match. The
    probe refuses the store, nothing is left uploaded, and the message says what failed."""
    rdir = _open(emulator, cloud_url, tmp_path)
    _STRIPPED.clear()
    store: Any = rdir._store
    if emulator.scheme == "gs":
        Hook(_strip_preconditions).install(store)
    else:

        def unconditional(key: str, data: bytes, etag: str = "") -> str:
            _STRIPPED.append(key)
            return str(store._blob(key).upload_blob(data, overwrite=True)["etag"])

        store.create = unconditional
        store.replace = unconditional
    with pytest.raises(UnsupportedStoreError, match="overwrote an existing object"):
        rdir.begin(1)
    assert _STRIPPED, "the preconditions were dropped"
    assert store.find("") == {}


# ---------------------------------------------------------------- errors


def test_a_missing_bucket_or_container_is_an_error_not_a_missing_step(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Every call on a bucket (container) that does not exist raises NoSuchBucketError (an
    OSError, not a FileNotFoundError) naming it and what to do."""
    name = "t-missing-bucket-x"
    gone = _open(emulator, f"{emulator.scheme}://{name}/run", tmp_path)
    noun = "container" if emulator.scheme == "az" else "bucket"
    calls = {
        "get": lambda: gone.get(3),
        "fetch": lambda: gone.fetch(3, tmp_path / "dest"),
        "steps": gone.steps,
        "latest": gone.latest,
        "entries": gone.entries,
        "delete": lambda: gone.delete(3),
        "clean": lambda: gone.clean(grace=0),
        "begin": lambda: gone.begin(3),
    }
    for what, call in calls.items():
        with pytest.raises(NoSuchBucketError, match=f"{noun} {name!r} does not exist") as caught:
            call()
        assert not isinstance(caught.value, FileNotFoundError), what
        assert "create it" in str(caught.value), what


def test_bad_azure_credentials_are_a_permission_error_and_exit_2(
    az_server: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong account key (Azurite checks the signature: 403) is a PermissionError that
    names the credentials, and the CLI exits 2 with one line."""
    url = f"az://{az_server.new_bucket()}/run"
    bad = {"connection_string": az_server.connection_string(key="QUJD" * 22)}
    rdir = RemoteCheckpointDir(url, storage_options=bad)
    with pytest.raises(PermissionError, match="credentials"):
        rdir.steps()
    assert main(["ls", url, "--storage-options", json.dumps(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "access denied" in err


def test_gcs_refusing_the_credentials_is_a_permission_error(
    gs_server: Emulator, tmp_path: Path
) -> None:
    """fake-gcs-server checks no credentials, so a 401 is injected on every request: a
    PermissionError naming the credentials, not a missing step."""
    rdir = _open(gs_server, f"gs://{gs_server.new_bucket()}/run", tmp_path)
    answered = []

    def deny(send: Send, request: Any, *a: Any, **kw: Any) -> Any:
        import requests

        out = requests.Response()
        out.status_code = 401
        out._content = b'{"error": {"code": 401, "message": "Invalid Credentials"}}'
        out.headers["Content-Type"] = "application/json"
        out.url, out.request = str(request.url), request
        answered.append(request.url)
        return out

    Hook(deny).install(rdir._store)
    with pytest.raises(PermissionError, match="credentials"):
        rdir.steps()
    assert answered


# ---------------------------------------------------------------- failed requests


@pytest.mark.parametrize(
    ("method", "what", "match"),
    [
        ("", "drop", "model.bin"),
        ("GET", "drop", "prefix="),
        ("", "500", "checkpoint_complete"),
        ("", "timeout-after-send", "checkpoint_complete"),
    ],
    ids=["drop-file", "drop-listing", "500-manifest", "lost-manifest-response"],
)
def test_one_failed_request_is_retried(
    emulator: Emulator, cloud_url: str, tmp_path: Path, *, method: str, what: str, match: str
) -> None:
    """One failed request (a dropped connection, a 500, a manifest write that landed but
    whose response was lost) is retried by the client and the commit succeeds bit-exact
    (a lost create-only response: the retry's 412/409 finds the manifest is ours)."""
    rdir = _open(emulator, cloud_url, tmp_path)
    rdir.check_conditional_writes()
    fault = HttpFault(method, what, match)
    fault.install(rdir._store)
    with rdir.commit(1) as path:
        expected = write_tree(path, 1)
    assert fault.fired == 1
    assert _fetch(rdir, 1, tmp_path) == expected


@pytest.mark.parametrize(
    ("method", "match"),
    [("", "model.bin"), ("GET", "prefix="), ("", "checkpoint_complete")],
    ids=["file-upload", "listing", "manifest-write"],
)
def test_a_request_that_keeps_failing_leaves_the_old_checkpoint(
    emulator: Emulator, cloud_url: str, tmp_path: Path, method: str, match: str
) -> None:
    """Replacing step 1 while one kind of request fails every time: an OSError, and step 1
    still shows its old contents, bit-exact. (retry_deadline=2: GCS retries a 500 for 10 s
    otherwise, each operation; a few tries prove the same.)"""
    rdir = _open(emulator, cloud_url, tmp_path, retry_deadline=2)
    with rdir.commit(1) as path:
        old = write_tree(path, 1)
    fault = HttpFault(method, "500", match, times=1000)
    fault.install(rdir._store)
    with pytest.raises(OSError, match=r"500|kept failing|failed"), rdir.commit(1) as path:
        write_tree(path, 2)
    assert fault.fired >= 1
    fault.times = 0
    assert _fetch(rdir, 1, tmp_path) == old


# ---------------------------------------------------------------- large files


def test_large_files_go_in_parts(emulator: Emulator, cloud_url: str, tmp_path: Path) -> None:
    """A file past the threshold is uploaded in parts: GCS a resumable upload in chunks,
    Azure staged blocks each with its Content-MD5 and one block list; it reads back
    bit-exact."""
    rdir = _open(emulator, cloud_url, tmp_path)
    seen: list[Any] = []

    def record(send: Send, request: Any, *a: Any, **kw: Any) -> Any:
        seen.append((request.method, str(request.url), dict(request.headers)))
        return send(request, *a, **kw)

    Hook(record).install(rdir._store)
    with rdir.commit(1) as path:
        expected = write_tree(path, 1, big=2 * SMALL_PART + 7)
    if emulator.scheme == "gs":
        assert sum(m == "POST" and "uploadType=resumable" in url for m, url, _ in seen) == 1
        chunks = [h for m, url, h in seen if m == "PUT" and "upload_id=" in url]
        assert len(chunks) == 3, "three chunks of at most part_size"
    else:
        blocks = [h for m, url, h in seen if m == "PUT" and "comp=block&" in url + "&"]
        assert len(blocks) == 3
        assert all("Content-MD5" in h for h in blocks), "each block carries its MD5"
        assert sum("comp=blocklist" in url for _, url, _ in seen) == 1
    assert _fetch(rdir, 1, tmp_path) == expected


# ---------------------------------------------------------------- processes


def _child(
    emulator: Emulator, url: str, step: int, seed: int, tmp: Path, *extra: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, str(CHILD), url, json.dumps(emulator.options()), str(step)),
            *(str(seed), "--big", str(BIG), "--staging", str(tmp / f"staging-{seed}"), *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_without_cloud(),
    )


@pytest.mark.parametrize("replace", [False, True], ids=["new-step", "replace"])
def test_racing_writer_processes_get_one_winner(
    emulator: Emulator, cloud_url: str, tmp_path: Path, *, replace: bool
) -> None:
    """Three processes stage step 5 and publish at once, creating it (create-only: GCS
    ifGenerationMatch=0, Azure If-None-Match: *) or replacing the same committed step 5
    (GCS ifGenerationMatch=<generation>, Azure If-Match: <etag>): exactly one commits,
    the others get StepConflictError, and the step holds the winner's files."""
    if replace:
        with _open(emulator, cloud_url, tmp_path).commit(5) as path:
            write_tree(path, 9)
    go = tmp_path / "go"
    procs = []
    for seed in (1, 2, 3):
        ready = tmp_path / f"ready-{seed}"
        procs.append(
            (
                seed,
                ready,
                _child(
                    emulator, cloud_url, 5, seed, tmp_path, "--ready", str(ready), "--go", str(go)
                ),
            )
        )
    for _, ready, proc in procs:  # wait for each to be staged
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
    go.touch()
    outcomes = {}
    for seed, _, proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode in (0, 3), err[-2000:]
        outcomes[seed] = json.loads(out)
    winners = [s for s, o in outcomes.items() if o["outcome"] == "committed"]
    assert len(winners) == 1, outcomes
    assert sorted(o["outcome"] for o in outcomes.values()) == ["committed", "conflict", "conflict"]
    rdir = _open(emulator, cloud_url, tmp_path)
    assert rdir.get(5).attempt == outcomes[winners[0]]["attempt"]
    expected = write_tree(tmp_path / "expected", winners[0], big=BIG)
    assert _fetch(rdir, 5, tmp_path) == expected
    assert all("another writer" in o["error"] for o in outcomes.values() if "error" in o)


@pytest.mark.slow  # the slow tier, like the S3 kill tests (docs/contributing.md)
def test_a_writer_killed_before_any_request_leaves_no_visible_step(
    emulator: Emulator, cloud_url: str, tmp_path: Path
) -> None:
    """A child committing step 2 SIGKILLed before each of its requests in turn (the probe,
    reading the manifest, each upload and each part of the large file, the listing, the
    manifest write), and right after the manifest write: step 2 is visible only once its
    manifest was written, then bit-exact; step 1 is intact every time; clean(grace=0) then
    leaves only committed objects and no staged blocks."""
    rdir = _open(emulator, cloud_url, tmp_path)
    with rdir.commit(1) as path:
        old = write_tree(path, 1)
    counting = _child(emulator, cloud_url + "-count", 2, 2, tmp_path)
    out, err = counting.communicate(timeout=300)
    assert counting.returncode == 0, err[-2000:]
    total = json.loads(out)["requests"]
    assert total >= 12
    new = write_tree(tmp_path / "expected", 2, big=BIG)
    points = [["--kill-before", str(n)] for n in range(1, total + 1)]
    points.append(["--kill-after-manifest"])
    for kill in points:
        log = tmp_path / "kill.log"
        log.unlink(missing_ok=True)
        proc = _child(emulator, cloud_url, 2, 2, tmp_path, "--log", str(log), *kill)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == -9, (kill, err[-2000:])
        lines = log.read_text().splitlines()
        assert lines[-1].startswith("KILL"), lines[-3:]
        wrote_manifest = kill == ["--kill-after-manifest"]
        assert rdir.steps() == ([1, 2] if wrote_manifest else [1]), kill
        assert _fetch(rdir, 1, tmp_path) == old
        if wrote_manifest:
            assert _fetch(rdir, 2, tmp_path) == new
    rdir.clean(grace=0)
    referenced = {f"{c.step}/{c.attempt}/" for c in rdir.checkpoints()}
    for key in rdir._store.find(""):
        assert key.endswith("/checkpoint_complete") or key[: key.index("/", 2) + 1] in referenced
    assert rdir._store.live_uploads("") == {}
    assert {e.status for e in rdir.entries()} == {"complete"}
