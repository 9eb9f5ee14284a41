"""atomic-ckpt audit on the command line: exit codes, JSON, DIR put back when interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _audit_scripts import COMMITTED, NAIVE, RESUME, check_script, needs_strace, script

from atomic_ckpt.testing.audit._checks import namespaces_available
from atomic_ckpt.testing.audit._materialize import aside_path

pytestmark = needs_strace


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``atomic-ckpt ARGS`` with this checkout's atomic_ckpt."""
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@dataclass(frozen=True)
class _Naive:
    cwd: Path
    run: subprocess.CompletedProcess[str]
    report: dict[str, Any]


@pytest.fixture(scope="module")
def naive_serial(tmp_path_factory: pytest.TempPathFactory) -> _Naive:
    """The naive save audited on the command line with a command check and --json, one
    check at a time (the default), once for the tests that read the result (read-only)."""
    cwd = tmp_path_factory.mktemp("naive")
    naive = script(cwd, "naive.py", NAIVE)
    resume = check_script(cwd, "resume.py", RESUME)
    out = cwd / "report.json"
    run = cli(
        "audit", "--root", "ckpts", "--check", " ".join([*resume, "ckpts"]),
        "--json", str(out), "--", *naive, "ckpts",
        cwd=cwd,
    )  # fmt: skip
    return _Naive(cwd, run, json.loads(out.read_text()) if out.exists() else {})


def test_violations_exit_1_and_the_json_has_states_violations_and_operations(
    naive_serial: _Naive,
) -> None:
    """A naive save: exit 1, and --json FILE holds states per model and each violation's model."""
    run = naive_serial.run
    assert run.returncode == 1, run.stderr
    assert "BROKEN" in run.stdout
    assert "[kill] crash after operation" in run.stdout
    report = naive_serial.report
    assert set(report["states"]) == {"kill", "power"}
    assert report["states"]["kill"] > 0
    assert report["operations"] > 0
    assert report["violations"]
    assert {v["model"] for v in report["violations"]} == {"kill", "power"}
    assert all(isinstance(v["listing"], list) for v in report["violations"])
    assert set(report["timings"]) == {"record", "build", "checks"}
    assert not (naive_serial.cwd / "ckpts").exists()


def test_a_clean_audit_exits_0(tmp_path: Path) -> None:
    """commit() saves, checked by a forked Python function (--check-python): exit 0."""
    (tmp_path / "audit_resume_check.py").write_text(
        "from pathlib import Path\n"
        "from atomic_ckpt import CheckpointDir\n"
        "def check(root: Path) -> bool:\n"
        "    latest = CheckpointDir(root).latest()\n"
        "    return latest is None or (latest.path / 'weights.bin').read_bytes()"
        " == bytes([latest.step]) * 4096\n"
    )
    committed = script(tmp_path, "committed.py", COMMITTED)
    run = cli(
        "audit", "--root", "ckpts", "--check-python", "audit_resume_check:check",
        "--models", "kill,power", "--", *committed, "ckpts",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "clean: all " in run.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--root", "ckpts", "--check", "true"], "give the workload after --"),
        (["--root", "ckpts", "--check", "true", "--models", "kill,flood", "--", "true"], "choose"),
        (["--root", "ckpts", "--check", "true", "--", "false"], "exited with status 1"),
    ],
    ids=["no-workload", "bad-model", "workload-fails"],
)
def test_usage_errors_and_a_failing_workload_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """No workload, an unknown model, a workload that fails while recorded: exit 2, said why."""
    run = cli("audit", *args, cwd=tmp_path)
    assert run.returncode == 2
    assert message in run.stderr


def test_missing_strace_exits_2_saying_how_to_install_it(tmp_path: Path) -> None:
    """Without strace on PATH: exit 2, and the message names apt-get install strace."""
    env = {**os.environ, "PATH": str(tmp_path)}
    (tmp_path / "python").symlink_to(sys.executable)
    run = cli("audit", "--root", "ckpts", "--check", "true", "--", "true", cwd=tmp_path, env=env)
    assert run.returncode == 2
    assert "apt-get install strace" in run.stderr


def test_a_write_strace_cannot_see_exits_2_naming_the_file(tmp_path: Path) -> None:
    """A file written through mmap without msync: exit 2 naming it, no verdict."""
    workload = script(
        tmp_path,
        "mapped_write.py",
        "import mmap, os, sys\n"
        "os.makedirs('ckpts/1')\n"
        "fd = os.open('ckpts/1/model.bin', os.O_RDWR | os.O_CREAT, 0o644)\n"
        "os.ftruncate(fd, 8192)\n"
        "m = mmap.mmap(fd, 8192)\n"
        "m[100:104] = b'data'\n",
    )
    run = cli("audit", "--root", "ckpts", "--check", "true", "--", *workload, cwd=tmp_path)
    assert run.returncode == 2
    assert "cannot rebuild" in run.stderr
    assert "1/model.bin" in run.stderr
    assert "clean" not in run.stdout


# The audit's command line, with SIGINT delivered as a terminal's Ctrl-C is, whatever this
# suite inherited: a shell starts a background job (`.ci/run &`) with SIGINT ignored, an
# ignored signal stays ignored across exec, and the audit (rightly) keeps it so; the test
# would then wait out the check's `sleep 60`.
CTRL_C_ABLE_CLI = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'atomic-ckpt'; runpy.run_module('atomic_ckpt.cli', run_name='__main__')"
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_audit_puts_dir_back(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C or SIGTERM while a check runs: DIR holds its original contents again, exit 2."""
    root = tmp_path / "ckpts"
    (root / "7").mkdir(parents=True)
    (root / "7" / "meta.json").write_text("original")
    naive = script(tmp_path, "naive.py", NAIVE)
    started = tmp_path / "started"
    check = f"touch {started} && sleep 60"
    audit = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_ABLE_CLI, "audit", "--root", str(root),
         "--check", check, "--", *naive, str(root)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not started.exists():
        assert audit.poll() is None, audit.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert aside_path(root).is_dir()  # the original is parked out of reach
    audit.send_signal(sig)
    _, err = audit.communicate(timeout=60)
    assert audit.returncode == 2, err
    assert "interrupted" in err
    assert sorted(os.listdir(root)) == ["7"]
    assert os.listdir(root / "7") == ["meta.json"]
    assert (root / "7" / "meta.json").read_text() == "original"
    assert [p.name for p in tmp_path.iterdir() if "audit" in p.name] == []


@pytest.mark.skipif(not namespaces_available(), reason="needs root and unshare -m")
def test_parallel_checks_in_mount_namespaces_find_what_serial_checks_find(
    naive_serial: _Naive, tmp_path: Path
) -> None:
    """--jobs 2: each check sees its state at DIR in a private namespace; same verdicts
    (as the serial run of the same scripts, naive_serial, found)."""
    assert naive_serial.run.returncode == 1, naive_serial.run.stderr
    naive = script(tmp_path, "naive.py", NAIVE)
    resume = " ".join([*check_script(tmp_path, "resume.py", RESUME), "ckpts"])
    out = tmp_path / "r2.json"
    run = cli(
        "audit", "--root", "ckpts", "--check", resume, "--jobs", "2", "--json", str(out),
        "--", *naive, "ckpts",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    serial, parallel = naive_serial.report, json.loads(out.read_text())
    assert [n for n in parallel["notes"] if not n.startswith("power:")] == []
    assert parallel["states"] == serial["states"]
    key = [(v["model"], v["crash_point"], v["survived"]) for v in serial["violations"]]
    assert [(v["model"], v["crash_point"], v["survived"]) for v in parallel["violations"]] == key
