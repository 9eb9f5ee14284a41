"""Issue 29, the runner's half: the audit never loses or changes the user's data, never
judges a recording it did not make, and ends every process it started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _audit_scripts import NAIVE, RESUME, check_script, needs_strace, script

from atomic_ckpt.testing import audit
from atomic_ckpt.testing.audit import AuditError
from atomic_ckpt.testing.audit._checks import namespaces_available
from atomic_ckpt.testing.audit._materialize import aside_path

pytestmark = needs_strace

ONE_SAVE = """\
import os, sys
os.makedirs(os.path.join(sys.argv[1], "1"), exist_ok=True)
with open(os.path.join(sys.argv[1], "1", "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
"""


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs once a SIGKILL sent to it had time to land (it is
    delivered asynchronously: a loaded machine may take a moment to end the process)."""
    deadline = time.monotonic() + 20
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running(pid)


def test_29_2_an_audit_that_records_nothing_under_the_root_refuses(tmp_path: Path) -> None:
    """29.2: --root ckpt while the workload writes ckpts/ (a typo): no verdict, AuditError."""
    workload = [*script(tmp_path, "one.py", ONE_SAVE), str(tmp_path / "ckpts")]
    with pytest.raises(AuditError, match="holds no operation under"):
        audit(workload, "true", root=tmp_path / "ckpt")


def test_29_2_a_relative_root_is_the_workloads_cwd(tmp_path: Path) -> None:
    """29.2: root='ckpts' with cwd=W audits W/ckpts, where the workload writes."""
    work = tmp_path / "work"
    work.mkdir()
    naive = script(tmp_path, "naive.py", NAIVE)
    resume = [*check_script(tmp_path, "resume.py", RESUME), "ckpts"]
    report = audit([*naive, "ckpts"], resume, root="ckpts", cwd=work, models=["kill"], max_states=4)
    assert report.operations > 0
    assert not report.ok
    assert not (work / "ckpts").exists()


def test_29_15_a_workload_that_wipes_the_roots_parent_cannot_reach_the_original(
    tmp_path: Path,
) -> None:
    """29.15: the original is parked where no workload writes, not next to the root."""
    out = tmp_path / "out"
    root = out / "ckpts"
    (root / "7").mkdir(parents=True)
    (root / "7" / "weights.bin").write_bytes(b"original")
    wipe = (
        "import os, shutil, sys\n"
        "out = os.path.dirname(sys.argv[1])\n"
        "for name in os.listdir(out):\n"
        "    if name != 'ckpts':\n"
        "        p = os.path.join(out, name)\n"
        "        shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)\n"
    ) + ONE_SAVE
    audit([*script(tmp_path, "wipe.py", wipe), str(root)], "true", root=root, models=["kill"])
    assert sorted(os.listdir(root)) == ["7"]
    assert (root / "7" / "weights.bin").read_bytes() == b"original"
    assert aside_path(root).parent != out


def test_29_16_a_check_that_makes_the_root_a_symlink_never_writes_through_it(
    tmp_path: Path,
) -> None:
    """29.16: crash states are never written through a symlink at the root or inside it."""
    root = tmp_path / "ckpts"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    turned = tmp_path / "turned"
    turned.mkdir()

    def check(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink():
            path.unlink()
        os.symlink(victim, path)
        (turned / str(os.getpid())).touch()

    audit([*script(tmp_path, "naive.py", NAIVE), str(root)], check, root=root)
    assert len(os.listdir(turned)) > 2  # the check did turn the root into a link, often
    assert os.listdir(victim) == ["precious"]
    assert (victim / "precious").read_text() == "keep me"
    assert not os.path.lexists(root)


def test_29_16_a_symlink_a_check_puts_inside_the_state_is_not_followed(tmp_path: Path) -> None:
    """29.16: a check that replaces a step directory with a link elsewhere: nothing there
    is written or removed."""
    root = tmp_path / "ckpts"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "weights.bin").write_text("keep me")

    def check(path: Path) -> None:
        step = path / "1"
        if step.is_dir() and not step.is_symlink():
            shutil.rmtree(step)
            os.symlink(victim, step)

    audit([*script(tmp_path, "naive.py", NAIVE), str(root)], check, root=root, models=["kill"])
    assert os.listdir(victim) == ["weights.bin"]
    assert (victim / "weights.bin").read_text() == "keep me"


@pytest.mark.parametrize("kind", ["command", "function"])
def test_29_17_processes_a_check_starts_end_with_it(tmp_path: Path, kind: str) -> None:
    """29.17: a check that leaves a background process behind: it is ended with the check."""
    pids = tmp_path / "pids"
    pids.mkdir()
    if kind == "command":
        check: object = f"sleep 300 & echo $! > {pids}/$$"
    else:

        def check(path: Path) -> None:
            child = subprocess.Popen(["sleep", "300"])
            (pids / str(os.getpid())).write_text(str(child.pid))

    root = tmp_path / "ckpts"
    audit([*script(tmp_path, "one.py", ONE_SAVE), str(root)], check, root=root)  # type: ignore[arg-type]
    left = [int(p.read_text()) for p in pids.iterdir()]
    assert left
    assert [pid for pid in left if alive(pid)] == []


def _slow_audit(tmp_path: Path, root: Path, started: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", str(root),
         "--check", f"touch {started} && sleep 120", "--",
         *script(tmp_path, "one.py", ONE_SAVE), str(root)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)


def test_29_18_a_second_audit_of_a_root_that_does_not_exist_yet_is_refused(
    tmp_path: Path,
) -> None:
    """29.18: two audits of one not-yet-existing root: the second refuses; none is left."""
    root = tmp_path / "ckpts"
    started = tmp_path / "started"
    first = _slow_audit(tmp_path, root, started)
    try:
        _wait_for(started, first)
        assert root.is_dir()  # the first audit shows a crash state there
        with pytest.raises(AuditError, match="another audit"):
            audit([*script(tmp_path, "one.py", ONE_SAVE), str(root)], "true", root=root)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 2
    assert not os.path.lexists(root)


@pytest.mark.skipif(not namespaces_available(), reason="needs root and unshare -m to mount")
def test_29_19_a_root_that_is_a_mount_point_is_refused_clearly(tmp_path: Path) -> None:
    """29.19: a mount point cannot be moved aside: exit 2 saying so, no raw EBUSY."""
    root = tmp_path / "ckpts"
    root.mkdir()
    one = script(tmp_path, "one.py", ONE_SAVE)
    inner = " ".join(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", str(root), "--check",
         "true", "--", *one, str(root)]
    )  # fmt: skip
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
         f"mount -t tmpfs tmpfs {root} && {inner}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "mount point" in run.stderr
    assert "Errno" not in run.stderr


def test_29_23_a_workload_leaving_a_daemon_is_bounded_and_named(tmp_path: Path) -> None:
    """29.23: record_timeout ends a recording a detached daemon keeps open, naming it."""
    pidfile = tmp_path / "daemon.pid"
    daemon = ONE_SAVE + (
        "import subprocess\n"
        "d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True)\n"
        f"open('pid.tmp', 'w').write(str(d.pid))\nos.replace('pid.tmp', {str(pidfile)!r})\n"
    )
    root = tmp_path / "ckpts"
    with pytest.raises(AuditError, match="still running") as info:
        audit([*script(tmp_path, "daemon.py", daemon), str(root)], "true", root=root,
              record_timeout=5)  # fmt: skip
    pid = int(pidfile.read_text())
    assert f"pid {pid}" in str(info.value)
    assert "time.sleep(300)" in str(info.value)
    assert not alive(pid)
    assert not os.path.lexists(root)


def test_29_24_an_interrupt_while_recording_ends_the_workload_and_restores(
    tmp_path: Path,
) -> None:
    """29.24: SIGTERM while the workload is recorded: the workload ends with the audit and
    cannot write into the directory after it was put back."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "keep").write_text("original")
    pidfile = tmp_path / "workload.pid"
    slow = ONE_SAVE + (
        f"import time\nopen('pid.tmp', 'w').write(str(os.getpid()))\n"
        f"os.replace('pid.tmp', {str(pidfile)!r})\ntime.sleep(300)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", str(root), "--check",
         "true", "--", *script(tmp_path, "slow.py", slow), str(root)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for(pidfile, run)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    assert not alive(int(pidfile.read_text()))
    assert os.listdir(root) == ["keep"]
