"""Real process kills (issue 3, point 3).

A child process (``_crash_child.py``) commits a seeded plan and reports each
commit that returned. The parent SIGKILLs it at moments Hypothesis chooses, at
every hooked call of atomic_ckpt._core.l2_syscalls.fs and every file write of the save (the
child kills itself there), and at every fsync, rename and renameat2 syscall
(``strace -e inject=SYSCALL:signal=SIGKILL:when=N``). Then, on the real
filesystem: every complete step holds exactly its seeded bytes (I1), every
reported commit is there (I2, I3), ``latest()`` is the highest (I4), a new
writer continues, and ``clean()`` removes the orphans.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from _real_support import (
    FACTS,
    FSYNCS,
    SOAK,
    STATS,
    check_root,
    continue_and_clean,
    new_dir,
    plan_of,
    random_steps,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow

CHILD = Path(__file__).with_name("_crash_child.py")
HOOK_STEPS = (1, 2, 1, 3)
"""new, new, replace of a step that is not the latest, new."""
SYSCALLS = ("fsync", "rename", "renameat2")
MODE = {"fsync": "plain", "rename": "fallback", "renameat2": "plain"}
"""The plan each syscall is killed in: a commit makes no plain rename(2) (the marker is
written in place, the promotion is renameat2); the move-aside replace makes two."""
WORKERS = 3
"""Children run concurrently: each spends most of its life starting Python or in fsync."""


@dataclass
class Run:
    """What a child reported before it exited or was killed."""

    returncode: int
    lines: list[str]
    stderr: str

    @property
    def returned(self) -> int:
        """How many saves' commits returned (the child commits them in order)."""
        return sum(1 for line in self.lines if line.startswith("ok "))

    def hooks(self) -> list[str]:
        return [line for line in self.lines if line.startswith("hook ")]


def child_cmd(root: Path, seed: int, steps: Sequence[int], *extra: str) -> list[str]:
    steps_arg = ",".join(map(str, steps))
    return [
        sys.executable,
        str(CHILD),
        str(root),
        "--seed",
        str(seed),
        "--steps",
        steps_arg,
        *extra,
    ]


def child_env() -> dict[str, str]:
    # No .pyc writes: they would add renames that strace counts.
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def run(cmd: list[str]) -> Run:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False)
    return Run(proc.returncode, proc.stdout.splitlines(), proc.stderr)


def in_parallel(jobs: Sequence[Callable[[], None]]) -> None:
    """Run ``jobs`` a few at a time; the first failure cancels the rest and is re-raised."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def recover(
    root: Path,
    seed: int,
    steps: Sequence[int],
    r: Run,
    *,
    single: bool = False,
    window: bool = False,
) -> None:
    """Check I1-I4 after a kill, then continue with a new writer and clean().

    ``window``: the fallback replace was in use, so a replaced step may be
    missing until clean() renames its old copy back (the documented window);
    after that clean(), I2 and I3 must hold again.
    """
    plan = plan_of(list(steps))
    check_root(root, seed, plan, r.returned, single=single, window=window)
    if window:
        new_dir(root, single=single).clean()
        check_root(root, seed, plan, r.returned, single=single)
    continue_and_clean(root, seed, plan, r.returned, single=single)


# ------------------------------------------------------------------ the hook


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "fallback"])
def test_sigkill_at_every_hooked_call(tmp_path: Path, fallback: bool, root_prefix: str) -> None:
    """SIGKILL before and after every _fs call and save write: I1-I4 hold, clean() tidies
    (plain roots, staging ``N.tmp-<hex>``, and prefixed ones, ``.tmp-<prefix>N.<hex>``).

    An fsync changes nothing a process kill can see, so by default the kills
    fall around every other call (each rename, marker write, removal, mkdir -p
    and file of the save); ``ATOMIC_CKPT_SOAK=1`` kills around the fsyncs too.
    """
    seed = 3
    extra = ("--fallback",) if fallback else ()
    rec = run(child_cmd(tmp_path / "record", seed, HOOK_STEPS, "--record", *extra))
    assert rec.returncode == 0, rec.stderr
    assert rec.lines[-1] == "done"
    events = {
        int(line.split()[1]): line.split()[2] for line in rec.lines if line.startswith("event ")
    }
    assert {"fsync_file", "fsync_dir", "write_file_durable", "rename_noreplace"} <= {
        *events.values()
    }
    assert "rename" in events.values() if fallback else "rename_exchange" in events.values()
    returned = {int(line.split()[1]) for line in rec.lines if line.startswith("returned ")}
    chosen = [n for n, name in events.items() if SOAK or name not in FSYNCS]
    names = {events[n] for n in chosen}
    points = [(n, "before") for n in chosen] + [(n, "after") for n in chosen if n in returned]
    fired: list[str] = []

    def one(n: int, when: str) -> Callable[[], None]:
        def job() -> None:
            root = tmp_path / f"{n}-{when}"
            kill = ("--kill-at", str(n), "--kill-when", when)
            r = run(child_cmd(root, seed, HOOK_STEPS, *kill, *extra))
            assert r.returncode == -signal.SIGKILL, f"kill at {n} {when}: {r.stderr}"
            assert [h.split()[1] for h in r.hooks()] == [str(n)], r.lines
            fired.append(r.hooks()[0].split()[2])
            recover(root, seed, HOOK_STEPS, r, window=fallback)
            shutil.rmtree(root)

        return job

    in_parallel([one(n, when) for n, when in points])
    assert len(fired) == len(points)
    assert set(fired) == names, "every kind of call was killed at"
    STATS["kills survived: hook in child (_fs calls and save writes)"] += len(points)
    FACTS[f"hook kill points per run ({'fallback' if fallback else 'exchange'})"] = (
        f"{len(events)} calls, {len(chosen)} chosen: {len(points)} kills (before each, "
        "and after each that returns)"
    )


# ------------------------------------------------------------------ strace


def strace_cmd(log: Path, inject: str | None) -> list[str]:
    cmd = ["strace", "-f", "-q", "-e", "signal=none", "-o", str(log)]
    cmd += ["-e", "trace=" + ",".join((*SYSCALLS, "renameat"))]
    if inject:
        cmd += ["-e", f"inject={inject}"]
    return cmd


def syscalls_of(log: Path, name: str) -> list[str]:
    """The lines of strace's log for the syscall ``name``, in order."""
    pattern = re.compile(rf"^\d+\s+{name}\(")
    return [line.rstrip() for line in log.read_text().splitlines() if pattern.match(line)]


