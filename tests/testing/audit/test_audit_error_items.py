"""Issue 29, the report's half: whatever is not a judged violation exits 2 with a one-line
reason and no traceback, and the verdict never counts more failing states than it checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _audit_scripts import NAIVE, needs_strace, script

from atomic_ckpt.testing import audit
from atomic_ckpt.testing.audit import AuditError
from atomic_ckpt.testing.audit._trace import TraceRecorder

pytestmark = needs_strace

SPARSE = """\
import os, sys
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], "huge.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
os.ftruncate(fd, 8 << 40)  # 8 TiB, a hole: it costs nothing on disk
os.close(fd)
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``atomic-ckpt ARGS`` with this checkout's atomic_ckpt."""
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def one_line_error(run: subprocess.CompletedProcess[str]) -> str:
    """The reason a run that exited 2 without a traceback gave, in its one line (what
    follows it, if anything, is indented detail: the files a replay could not rebuild)."""
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[0].startswith("atomic-ckpt audit: error: "), run.stderr
    assert all(line.startswith("  ") for line in lines[1:]), run.stderr  # details, if any
    return lines[0]


def test_29_20_a_check_python_module_with_a_syntax_error_exits_2_in_one_line(
    tmp_path: Path,
) -> None:
    """29.20: --check-python naming a module that does not compile: exit 2, one line."""
    (tmp_path / "broken_check.py").write_text("def check(root):\n    return (\n")
    run = cli(
        "audit", "--root", "ckpts", "--check-python", "broken_check:check", "--",
        *script(tmp_path, "naive.py", NAIVE), "ckpts", cwd=tmp_path,
    )  # fmt: skip
    line = one_line_error(run)
    assert "broken_check" in line
    assert "SyntaxError" in line


def test_29_20_an_8_tib_sparse_file_is_judged_not_refused(tmp_path: Path) -> None:
    """29.20: an 8 TiB sparse file (a hole) is held by the data it has, not its size: the
    audit judges the run (exit 0 for a check that accepts every state), no MemoryError."""
    run = cli(
        "audit", "--root", "ckpts", "--check", "test -f ckpts/huge.bin || true", "--",
        *script(tmp_path, "sparse.py", SPARSE), "ckpts", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "clean" in run.stdout
    assert not (tmp_path / "ckpts").exists()


def test_29_20_running_out_of_memory_exits_2_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """29.20: a MemoryError while modelling (a dense file too large to hold): AuditError
    naming memory, in one line, never the status of a violation."""
    fired: list[int] = []

    def no_memory(self: TraceRecorder, calls: object) -> None:
        fired.append(1)
        raise MemoryError

    monkeypatch.setattr(TraceRecorder, "feed", no_memory)
    root = tmp_path / "ckpts"
    with pytest.raises(AuditError, match="ran out of memory") as info:
        audit([*script(tmp_path, "naive.py", NAIVE), str(root)], "true", root=root)
    assert fired
    assert "\n" not in str(info.value)
    assert not root.exists()


def test_29_20_an_internal_error_in_the_replay_is_an_audit_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """29.20: a failed assertion while replaying the trace: AuditError (exit 2), never a
    crash the command line would report with the status of a violation."""
    fired: list[int] = []

    def broken_feed(self: TraceRecorder, calls: object) -> None:
        fired.append(1)
        raise AssertionError("an unmodelled corner")

    monkeypatch.setattr(TraceRecorder, "feed", broken_feed)
    root = tmp_path / "ckpts"
    with pytest.raises(AuditError, match="an unmodelled corner") as info:
        audit([*script(tmp_path, "naive.py", NAIVE), str(root)], "true", root=root)
    assert fired
    assert "\n" not in str(info.value)
    assert not root.exists()


def test_29_21_the_verdict_never_counts_more_failing_states_than_were_checked(
    tmp_path: Path,
) -> None:
    """29.21: every state failing: the verdict counts distinct states once, and per model
    out of that model's states."""
    root = tmp_path / "ckpts"
    report = audit([*script(tmp_path, "naive.py", NAIVE), str(root)], "false", root=root)
    assert report.checked < sum(report.states.values())  # the models share states
    assert report.failing == report.checked
    counted = re.search(r"BROKEN: (\d+) of (\d+) distinct", report.verdict)
    assert counted is not None, report.verdict
    assert counted.groups() == (str(report.checked), str(report.checked))
    for m in report.models:
        assert f"{m} {report.states[m]} of {report.states[m]}" in report.verdict
    assert report.to_dict()["failing"] == report.checked


EXCHANGE_FIFO = """\
import ctypes, os
os.makedirs("ckpts/1", exist_ok=True)
with open("ckpts/1/weights.bin", "wb") as f:
    f.write(b"w" * 4096)
os.mkfifo("ckpts/pipe")
libc = ctypes.CDLL(None, use_errno=True)
assert libc.renameat2(-100, b"ckpts/pipe", -100, b"ckpts/1/weights.bin", 2) == 0  # EXCHANGE
"""


def test_29_20_rename_exchange_with_a_fifo_is_judged_or_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """29.20: RENAME_EXCHANGE of a file with a FIFO: a verdict, or exit 2 in one line; never
    a traceback with the status of a violation."""
    run = cli(
        "audit", "--root", "ckpts", "--check", "test -s ckpts/1/weights.bin", "--",
        *script(tmp_path, "exchange.py", EXCHANGE_FIFO), cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr
    if run.returncode != 1:
        one_line_error(run)
    else:
        assert "BROKEN" in run.stdout
