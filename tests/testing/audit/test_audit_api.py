"""atomic_ckpt.testing.audit: what it finds in naive, marker and commit() saves."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from _audit_scripts import (
    COMMITTED,
    MARKER,
    NAIVE,
    RESUME,
    check_script,
    needs_strace,
    resume_committed,
    resume_marked,
    script,
)

from atomic_ckpt.testing import AuditReport, audit
from atomic_ckpt.testing.audit import CannotRebuild, StraceNotFound, WorkloadFailed
from atomic_ckpt.testing.audit._checks import namespaces_available

pytestmark = needs_strace


def test_naive_in_place_save_is_broken_under_kill(tmp_path: Path) -> None:
    """Files written straight into N/: a kill leaves a newest N/ the resume cannot load."""
    root = tmp_path / "ckpts"
    resume = check_script(tmp_path, "resume.py", RESUME)
    workload = [*script(tmp_path, "naive.py", NAIVE), str(root)]
    report = audit(workload, [*resume, str(root)], root=root, models=["kill"])
    assert isinstance(report, AuditReport)
    assert not report.ok
    assert report.models == ("kill",)
    assert report.by_model("kill")
    first = report.violations[0]
    assert first.model == "kill"
    assert first.status != 0
    assert first.listing  # what is on disk in the failing state
    assert "meta.json" in first.output or "corrupt weights" in first.output
    assert not root.exists()  # it did not exist before the audit


@dataclass(frozen=True)
class _Marked:
    root: Path
    workload: list[str]
    resume: Callable[[Path], None]
    report: AuditReport


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory) -> _Marked:
    """MARKER audited serially with a function check, once for the tests that read it
    (the report is read-only): the check also asserts it sees the state at DIR itself."""
    tmp = tmp_path_factory.mktemp("marked")
    root = tmp / "ckpts"
    workload = [*script(tmp, "marker.py", MARKER), str(root)]

    def resume(path: Path) -> None:
        assert path == root  # the state is seen at DIR itself, not elsewhere
        resume_marked(path)

    return _Marked(root, workload, resume, audit(workload, resume, root=root))


def test_marker_without_fsync_is_clean_under_kill_and_broken_under_power(marked: _Marked) -> None:
    """A marker written last survives any kill, but a power loss keeps it without the data."""
    report = marked.report
    assert report.by_model("kill") == ()
    assert report.states["kill"] > 10
    power = report.by_model("power")
    assert power
    assert any("zero-filled" in d or "short" in d for v in power for d in v.damaged)
    assert "BROKEN" in report.verdict


def test_commit_is_clean_under_kill_and_power(tmp_path: Path) -> None:
    """Saves through CheckpointDir.commit(): every kill and power-loss state resumes."""
    root = tmp_path / "ckpts"
    workload = [*script(tmp_path, "committed.py", COMMITTED), str(root)]
    report = audit(workload, resume_committed, root=root)
    assert report.ok, report
    assert report.states["kill"] > 10
    assert report.states["power"] > 10
    assert report.verdict.startswith("clean")


def test_identical_states_are_checked_once(tmp_path: Path) -> None:
    """A state two models (or two crash points) share runs its check once."""
    root = tmp_path / "ckpts"
    counter = tmp_path / "count"
    counter.mkdir()

    def check(path: Path) -> None:
        (counter / str(os.getpid())).touch()

    report = audit([*script(tmp_path, "naive.py", NAIVE), str(root)], check, root=root)
    assert len(os.listdir(counter)) == report.checked
    assert report.checked < sum(report.states.values())
    # power gives each unsynced write its own fate (issue 29.1): more states than before
    assert report.checked <= report.boundaries["kill"] * 25


def test_max_states_samples_reproducibly_and_says_so(tmp_path: Path) -> None:
    """Past max_states, a seeded sample is checked and the report says it sampled."""
    root = tmp_path / "ckpts"
    workload = [*script(tmp_path, "naive.py", NAIVE), str(root)]
    check = [*check_script(tmp_path, "resume.py", RESUME), str(root)]
    first = audit(workload, check, root=root, max_states=5, seed=3)
    again = audit(workload, check, root=root, max_states=5, seed=3)
    assert first.checked == 5
    assert first.sampled is not None
    assert "seed 3" in first.sampled
    assert sum(first.distinct.values()) > 5
    assert [(v.model, v.crash_point) for v in first.violations] == [
        (v.model, v.crash_point) for v in again.violations
    ]


def test_an_existing_root_is_the_starting_state_and_is_put_back(tmp_path: Path) -> None:
    """The workload starts from DIR's contents; afterwards DIR holds exactly them again."""
    root = tmp_path / "ckpts"
    (root / "1").mkdir(parents=True)
    (root / "1" / "weights.bin").write_bytes(b"\x01" * 4096)
    (root / "1" / "meta.json").write_text('{"step": 1, "size": 4096}')
    seen = tmp_path / "seen"

    def check(path: Path) -> None:
        assert (path / "1" / "meta.json").exists()  # the starting state is durable
        seen.touch()

    audit([*script(tmp_path, "naive.py", NAIVE), str(root)], check, root=root, models=["power"])
    assert seen.exists()
    assert sorted(os.listdir(root)) == ["1"]
    assert (root / "1" / "weights.bin").read_bytes() == b"\x01" * 4096
    assert [p.name for p in tmp_path.iterdir() if "audit" in p.name] == []


