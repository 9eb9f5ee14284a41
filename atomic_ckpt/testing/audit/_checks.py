"""Run the check on each crash state: a command (serial at the audited path, or in
parallel, each in a private mount namespace where the state is bind-mounted over that
path), or a Python function in a forked child of a process that imported it once."""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from atomic_ckpt.testing._states import _Flat
from atomic_ckpt.testing.audit._errors import AuditError
from atomic_ckpt.testing.audit._materialize import Materializer, remove
from atomic_ckpt.testing.audit._procs import children, end_group, end_orphans

Check = str | Sequence[str] | Callable[[Path], object]
"""A shell command line, an argv, or a function of the audited path that raises (or
returns False) to reject the state."""

_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_TAIL_LINES = 15
NOT_A_VERDICT = ".not-a-verdict"
"""Beside a check's output file: why the check function's return value was no verdict."""


@dataclass(frozen=True)
class Outcome:
    """How a check of one state ended."""

    status: int
    """Its exit status (non-zero: a violation); a signal N gives 128+N, a timeout 124."""
    output: str
    """The last lines of its stdout and stderr."""


def namespaces_available() -> bool:
    """Whether checks can run in private mount namespaces (root, ``unshare`` works)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


def tail(path: Path) -> str:
    """The last lines of a check's output file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-_TAIL_LINES:])


class Running:
    """A check in flight."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | None,
        pid: int | None,
        output: Path,
        deadline: float | None,
    ) -> None:
        self.popen = popen
        self.pid = pid
        self.output = output
        self.deadline = deadline
        self._status: int | None = None

    def poll(self) -> Outcome | None:
        """The outcome once it has ended (a timed-out check is killed: status 124)."""
        if self._status is None:
            self._status = self._poll_status()
            if self._status is not None:  # what it left running in its group ends with it
                end_group(self._pid)
        refused = Path(f"{self.output}{NOT_A_VERDICT}")
        if self._status is not None and refused.exists():
            raise AuditError(f"{refused.read_text()}; nothing was judged")
        if self._status is None and self.deadline is not None and time.monotonic() > self.deadline:
            self.kill()
            self._status = 124
            with open(self.output, "a") as f:
                f.write("\n[atomic-ckpt audit: the check timed out and was killed]\n")
        return None if self._status is None else Outcome(self._status, tail(self.output))

    def _poll_status(self) -> int | None:
        if self.popen is not None:
            code = self.popen.poll()
            return None if code is None else (128 - code if code < 0 else code)
        assert self.pid is not None
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    @property
    def _pid(self) -> int:
        pid = self.popen.pid if self.popen is not None else self.pid
        assert pid is not None
        return pid

    def kill(self) -> None:
        """Kill it and its children at once (SIGKILL to the session of its own it runs
        in, which no check can ignore), then reap it."""
        end_group(self._pid)
        if self.popen is not None:
            self.popen.wait()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, 0)


def start(
    check: Check,
    *,
    shown_at: Path,
    root: Path,
    output: Path,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout: float | None,
) -> Running:
    """Start ``check`` on the state shown at ``shown_at``, which it must see at ``root``
    (the same path when serial; a private mount namespace binds it there otherwise)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if callable(check):
        return Running(None, _fork(check, shown_at, root, output, cwd), output, deadline)
    argv = ["/bin/sh", "-c", check] if isinstance(check, str) else list(check)
    if shown_at != root:
        argv = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            'mount --bind "$0" "$1" && shift && exec "$@"',
            str(shown_at),
            str(root),
            *argv,
        ]
    with open(output, "wb") as out:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Running(popen, None, output, deadline)


