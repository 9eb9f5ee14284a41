"""The processes an audit starts: run one bounded in a session of its own, name what is
still running, and end a whole process tree (its group and every process it traces)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from typing import IO

from atomic_ckpt.testing.audit._errors import AuditError


def traced_by(tracer: int) -> list[int]:
    """The processes ``tracer`` (strace) traces: every process of the recorded workload,
    also those that left its session (a daemon) and were reparented away."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    if int(line.split()[1]) == tracer:
                        found.append(int(entry))
                    break
    return sorted(found)


def describe(pid: int) -> str:
    """``pid 123 (python daemon.py)``: a process as a message names it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    return f"pid {pid} ({' '.join(argv)[:200] or 'exited'})"


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def adopt_orphans() -> None:
    """Make this process the subreaper of what it starts (Linux): a daemon a check starts
    in a session of its own (setsid, double fork) is reparented to the audit, not to init,
    so :func:`end_orphans` can end it (s15 attack: one deleted the user's checkpoints after
    the original was put back). The command line calls it; a program that calls
    :func:`audit` may, knowing that its own orphans are reparented to it from then on."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _subreaper() -> bool:
    flag = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(
            flag.value
        )
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{entry}/stat") as f,
            ):
                found[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
    return found


def children() -> set[int]:
    """The processes whose parent this process is now."""
    me = os.getpid()
    return {pid for pid, ppid in _parents().items() if ppid == me}


def end_orphans(keep: Collection[int], before: Collection[int]) -> None:
    """SIGKILL (and reap) every descendant of this process, a subreaper, but the trees of
    ``keep`` (the checks still running) and of ``before`` (children it had already): what
    an ended check left running, reparented here. Without a subreaper, nothing."""
    if not _subreaper():
        return
    me = os.getpid()
    for _ in range(100):  # until none is left: one may fork while the others are killed
        parents = _parents()
        below: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            below.setdefault(ppid, []).append(pid)
        todo = [p for p in below.get(me, []) if p not in keep and p not in before]
        found = []
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(below.get(pid, []))
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in found:
            if parents.get(pid) == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def end_group(pgid: int, also: Sequence[int] = ()) -> None:
    """SIGKILL the process group ``pgid`` and the processes ``also`` (which may have left
    it). SIGKILL cannot be ignored or handled: nothing of the tree runs on afterwards."""
    for pid in also:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_traced(
    cmd: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdout: IO[bytes] | None,
    timeout: float | None,
) -> int:
    """Run the strace command line ``cmd`` to its end and return its exit status.

    It runs in a session of its own, so that a Ctrl-C or SIGTERM of the audit (any
    exception while waiting), or ``timeout`` seconds passing, ends strace and every
    process it traces instead of leaving the workload writing into the audited
    directory after it was put back. Past ``timeout``, :class:`AuditError` names the
    processes still running (a daemon the workload left, typically).
    """
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=None if stdout is None else subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = traced_by(proc.pid)
        names = ", ".join(describe(p) for p in left) or "none that strace still traces"
        end_group(proc.pid, left)
        proc.wait()
        raise AuditError(
            f"the workload was still running after --record-timeout {timeout:g} s; still "
            f"running: {names}. A process the workload leaves behind (a metrics uploader, "
            f"a TensorBoard server) keeps the recording open: stop it at the end of the "
            f"workload, or raise the bound. They were killed; nothing was judged"
        ) from None
    except BaseException:
        end_group(proc.pid, traced_by(proc.pid))
        proc.wait()
        raise
