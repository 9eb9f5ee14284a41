"""SIGKILLed uploaders and racing writers, as real child processes against moto over HTTP.

Each child commits with one request in flight at a time and counts its requests; it
kills itself before the Nth one (or right after the manifest write) and logs that it
did, so every test asserts its kill fired.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _remote_support import S3, SMALL_PART, read_tree, write_tree

from atomic_ckpt.remote import RemoteCheckpointDir

pytestmark = pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow

CHILD = Path(__file__).resolve().parent / "_remote_child.py"
BIG = SMALL_PART + 4321
"""One file uploaded in two parts: kills land between parts."""


def _child(
    s3: S3, url: str, step: int, seed: int, tmp: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(CHILD),
            s3.endpoint,
            url,
            str(step),
            str(seed),
            "--big",
            str(BIG),
            "--staging",
            str(tmp / "staging"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=s3.env,
        timeout=120,
        check=False,
    )


def _open(s3: S3, url: str, tmp: Path) -> RemoteCheckpointDir:
    return RemoteCheckpointDir(url, storage_options=s3.options(), staging_dir=tmp / "st")


def _committed_tree(rdir: RemoteCheckpointDir, step: int, into: Path) -> dict[str, bytes]:
    return read_tree(rdir.fetch(step, into / f"{step}-{len(list(into.glob('*')))}").path)


def _expected(seed: int, tmp: Path) -> dict[str, bytes]:
    where = tmp / f"expected-{seed}"
    where.mkdir(exist_ok=True)
    return write_tree(where, seed, big=BIG)


def _assert_clean_leaves_only_committed(rdir: RemoteCheckpointDir) -> None:
    rdir.clean(grace=0)
    assert {e.status for e in rdir.entries()} == {"complete"}
    referenced = {f"{c.step}/{c.attempt}/" for c in rdir.checkpoints()}
    for key in rdir._store.find(""):
        assert key.endswith("/checkpoint_complete") or key[: key.index("/", 2) + 1] in referenced
    assert rdir._store.live_uploads("") == {}


def _kill_run(
    s3: S3, bucket: str, tmp: Path, name: str, *, step: int, seed: int, kill: list[str]
) -> tuple[RemoteCheckpointDir, str]:
    url = f"s3://{bucket}/{name}"
    rdir = _open(s3, url, tmp)
    log = tmp / f"{name}.log"
    proc = _child(s3, url, step, seed, tmp, "--log", str(log), *kill)
    lines = log.read_text().splitlines() if log.exists() else []
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    assert lines
    assert lines[-1].startswith("KILL"), lines[-3:]
    return rdir, lines[-2]  # the request it died before (or the manifest write it made)


def _count_requests(s3: S3, bucket: str, tmp: Path, *, replace: bool) -> int:
    url = f"s3://{bucket}/count-{int(replace)}"
    if replace:
        with _open(s3, url, tmp).commit(1) as path:
            write_tree(path, 1, big=BIG)
    proc = _child(s3, url, 1 if replace else 2, 2, tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    requests: int = json.loads(proc.stdout)["requests"]
    return requests


def test_killed_new_step_is_never_reported(s3_server: S3, bucket: str, tmp_path: Path) -> None:
    """A child committing step 2 killed before each of its requests in turn (the probe's
    first and last, reading the manifest, each upload, between the two parts of a multipart
    upload, the listing, the manifest write),
    and right after the manifest write: step 2 is reported only when the manifest was
    written, then bit-exact; step 1 is intact every time; clean() then leaves only
    committed objects."""
    total = _count_requests(s3_server, bucket, tmp_path, replace=False)
    assert total >= 14  # probe 5, get 1, uploads 8 (2 parts), list 1, manifest 1
    new = _expected(2, tmp_path)
    rdir = _open(s3_server, f"s3://{bucket}/kill", tmp_path)
    with rdir.commit(1) as path:
        old = write_tree(path, 1)
    first = rdir.get(1)
    # Every request but the middle three of the probe (its writes are alike).
    points = [["--kill-before", str(n)] for n in range(1, total + 1) if n not in (2, 3, 4)]
    points.append(["--kill-after-manifest"])
    fired = []
    for kill in points:
        _, line = _kill_run(s3_server, bucket, tmp_path, "kill", step=2, seed=2, kill=kill)
        fired.append(line)
        after_manifest = kill == ["--kill-after-manifest"]
        assert rdir.steps() == ([1, 2] if after_manifest else [1]), line
        assert rdir.get(1).etag == first.etag  # the same manifest, its objects all there
        if after_manifest:
            assert _committed_tree(rdir, 2, tmp_path / "got") == new
            rdir.delete(2)
    assert len(fired) == total - 2
    killed_before = {line.split()[2] for line in fired}
    assert killed_before >= {
        "PutObject",  # the probe, the small files, the manifest
        "DeleteObjects",  # the probe's cleanup
        "GetObject",  # reading the step's manifest at begin
        "CreateMultipartUpload",
        "UploadPart",  # before the first part, and between the two parts
        "CompleteMultipartUpload",
        "ListObjectsV2",  # the listing check
    }, fired
    assert sum("UploadPart" in line for line in fired) >= 2  # the first part, the second
    manifest_writes = [x for x in fired if "PutObject" in x and "checkpoint_complete" in x]
    assert len(manifest_writes) == 2  # killed before the manifest write, and after it
    _assert_clean_leaves_only_committed(rdir)  # what all those kills left
    assert _committed_tree(rdir, 1, tmp_path / "got") == old


def test_killed_replace_shows_old_or_new_never_neither(
    s3_server: S3, bucket: str, tmp_path: Path
) -> None:
    """A child replacing step 1 killed around the commit point (before the manifest write,
    right after it, and while it deletes the old attempt): step 1 always holds exactly the
    old or exactly the new contents."""
    total = _count_requests(s3_server, bucket, tmp_path, replace=True)
    old, new = _expected(1, tmp_path), _expected(2, tmp_path)
    manifest_put = total - 2  # then: list the old attempt, delete it
    points = [["--kill-before", str(manifest_put)], ["--kill-after-manifest"]]
    points.append(["--kill-before", str(total)])
    for n, kill in enumerate(points, 1):
        name = f"replace-{n}"
        with _open(s3_server, f"s3://{bucket}/{name}", tmp_path).commit(1) as path:
            write_tree(path, 1, big=BIG)
        rdir, line = _kill_run(s3_server, bucket, tmp_path, name, step=1, seed=2, kill=kill)
        committed = kill == ["--kill-after-manifest"] or kill[-1] == str(total)
        assert rdir.steps() == [1], line
        assert _committed_tree(rdir, 1, tmp_path / "got") == (new if committed else old), line
        _assert_clean_leaves_only_committed(rdir)


@pytest.mark.parametrize("existing", [False, True], ids=["new-step", "replace"])
def test_two_processes_same_step_exactly_one_wins(
    s3_server: S3, bucket: str, tmp_path: Path, existing: bool
) -> None:
    """Two processes stage the same step, then publish at the same moment: every round
    exactly one commits and the other gets StepConflictError; the step holds the
    winner's bytes and nothing of the loser's attempt remains."""
    for round_ in range(2 if existing else 3):
        url = f"s3://{bucket}/race-{int(existing)}-{round_}"
        rdir = _open(s3_server, url, tmp_path)
        if existing:
            with rdir.commit(7) as path:
                write_tree(path, 0)
        go = tmp_path / f"go-{existing}-{round_}"
        ready = [tmp_path / f"ready-{existing}-{round_}-{i}" for i in (1, 2)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(CHILD),
                    s3_server.endpoint,
                    url,
                    "7",
                    str(seed),
                    "--staging",
                    str(tmp_path / "staging"),
                    "--ready",
                    str(ready[seed - 1]),
                    "--go",
                    str(go),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=s3_server.env,
            )
            for seed in (1, 2)
        ]
        try:
            while not all(r.exists() for r in ready):
                assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
                time.sleep(0.02)
            go.touch()
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 3], [o[1][-1500:] for o in outs]
        results = [json.loads(o[0]) for o in outs]
        winner = next(r for r in results if r["outcome"] == "committed")
        loser = next(r for r in results if r["outcome"] == "conflict")
        assert "another writer" in loser["error"]
        ckpt = rdir.get(7)
        assert ckpt.attempt == winner["attempt"]
        winner_seed = 1 + [r["outcome"] for r in results].index("committed")
        got = read_tree(rdir.fetch(7, tmp_path / f"race-{existing}-{round_}").path)
        assert got == write_tree(tmp_path / f"w-{existing}-{round_}", winner_seed)
        assert [e.attempts for e in rdir.entries()] == [1]