MMAP = """\
# Writes a file through a shared mapping and never calls msync: strace cannot see the bytes.
import mmap, os, sys
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], "mapped.bin"), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
m[:5] = b"hello"
m.close()
os.close(fd)
"""


def test_a_write_the_trace_cannot_see_is_refused_not_judged(tmp_path: Path) -> None:
    """An mmap write without msync: the shared writable mapping is refused (issue 29.4)."""
    root = tmp_path / "ckpts"
    ran = tmp_path / "ran"

    def check(path: Path) -> None:
        ran.touch()

    with pytest.raises(CannotRebuild) as info:
        audit([*script(tmp_path, "mapped_write.py", MMAP), str(root)], check, root=root)
    assert info.value.paths == ["mapped.bin"]
    assert "mapped shared through a descriptor open for writing" in str(info.value)
    assert not ran.exists()  # nothing was judged
    assert not root.exists()


def test_a_failing_workload_is_an_error(tmp_path: Path) -> None:
    """A recorded run that exits non-zero cannot be audited: WorkloadFailed with its output."""
    workload = script(tmp_path, "fail.py", "import sys; print('out of memory'); sys.exit(3)")
    with pytest.raises(WorkloadFailed) as info:
        audit(workload, "true", root=tmp_path / "ckpts")
    assert info.value.status == 3
    assert "out of memory" in str(info.value)


def test_missing_strace_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without strace on PATH the audit stops before running anything and names the package."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StraceNotFound, match="apt-get install strace"):
        audit(["true"], "true", root=tmp_path / "ckpts")
    assert shutil.which("strace") is None


@pytest.mark.skipif(not namespaces_available(), reason="needs root and unshare -m")
def test_forked_checks_run_in_parallel_namespaces_see_their_own_state(marked: _Marked) -> None:
    """jobs=2 with a function check: each child sees its state at DIR; same verdicts as serial."""
    serial = marked.report  # the same workload and check, audited with jobs=1
    parallel = audit(marked.workload, marked.resume, root=marked.root, jobs=2)
    assert [n for n in parallel.notes if not n.startswith("power:")] == []
    assert parallel.states == serial.states
    key = [(v.model, v.crash_point, v.survived) for v in serial.violations]
    assert [(v.model, v.crash_point, v.survived) for v in parallel.violations] == key
    assert serial.by_model("power")


def test_progress_is_drawn_only_when_asked_or_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """progress=True draws a progress line on stderr; by default, off a terminal, nothing."""
    root = tmp_path / "ckpts"
    workload = [*script(tmp_path, "committed.py", COMMITTED), str(root)]
    audit(workload, resume_committed, root=root, models=["kill"], max_states=3)
    assert capsys.readouterr().err == ""
    audit(workload, resume_committed, root=root, models=["kill"], max_states=3, progress=True)
    assert "checked 3/3 states, 0 failing" in capsys.readouterr().err
