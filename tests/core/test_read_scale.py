"""Reading at scale (issue 15): markers judged by their header, latest() newest first,
every earlier marker version still read, verify's progress and the CLI's progress bar."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import select
import shutil
import subprocess
import sys
import threading
import zlib
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointNotFoundError,
    FileEntry,
    Manifest,
    ManifestError,
    VerificationError,
)
from atomic_ckpt._core.l2_syscalls import checksums as _checksums
from atomic_ckpt._core.l3_formats import parse as _parse
from atomic_ckpt._core.l3_formats import read as _read
from atomic_ckpt._core.l3_formats import verify as _verify
from atomic_ckpt._core.l3_formats.manifest import MAGIC, MAX_HEADER_BYTES, MAX_MARKER_BYTES, VERSION
from atomic_ckpt.cli import main

FILES = {"model.bin": b"weights" * 1000, "opt/state.pt": b"adam" * 300, "opt/sched.pt": b"s"}


def commit(ckpts: CheckpointDir, step: int, files: dict[str, bytes] | None = None) -> Path:
    with ckpts.commit(step, metadata={"loss": 1.0 / (step + 1)}) as path:
        for rel, data in (files or FILES).items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_bytes(data)
    return ckpts.path_of(step)


def marker_of(ckpts: CheckpointDir, step: int) -> Path:
    return ckpts.path_of(step) / MARKER


@pytest.fixture
def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The directories whose marker the reader opens (``_read.read_marker`` wrapped)."""
    seen: list[Path] = []
    real = _read.read_marker

    def read_marker(directory: Path, *, body: bool = True) -> Manifest | None:
        seen.append(directory)
        return real(directory, body=body)

    monkeypatch.setattr(_read, "read_marker", read_marker)
    return seen


# ---------------------------------------------------------------- version 1, the earlier format


def v1_marker(m: Manifest) -> bytes:
    """A version-1 marker: ``Manifest.to_bytes`` as it was up to 0.1.0 (commit 9989c83)."""
    doc = {
        "format": "atomic_ckpt",
        "version": 1,
        "step": m.step,
        "created": m.created,
        "library_version": m.library_version,
        "checksum": m.checksum,
        "metadata": dict(m.metadata),
        "files": [e.to_json() for e in m.files],
    }
    return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()


V1_SAMPLE = b"""{
 "format": "atomic_ckpt",
 "version": 1,
 "step": 3,
 "created": 1796051296.0869215,
 "library_version": "0.1.0",
 "checksum": "crc32",
 "metadata": {
  "loss": 0.25
 },
 "files": [
  {
   "path": "best",
   "type": "symlink",
   "target": "model.bin"
  },
  {
   "path": "model.bin",
   "type": "file",
   "size": 7,
   "checksum": "1ad27358"
  },
  {
   "path": "opt",
   "type": "dir"
  },
  {
   "path": "opt/state.pt",
   "type": "file",
   "size": 4,
   "checksum": "a2e56b85"
  }
 ]
}
"""
"""A marker written by atomic_ckpt 0.1.0 (commit 9989c83) for the tree of ``v1_sample_tree``."""