def mode_args(mode: str) -> tuple[str, ...]:
    return ("--single", "--fallback") if mode == "fallback" else ("--single",)


@pytest.fixture(scope="module")
def strace_counts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, int]]:
    """How many of each syscall one run of the single-threaded plan makes (under strace),
    with RENAME_EXCHANGE (``plain``) and without it (``fallback``)."""
    if shutil.which("strace") is None:
        pytest.skip("strace not installed (apt-get install strace)")
    counts: dict[str, dict[str, int]] = {}
    for mode in ("plain", "fallback"):
        tmp = tmp_path_factory.mktemp(f"strace-record-{mode}")
        log = tmp / "log"
        cmd = strace_cmd(log, None) + child_cmd(tmp / "root", 5, HOOK_STEPS, *mode_args(mode))
        r = run(cmd)
        if r.returncode != 0 and "ptrace" in r.stderr:
            pytest.skip(f"strace cannot trace here: {r.stderr.strip()}")
        assert r.returncode == 0, r.stderr
        assert r.lines[-1] == "done"
        counts[mode] = {name: len(syscalls_of(log, name)) for name in SYSCALLS}
    return counts


@pytest.mark.parametrize("syscall", SYSCALLS)
def test_sigkill_at_every_syscall_with_strace(
    tmp_path: Path, strace_counts: dict[str, dict[str, int]], syscall: str
) -> None:
    """strace delivers SIGKILL at the Nth fsync/rename/renameat2, for every N: I1-I4 hold."""
    mode = MODE[syscall]
    count = strace_counts[mode][syscall]
    # 4 commits: file, marker, staging dir and root fsync each; a NOREPLACE rename
    # each and one EXCHANGE; without EXCHANGE, the replace moves the old copy aside
    # with rename(2) (and the first NOREPLACE attempt of the replace fails first).
    assert count >= {"fsync": 16, "rename": 1, "renameat2": 5}[syscall], strace_counts

    def one(n: int) -> Callable[[], None]:
        def job() -> None:
            root, log = tmp_path / f"root-{n}", tmp_path / f"log-{n}"
            inject = f"{syscall}:signal=SIGKILL:when={n}"
            cmd = strace_cmd(log, inject) + child_cmd(root, 5, HOOK_STEPS, *mode_args(mode))
            r = run(cmd)
            assert r.returncode == -signal.SIGKILL, f"{inject}: {r.returncode} {r.stderr}"
            calls = syscalls_of(log, syscall)
            assert len(calls) == n, f"{inject} fired at call {len(calls)}"
            assert calls[-1].endswith("= ?"), f"{inject}: call {n} returned: {calls[-1]}"
            recover(root, 5, HOOK_STEPS, r, single=True)
            shutil.rmtree(root)

        return job

    in_parallel([one(n) for n in range(1, count + 1)])
    STATS[f"kills survived: strace inject on {syscall}"] += count


# ------------------------------------------------------------------ timed kills


@pytest.fixture(scope="module")
def plan_seconds(tmp_path_factory: pytest.TempPathFactory) -> float:
    """How long an unkilled child takes for an 8-save plan (to scale the kill moments)."""
    root = tmp_path_factory.mktemp("calibrate") / "ckpts"
    cmd = child_cmd(root, 1, random_steps(1, 8))
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env()) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        start = time.monotonic()
        proc.communicate()
    assert proc.returncode == 0
    return max(time.monotonic() - start, 0.005)


@settings(
    max_examples=300 if SOAK else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 8),
    moment=st.floats(0.0, 1.1),
    fallback=st.booleans(),
)
def test_sigkill_at_a_chosen_moment(
    tmp_path_factory: pytest.TempPathFactory,
    plan_seconds: float,
    *,
    seed: int,
    n: int,
    moment: float,
    fallback: bool,
) -> None:
    """SIGKILL a child committing a random plan at a Hypothesis-chosen moment: I1-I4 hold."""
    root = tmp_path_factory.mktemp("timed") / "ckpts"
    steps = random_steps(seed, n)
    cmd = child_cmd(root, seed, steps, *(("--fallback",) if fallback else ()))
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        time.sleep(moment * plan_seconds * n / 8)
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
    r = Run(proc.returncode, out.splitlines(), err)
    assert r.returncode in (0, -signal.SIGKILL), err
    recover(root, seed, steps, r, window=fallback)
    STATS["kills: timed (Hypothesis)"] += 1
    if r.returncode == -signal.SIGKILL and r.lines[-1:] != ["done"]:
        STATS["kills survived: timed, mid-plan (Hypothesis)"] += 1
    shutil.rmtree(root.parent)