def _fork(
    check: Callable[[Path], object], shown_at: Path, root: Path, output: Path, cwd: str | None
) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: never returns into the audit
        os.setsid()
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if shown_at != root:
            _bind_privately(shown_at, root)
        if cwd is not None:
            os.chdir(cwd)
        result = check(root)
        code = 1 if result is False else 0
        if result is False:
            print(f"check {getattr(check, '__name__', check)!r} returned False", file=sys.stderr)
        elif result is not True and result is not None:
            code = _not_a_verdict(check, result, output)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _not_a_verdict(check: Callable[[Path], object], result: object, output: Path) -> int:
    """A return value that is no verdict (a coroutine never awaited, a generator never
    iterated, an exit status) says nothing about the state: the reason is left beside
    ``output`` for the audit to refuse with (s15 attack: each was taken as a pass)."""
    name = getattr(check, "__name__", repr(check))
    what = type(result).__name__
    if inspect.iscoroutine(result) or inspect.isgenerator(result) or inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "never awaited" warning: it is refused, not forgotten
        hint = (
            "an async or generator check never runs: return the verdict from a plain "
            "function (call asyncio.run on the coroutine there)"
        )
    else:
        hint = "an exit status is no verdict: return False (or raise) to reject the state"
    why = f"the check function {name!r} returned a {what}, not True, False or None ({hint})"
    Path(f"{output}{NOT_A_VERDICT}").write_text(why)
    print(why, file=sys.stderr)
    return 1


def callable_with_root(check: Callable[[Path], object]) -> None:
    """Refuse (:class:`AuditError`) a check function that cannot be called with the root:
    every call would be a TypeError, a "violation" that says nothing about the save."""
    try:
        signature = inspect.signature(check)
    except (TypeError, ValueError):  # a builtin without a signature: let the call tell
        return
    try:
        signature.bind(Path("."))
    except TypeError as exc:
        name = getattr(check, "__name__", repr(check))
        raise AuditError(
            f"the check function {name!r}{signature} cannot be called with the audited "
            f"directory ({exc}); nothing was judged: give it one parameter, the path"
        ) from None


def _bind_privately(source: Path, target: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private failed")
    if libc.mount(os.fsencode(source), os.fsencode(target), None, _MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind-mounting {source} over {target} failed")


def run_checks(
    states: Sequence[_Flat],
    chosen: Sequence[int],
    check: Check,
    *,
    root: Path,
    scratch: Path,
    jobs: int,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    show: bool,
    times: Sequence[Mapping[str, int]] | None = None,
) -> dict[int, Outcome]:
    """Check the ``chosen`` states at ``root``, ``jobs`` at a time (each of several in a
    private mount namespace, its state bind-mounted over ``root``); outcome by index."""
    if jobs == 1:
        shows = [Materializer(root)]
    else:
        remove(root)
        root.mkdir()  # the mount point each private namespace binds its state over
        shows = [Materializer(scratch / f"state{j}") for j in range(jobs)]
    free = list(range(jobs))
    before = children()  # a caller's own children are never a check's orphans
    running: dict[int, tuple[Running, int]] = {}
    outcomes: dict[int, Outcome] = {}
    failing = 0

    def reap() -> None:
        nonlocal failing
        for slot, (r, i) in list(running.items()):
            outcome = r.poll()
            if outcome is not None:
                outcomes[i] = outcome
                failing += outcome.status != 0
                del running[slot]
                end_orphans({r._pid for r, _ in running.values()}, before)
                free.append(slot)
                if show:
                    print(
                        f"\ratomic-ckpt audit: checked {len(outcomes)}/{len(chosen)} states, "
                        f"{failing} failing",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )

    try:
        for i in chosen:
            while not free:
                reap()
                if not free:
                    time.sleep(0.002)
            slot = free.pop()
            shows[slot].show(states[i], times[i] if times is not None else None)
            running[slot] = (
                start(
                    check,
                    shown_at=shows[slot].target,
                    root=root,
                    output=scratch / f"check{slot}.log",
                    cwd=cwd,
                    env=env,
                    timeout=timeout,
                ),
                i,
            )
            if jobs == 1:  # the next state replaces this one at the same path
                while running:
                    reap()
                    if running:
                        time.sleep(0.001)
        while running:
            reap()
            if running:
                time.sleep(0.002)
    finally:
        for r, _ in running.values():
            r.kill()
        end_orphans((), before)
        if show:
            print(file=sys.stderr)
    return outcomes