def v1_sample_tree(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(b"weights")
    (path / "opt").mkdir()
    (path / "opt" / "state.pt").write_bytes(b"adam")
    (path / "best").symlink_to("model.bin")
    (path / MARKER).write_bytes(V1_SAMPLE)


def test_the_format_written_is_version_2_in_its_layout(ckpts: CheckpointDir) -> None:
    """A commit writes a version-2 marker: a header line, then a body of its stated length."""
    commit(ckpts, 1)
    data = marker_of(ckpts, 1).read_bytes()
    assert VERSION == 2
    assert data.startswith(MAGIC)
    line, _, body = data.partition(b"\n")
    header = json.loads(line[:-1] + b"}")
    assert header["body_bytes"] == len(body)
    assert header["body_crc32"] == f"{zlib.crc32(body):08x}"
    assert (header["entries"], header["file_count"]) == (4, 3)  # opt/ is an entry too
    assert header["total_size"] == sum(map(len, FILES.values()))
    first = json.loads(data)["files"][0]  # still one JSON document
    st = (ckpts.path_of(1) / "model.bin").stat()
    assert first == {
        "path": "model.bin",
        "size": len(FILES["model.bin"]),
        "checksum": ckpts.checksum_file(ckpts.path_of(1) / "model.bin"),
        # the identity of the file hashed (what a carry checks before it reuses the entry)
        "ino": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
    }


def test_a_saved_version_1_marker_reads_and_verifies(ckpts: CheckpointDir) -> None:
    """A marker written by 0.1.0 is complete, listed, latest, and verifies (and detects)."""
    v1_sample_tree(ckpts.root / "3")
    assert ckpts.steps() == [3]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 3
    m = ckpts.verify(3).manifest
    assert (m.step, m.checksum, dict(m.metadata), m.library_version) == (
        3,
        "crc32",
        {"loss": 0.25},
        "0.1.0",
    )
    assert [(e.path, e.type) for e in m.files] == [
        ("best", "symlink"),
        ("model.bin", "file"),
        ("opt", "dir"),
        ("opt/state.pt", "file"),
    ]
    assert (m.total_size, m.file_count) == (11, 2)
    (ckpts.root / "3" / "model.bin").write_bytes(b"WEIGHTS")
    with pytest.raises(VerificationError, match="crc32 checksum"):
        ckpts.verify(3)


@pytest.mark.parametrize("algorithm", ["crc32", "sha256", "xxh3_128", None])
def test_version_1_markers_written_by_the_old_writer_read_as_before(
    tmp_path: Path, algorithm: str | None
) -> None:
    """Rewritten with the 0.1.0 writer, a checkpoint reads to an equal manifest and verifies."""
    ckpts = CheckpointDir(tmp_path, checksum=algorithm)
    commit(ckpts, 4)
    new = ckpts.get(4).manifest
    marker_of(ckpts, 4).write_bytes(v1_marker(new))
    old = ckpts.get(4).manifest
    assert old == new
    assert old.parsed  # version 1 is parsed whole: there is no header to stop at
    assert ckpts.verify(4).step == 4
    assert [c.manifest for c in ckpts.checkpoints()] == [new]


def test_a_root_mixing_every_version_lists_them_all(ckpts: CheckpointDir) -> None:
    """Legacy (empty), version 1 and version 2 markers side by side: all complete."""
    commit(ckpts, 1)
    marker_of(ckpts, 1).write_bytes(v1_marker(ckpts.get(1).manifest))
    v1_sample_tree(ckpts.root / "3")
    (ckpts.root / "5").mkdir()
    (ckpts.root / "5" / MARKER).write_bytes(b"")
    (ckpts.root / "6").mkdir()
    (ckpts.root / "6" / MARKER).write_bytes(b" \n")  # whitespace: legacy too
    commit(ckpts, 4)
    assert ckpts.steps() == [1, 3, 4, 5, 6]
    assert [e.status for e in ckpts.entries()] == ["complete"] * 5
    latest = ckpts.latest()
    assert latest is not None
    assert latest.manifest.legacy
    for step in (1, 3, 4, 5, 6):
        ckpts.verify(step)


def test_a_marker_rewritten_by_json_tools_is_parsed_whole(ckpts: CheckpointDir) -> None:
    """Re-serialized by json.loads/json.dumps (one line, no layout), a marker still reads."""
    commit(ckpts, 2)
    before = ckpts.get(2).manifest
    marker = marker_of(ckpts, 2)
    marker.write_text(json.dumps(json.loads(marker.read_bytes())))
    after = ckpts.get(2).manifest
    assert after.parsed
    assert after == before
    assert ckpts.steps() == [2]
    ckpts.verify(2)


# ---------------------------------------------------------------- latest(), get(): one marker each


def test_latest_reads_one_marker_however_many_checkpoints(
    ckpts: CheckpointDir, count_reads: list[Path]
) -> None:
    """latest() opens the highest step's marker only; get() opens just its own."""
    for step in range(30):
        commit(ckpts, step, {"m.bin": b"x"})
    count_reads.clear()
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 29
    assert count_reads == [ckpts.path_of(29)]
    count_reads.clear()
    assert ckpts.get(7).step == 7
    assert count_reads == [ckpts.path_of(7)]


def test_latest_walks_down_past_incomplete_steps_warning_once(
    ckpts: CheckpointDir, count_reads: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Newer unmarked or invalid steps are examined (and warned about) until a complete one."""
    for step in range(10):
        commit(ckpts, step, {"m.bin": b"x"})
    (ckpts.root / "12").mkdir()  # unmarked
    commit(ckpts, 11)
    marker_of(ckpts, 11).write_bytes(b"{not json")
    caplog.set_level(logging.WARNING, logger="atomic_ckpt")
    count_reads.clear()
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 9
    assert count_reads == [ckpts.path_of(12), ckpts.path_of(11), ckpts.path_of(9)]
    ckpts.latest()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2
    assert any("mark-complete" in w for w in warned)


def test_latest_verify_stops_at_the_first_that_verifies(
    ckpts: CheckpointDir, count_reads: list[Path]
) -> None:
    """latest(verify=True) skips a newest checkpoint that does not verify, reading no older ones."""
    for step in range(5):
        commit(ckpts, step)
    (ckpts.path_of(4) / "model.bin").write_bytes(b"torn")
    count_reads.clear()
    found = ckpts.latest(verify=True)
    assert found is not None
    assert found.step == 3
    assert set(count_reads) == {ckpts.path_of(4), ckpts.path_of(3)}


def test_newest_first_is_numeric_order_among_any_names(tmp_path: Path) -> None:
    """latest() walks steps in numeric order (10 after 99, not before), whatever else is there."""
    ckpts = CheckpointDir(tmp_path, prefix="ckpt-")
    steps = [0, 2, 9, 10, 99, 100, 1000]
    for step in steps:
        commit(ckpts, step, {"m.bin": b"x"})
    for junk in ["ckpt-0100", "ckpt-99x", "ckpt-", "ckpt-1e3", "zzzzzzzzzzzzzzzzzzzzzz", "5"]:
        (tmp_path / junk).mkdir()
    (tmp_path / ("ckpt-7.tmp-" + "a" * 32)).mkdir()
    order = [c.step for c in _read.newest(ckpts.root, ckpts.prefix, set())]
    assert order == sorted(steps, reverse=True)
    assert order == sorted(ckpts.steps(), reverse=True)
    marker_of(ckpts, 1000).write_bytes(b"{broken")
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 100


def _prune_during_the_first_look(
    monkeypatch: pytest.MonkeyPatch, ckpts: CheckpointDir, newer: Path
) -> None:
    """When step 1 is first classified, a live run promotes ``newer`` as step 2 and prunes 1."""
    real = _read.classify
    done: list[bool] = []

    def classify(path: Path, step: int, *, body: bool = True) -> _read.Entry:
        if step == 1 and not done:
            done.append(True)
            newer.rename(ckpts.path_of(2))
            ckpts.path_of(1).rename(ckpts.root / ("1.tmp-del-" + "d" * 32))
        return real(path, step, body=body)

    monkeypatch.setattr(_read, "classify", classify)


@pytest.mark.parametrize("call", ["steps", "latest"])
def test_a_prune_racing_a_scan_never_hides_the_newer_checkpoint(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, call: str
) -> None:
    """A step that vanishes mid-scan (pruned after a newer save) makes the scan list again."""
    commit(ckpts, 1)
    commit(ckpts, 2)
    newer = tmp_path / "newer"
    ckpts.path_of(2).rename(newer)  # promoted only once the scan has listed the root
    _prune_during_the_first_look(monkeypatch, ckpts, newer)
    if call == "steps":
        assert ckpts.steps() == [2]
    else:
        latest = ckpts.latest()
        assert latest is not None
        assert latest.step == 2


def test_scans_read_headers_not_file_lists(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """steps(), checkpoints(), entries(), `ls` and latest() never parse a file list."""
    for step in range(3):
        commit(ckpts, step)
    expected = [c.manifest.files for c in ckpts.checkpoints()]

    def refuse(body: bytes, header: Any) -> Any:
        raise AssertionError("a file list was parsed")

    monkeypatch.setattr(_parse, "parse_body", refuse)
    assert ckpts.steps() == [0, 1, 2]
    found = ckpts.checkpoints()
    assert not any(c.manifest.parsed for c in found)
    assert [c.manifest.file_count for c in found] == [3, 3, 3]
    assert [c.manifest.total_size for c in found] == [sum(map(len, FILES.values()))] * 3
    assert ckpts.latest() is not None
    assert main(["ls", str(ckpts.root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["files"], r["size"]) for r in rows] == [(3, 8201)] * 3
    monkeypatch.undo()
    assert [c.manifest.files for c in found] == expected  # parsed on demand, from the marker


# ---------------------------------------------------------------- the lazy path vs hostile markers


def v2_marker(
    files: list[Any] | None = None,
    *,
    header: dict[str, Any] | None = None,
    body: bytes | None = None,
) -> bytes:
    """A version-2 marker in its layout, counts and CRC made to match ``body`` (or ``files``)
    unless ``header`` overrides them."""
    if body is None:
        entries = files if files is not None else [{"path": "m.bin", "size": 1}]
        body = ('"files":[\n' + ",\n".join(json.dumps(e) for e in entries) + "\n]}\n").encode()
        sizes = [e.get("size", 0) for e in entries if isinstance(e, dict) and "type" not in e]
        counts = {"entries": len(entries), "file_count": len(sizes), "total_size": sum(sizes)}
    else:
        counts = {"entries": 0, "file_count": 0, "total_size": 0}
    doc = {
        "format": "atomic_ckpt",
        "version": 2,
        "step": 2,
        "created": 1.0,
        "library_version": "x",
        "checksum": None,
        "metadata": {},
        **counts,
        "body_bytes": len(body),
        "body_crc32": f"{zlib.crc32(body):08x}",
        **(header or {}),
    }
    line = json.dumps(doc).encode()[:-1] + b",\n"
    assert line.startswith(MAGIC)
    return line + body


DEPTH = 100_000
BAD_HEADERS: dict[str, bytes] = {
    "truncated-body": v2_marker()[:-3],
    "extended": v2_marker() + b"\n",
    "body-bytes-negative": v2_marker(header={"body_bytes": -1}),
    "body-bytes-bool": v2_marker(header={"body_bytes": True}),
    "body-bytes-float": v2_marker(header={"body_bytes": 31.0}),
    "body-bytes-huge": v2_marker(header={"body_bytes": 10**400}),
    "entries-missing": v2_marker(header={"entries": None}),
    "more-files-than-entries": v2_marker(header={"file_count": 2}),
    "total-size-huge": v2_marker(header={"total_size": 10**400}),
    "crc-not-hex": v2_marker(header={"body_crc32": "zzzzzzzz"}),
    "step-a-string": v2_marker(header={"step": "2"}),
    "metadata-a-list": v2_marker(header={"metadata": [1]}),
    "metadata-nested-deeply": (
        MAGIC + b'"metadata": ' + b"[" * DEPTH + b"]" * DEPTH + b', "entries": 0,\n"files":[]}\n'
    ),
    "header-longer-than-its-bound": MAGIC + b" " * (MAX_HEADER_BYTES + 10) + b'"x": 1,\n{}',
    "header-never-ends": MAGIC + b"0" * (MAX_HEADER_BYTES * 2),
    "header-not-closed": MAGIC + b'"step": 2}\n',
    "not-utf8": MAGIC + b'"step": "\xff\xfe",\n',
}


@pytest.mark.parametrize("marker", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_a_hostile_header_makes_only_its_step_incomplete(
    ckpts: CheckpointDir, marker: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Headers with bad sizes, counts, types or nesting, or too long: invalid, nothing raised."""
    commit(ckpts, 1)
    (ckpts.root / "2").mkdir()
    (ckpts.root / "2" / MARKER).write_bytes(marker)
    assert ckpts.steps() == [1]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 1
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get(2)
    assert [e.status for e in ckpts.entries()] == ["complete", "invalid"]
    with pytest.raises(ManifestError):  # the scanner and from_bytes agree
        Manifest.from_bytes(marker)
    assert main(["ls", str(ckpts.root)]) == 0
    assert main(["verify", str(ckpts.root)]) == 0
    assert "step 1: ok" in capsys.readouterr().out


@pytest.mark.skipif(sys.platform != "linux", reason="sparse files")
def test_a_huge_marker_with_a_valid_header_is_not_read(ckpts: CheckpointDir) -> None:
    """A (sparse) marker beyond MAX_MARKER_BYTES whose header claims that size is invalid."""
    body_bytes = MAX_MARKER_BYTES + 1
    line = v2_marker(header={"body_bytes": body_bytes}).partition(b"\n")[0] + b"\n"
    (ckpts.root / "2").mkdir(parents=True)
    marker = ckpts.root / "2" / MARKER
    marker.write_bytes(line)
    os.truncate(marker, len(line) + body_bytes)
    assert ckpts.steps() == []


BAD_BODIES: dict[str, dict[str, Any]] = {
    "unsafe-path": {"files": [{"path": "../outside.bin", "size": 1}]},
    "lone-surrogate-path": {"files": [{"path": "\ud800", "size": 1}]},
    "size-beyond-float": {
        "files": [{"path": "m.bin", "size": 10**400}],
        "header": {"total_size": 0},
    },
    "size-negative": {"files": [{"path": "m.bin", "size": -1}], "header": {"total_size": 0}},
    "entry-not-an-object": {"files": [["m.bin", 1]]},
    "nested-deeply": {"body": b'"files":[' + b"[" * DEPTH + b"]" * DEPTH + b"]}\n"},
    "not-json": {"body": b'"files":[{"path": \n'},
    "extra-keys": {"body": b'"files":[], "step": 9}\n'},
    "counts-disagree": {"files": [{"path": "m.bin", "size": 1}], "header": {"entries": 2}},
    "total-disagrees": {"files": [{"path": "m.bin", "size": 1}], "header": {"total_size": 5}},
}


@pytest.fixture(params=sorted(BAD_BODIES))
def bad_body(request: pytest.FixtureRequest, ckpts: CheckpointDir) -> CheckpointDir:
    """Step 1 intact; step 2's header is valid (CRC and length match) but its body is hostile."""
    commit(ckpts, 1)
    path = ckpts.root / "2"
    path.mkdir()
    (path / "m.bin").write_bytes(b"x")
    spec = BAD_BODIES[request.param]
    (path / MARKER).write_bytes(
        v2_marker(spec.get("files"), body=spec.get("body"), header=spec.get("header"))
    )
    return ckpts


def test_a_hostile_body_is_found_when_the_file_list_is_used(
    bad_body: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scans judge by the header (complete); files raise ManifestError; verify reports it."""
    ckpts = bad_body
    assert ckpts.steps() == [1, 2]
    ckpt = ckpts.get(2)
    with pytest.raises(ManifestError):
        _ = ckpt.manifest.files
    with pytest.raises(VerificationError, match="manifest") as info:
        ckpts.verify(2)
    assert isinstance(info.value.__cause__, ManifestError)
    assert info.value.path == ckpt.path / MARKER
    assert info.value.step == 2
    assert len(info.value.problems) == 1
    found = ckpts.latest(verify=True)
    assert found is not None
    assert found.step == 1
    assert main(["ls", str(ckpts.root)]) == 0
    assert main(["verify", str(ckpts.root)]) == 1
    out = capsys.readouterr().out
    assert "step 1: ok" in out
    assert "step 2: FAILED" in out


def test_a_body_checksum_mismatch_surfaces_in_verify(ckpts: CheckpointDir) -> None:
    """One flipped byte in the file list (same length): listed, but verify names the CRC."""
    commit(ckpts, 3)
    marker = marker_of(ckpts, 3)
    data = bytearray(marker.read_bytes())
    at = data.index(b'"size":') + len(b'"size":')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    marker.write_bytes(bytes(data))
    assert ckpts.steps() == [3]
    with pytest.raises(ManifestError, match="CRC-32"):
        _ = ckpts.get(3).manifest.files
    with pytest.raises(VerificationError, match="CRC-32") as info:
        ckpts.verify(3)
    assert isinstance(info.value.__cause__, ManifestError)
    assert ckpts.latest(verify=True) is None


def test_metadata_too_large_for_a_header_is_refused_at_commit(ckpts: CheckpointDir) -> None:
    """Metadata beyond what a header holds is a ValueError before anything is written."""
    with pytest.raises(ValueError, match="metadata"), ckpts.commit(1, metadata={"x": "a" * 2**20}):
        pass
    assert ckpts.steps() == []


# ---------------------------------------------------------------- between steps() and get()


def test_a_checkpoint_that_becomes_invalid_between_steps_and_get(ckpts: CheckpointDir) -> None:
    """A step listed by steps() whose marker is then damaged: get() and latest() see it."""
    commit(ckpts, 1)
    commit(ckpts, 2)
    assert ckpts.steps() == [1, 2]
    marker = marker_of(ckpts, 2)
    marker.write_bytes(marker.read_bytes()[:-10])  # truncated
    with pytest.raises(CheckpointNotFoundError, match="truncated or extended"):
        ckpts.get(2)
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 1
    assert ckpts.steps() == [1]


def test_a_listed_checkpoint_replaced_or_removed_before_its_files_are_read(
    ckpts: CheckpointDir,
) -> None:
    """checkpoints() then a replace (or a delete): files raise ManifestError, never a mix."""
    many = {f"part_{i:03d}.bin": b"p" for i in range(100)}  # a marker longer than one read
    commit(ckpts, 1, many)
    commit(ckpts, 2, many)
    assert marker_of(ckpts, 2).stat().st_size > 2 * _read._PROBE
    listed = {c.step: c for c in ckpts.checkpoints()}
    snapshot = ckpts.get(2)  # get() reads the marker whole: unaffected by what follows
    commit(ckpts, 2, {"other.bin": b"another save"})
    with pytest.raises(ManifestError, match="look it up again"):
        _ = listed[2].manifest.files
    assert [e.path for e in ckpts.get(2).manifest.files] == ["other.bin"]
    assert len(snapshot.manifest.files) == 100
    shutil.rmtree(ckpts.path_of(1))
    with pytest.raises(ManifestError, match="look it up again"):
        _ = listed[1].manifest.files


# ---------------------------------------------------------------- the Manifest type


def test_manifests_stay_immutable_values_that_pickle(ckpts: CheckpointDir) -> None:
    """Lazy manifests compare by content, pickle (parsed or not) and refuse assignment."""
    commit(ckpts, 1)
    listed = ckpts.checkpoints()[0].manifest
    got = ckpts.get(1).manifest
    assert "not yet parsed" in repr(listed)
    for m in (listed, got):
        copy = pickle.loads(pickle.dumps(m))
        assert copy == got
        assert copy.files == got.files
    assert pickle.loads(pickle.dumps(got)).parsed
    with pytest.raises(FrozenInstanceError):
        got.step = 3
    eager = Manifest(
        got.step, got.files, got.created, got.library_version, got.checksum, got.metadata
    )
    assert eager == got
    assert Manifest.from_bytes(eager.to_bytes()) == got
    assert (eager.total_size, eager.file_count) == (got.total_size, got.file_count)


def test_a_100k_file_manifest_is_compact(tmp_path: Path) -> None:
    """100,000 entries: a quarter smaller than version 1 (~145 bytes a file here), intact."""
    files = tuple(
        FileEntry(f"shards/rank_{i // 1000:03d}/part_{i:06d}.distcp", "file", i, f"{i:032x}")
        for i in range(100_000)
    )
    m = Manifest(7, files, 1.0, "x", "xxh3_128", {})
    data = m.to_bytes()
    per_file = len(data) / len(files)
    assert per_file < 0.75 * len(v1_marker(m)) / len(files)
    assert per_file < 110
    back = Manifest.from_bytes(data)
    assert back.file_count == 100_000
    assert back.files == files


# ---------------------------------------------------------------- verify's progress


def test_progress_reports_every_byte_in_the_calling_thread(tmp_path: Path) -> None:
    """progress(done, total): starts at 0, never goes back, ends at the total of the sizes."""
    ckpts = CheckpointDir(tmp_path, workers=4)
    big = os.urandom(3 << 20)
    commit(ckpts, 1, {**FILES, "big.bin": big})
    calls: list[tuple[int, int]] = []
    threads: set[int] = set()

    def progress(done: int, total: int) -> None:
        calls.append((done, total))
        threads.add(threading.get_ident())

    ckpts.verify(1, progress=progress)
    total = sum(map(len, FILES.values())) + len(big)
    assert calls[0] == (0, total)
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert {t for _, t in calls} == {total}
    assert threads == {threading.get_ident()}


def test_progress_reaches_the_total_when_files_are_bad(ckpts: CheckpointDir) -> None:
    """Missing and resized files count as done: the last call is still (total, total)."""
    path = commit(ckpts, 1)
    (path / "model.bin").unlink()
    (path / "opt" / "state.pt").write_bytes(b"short")
    calls: list[tuple[int, int]] = []
    with pytest.raises(VerificationError) as info:
        ckpts.verify(1, progress=lambda d, t: calls.append((d, t)))
    assert len(info.value.problems) == 2
    total = sum(map(len, FILES.values()))
    assert calls[-1] == (total, total)


def test_progress_of_a_legacy_marker_is_zero_of_zero(ckpts: CheckpointDir) -> None:
    """A legacy marker has nothing to read: one call, (0, 0)."""
    (ckpts.root / "1").mkdir(parents=True)
    (ckpts.root / "1" / MARKER).write_bytes(b"")
    calls: list[tuple[int, int]] = []
    ckpts.verify(1, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 0)]


def test_checksums_report_each_read(tmp_path: Path) -> None:
    """checksum_file's on_read sees every chunk of a large file (what progress is made of)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"z" * ((3 << 20) + 5))
    reads: list[int] = []
    plain = _checksums.checksum_file(path, "xxh3_128")
    assert _checksums.checksum_file(path, "xxh3_128", on_read=reads.append) == plain
    assert sum(reads) == (3 << 20) + 5
    assert len(reads) == 4


def test_verify_reads_each_file_once(ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every regular file is opened for reading exactly once by verify()."""
    path = commit(ckpts, 1)
    opened: list[str] = []
    real = os.open

    def spy(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(file))
        return real(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    ckpts.verify(1)
    data = sorted(p for p in opened if not p.endswith(MARKER))
    assert data == sorted(str(path / rel) for rel in FILES)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("swap", ["fifo", "symlink", "directory"])
def test_a_file_swapped_after_the_walk_is_reported_never_followed_or_waited_on(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, swap: str
) -> None:
    """A file replaced between verify's listing and its read (by a FIFO, a symlink to a copy,
    a directory) fails verify: no hang on the FIFO, the link not followed."""
    path = commit(ckpts, 1)
    listing = list(_verify.walk(path, lambda name: name == MARKER))  # model.bin: a regular file
    (path / "model.bin").unlink()
    if swap == "fifo":
        os.mkfifo(path / "model.bin")
    elif swap == "symlink":
        (tmp_path / "copy.bin").write_bytes(FILES["model.bin"])
        (path / "model.bin").symlink_to(tmp_path / "copy.bin")
    else:
        (path / "model.bin").mkdir()
    monkeypatch.setattr(_verify, "walk", lambda top, skip=None: iter(listing))
    with pytest.raises(VerificationError) as info:
        ckpts.verify(1)
    assert info.value.path == path / "model.bin"
    assert len(info.value.problems) == 1


# ---------------------------------------------------------------- the CLI's progress bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cli_verify_shows_a_progress_bar_on_a_terminal(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a terminal `verify` draws a bar with bytes, rate and ETA on stderr, then erases it."""
    commit(ckpts, 1)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["verify", str(ckpts.root)]) == 0
    drawn = terminal.getvalue()
    assert "\rstep 1: [" in drawn
    assert "/s" in drawn
    assert "8.0 KiB / 8.0 KiB" in drawn
    assert drawn.endswith("\r")  # erased: the verdict starts on a clean line
    assert capsys.readouterr().out == "step 1: ok\n"


def test_cli_progress_bar_fits_a_narrow_terminal(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a 40-column terminal every drawn line is shorter than the terminal (no wrapping)."""
    commit(ckpts, 1)
    terminal = _Terminal()
    monkeypatch.setattr(terminal, "fileno", lambda: 2, raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=1: os.terminal_size((40, 24)))
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["verify", str(ckpts.root)]) == 0
    lines = [part for part in terminal.getvalue().split("\r") if part.strip()]
    assert lines
    assert all(len(line) < 40 for line in lines)
    assert all(line.startswith("step 1:") for line in lines)


@pytest.mark.parametrize("args", [["--json"], []], ids=["json-on-a-terminal", "piped"])
def test_cli_verify_prints_no_bar_with_json_or_when_piped(
    ckpts: CheckpointDir,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
) -> None:
    """With --json, or with stderr not a terminal, nothing extra is written."""
    commit(ckpts, 1)
    stderr: io.StringIO = _Terminal() if args else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert main(["verify", str(ckpts.root), *args]) == 0
    assert stderr.getvalue() == ""
    out = capsys.readouterr().out
    if args:
        assert json.loads(out)[0]["ok"] is True
    else:
        assert out == "step 1: ok\n"


def _run_with_stderr_on_a_pty(argv: list[str]) -> tuple[int, str, str]:
    """Run ``atomic-ckpt argv`` with stderr on a pseudo-terminal and stdout on a pipe."""
    controller, terminal = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "atomic_ckpt.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=terminal,
        )
        os.close(terminal)
        drawn = b""
        while True:
            ready, _, _ = select.select([controller], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(controller)
    return proc.returncode, out.decode(), drawn.decode()


@pytest.mark.skipif(sys.platform != "linux", reason="a pseudo-terminal: Linux")
def test_cli_verify_draws_on_a_real_terminal_and_keeps_stdout_clean(ckpts: CheckpointDir) -> None:
    """Through a real pty: the bar goes to the terminal, stdout carries only the verdict."""
    commit(ckpts, 1)
    status, out, drawn = _run_with_stderr_on_a_pty(["verify", str(ckpts.root)])
    assert status == 0, drawn
    assert out == "step 1: ok\n"
    assert "step 1: [" in drawn
    status, out, drawn = _run_with_stderr_on_a_pty(["verify", str(ckpts.root), "--json"])
    assert status == 0
    assert drawn == ""
