"""The audit: record a workload once, refuse if the recording cannot rebuild what it left,
then check every distinct crash state of each model at the audited path."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atomic_ckpt.testing._results import AUDIT_MODELS
from atomic_ckpt.testing._sparse import Data, all_zero, load, text
from atomic_ckpt.testing._sparse import digest as data_digest
from atomic_ckpt.testing._states import _Candidate, _CrashModel, _Flat
from atomic_ckpt.testing.audit._checks import (
    Check,
    Outcome,
    callable_with_root,
    namespaces_available,
    run_checks,
    tail,
)
from atomic_ckpt.testing.audit._errors import AuditError, CannotRebuild, WorkloadFailed
from atomic_ckpt.testing.audit._guards import check_root, check_workdir
from atomic_ckpt.testing.audit._materialize import (
    copy_original,
    hard_linked,
    refuse_long_paths,
    refuse_special,
    set_aside,
    walk_tree,
)
from atomic_ckpt.testing.audit._private import private_dir
from atomic_ckpt.testing.audit._report import AuditReport, Violation
from atomic_ckpt.testing.audit._strace import read_calls, record_command, strace_path
from atomic_ckpt.testing.audit._times import before_the_run, mtimes, state_times
from atomic_ckpt.testing.audit._trace import TraceRecorder
from atomic_ckpt.testing.audit._trace._links import links_out

POWER_SAMPLING = (
    "power: each unsynced write's fate is its own (one-file and one-write deviations built "
    "in full, 8 writes per file at most; then 16 random mixes per crash point drawn with "
    "seed {seed}; other mixes unchecked)"
)

_CONTEXT = 4


@dataclass
class _State:
    flat: _Flat
    by_model: dict[str, _Candidate] = field(default_factory=dict)
    persisted: Collection[int] = ()
    """The operations the state was built from (the first candidate's)."""
    times: dict[str, int] = field(default_factory=dict)
    """Each path's mtime (ns) when shown (:mod:`._times`)."""


def audit(
    workload: str | Sequence[str],
    check: Check,
    *,
    root: str | os.PathLike[str],
    models: Sequence[str] = AUDIT_MODELS,
    max_states: int | None = None,
    seed: int = 0,
    jobs: int = 1,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    progress: bool | None = None,
    record_timeout: float | None = None,
) -> AuditReport:
    """Audit the crash consistency of ``workload``'s checkpoints under ``root``.

    Runs ``workload`` (an argv, or a shell command line) once under ``strace``, recording
    every filesystem operation any of its processes make under ``root``; rebuilds the
    tree as a crash would leave it at every operation boundary under each of ``models``
    (``kill``, ``power``); shows each distinct state at ``root`` itself (the original is
    set aside and put back afterwards, also on Ctrl-C or SIGTERM) and runs ``check`` on
    it: a shell command line or argv that exits non-zero to reject the state, or a
    function of the root path that raises (or returns False), run in a forked child of
    this process so that its imports are paid once. Returns the :class:`AuditReport`.

    ``max_states`` samples that many distinct states (seeded by ``seed``) when there are
    more; ``jobs`` runs that many checks at once, each in a private mount namespace (as
    root; otherwise serially, with a note); ``timeout`` bounds each check (seconds);
    ``record_timeout`` the recorded run (a daemon it leaves keeps the recording open).
    A relative ``root`` is taken relative to ``cwd`` (the workload's working directory).

    Raises :class:`AuditError` when nothing can be judged: strace missing
    (:class:`StraceNotFound`), the recorded run failing (:class:`WorkloadFailed`), or a
    recording that does not rebuild the tree the workload left (:class:`CannotRebuild`),
    one that holds no operation under ``root``, another audit of ``root`` running, a
    mount point at ``root``.
    """
    strace_path()
    unknown = [m for m in models if m not in AUDIT_MODELS]
    if unknown or not models:
        raise ValueError(f"models must be a non-empty subset of {AUDIT_MODELS}, not {models}")
    if jobs < 1 or (max_states is not None and max_states < 1):
        raise ValueError("jobs and max_states must be at least 1")
    models = tuple(m for m in AUDIT_MODELS if m in models)
    workdir = None if cwd is None else os.path.abspath(cwd)
    # a relative root names the directory the workload writes: relative to its cwd
    path = Path(os.path.normpath(os.path.join(workdir or os.getcwd(), root)))
    if not path.parent.is_dir():
        raise AuditError(f"the parent of the audited directory, {path.parent}, does not exist")
    check_root(path)
    if callable(check):
        callable_with_root(check)  # s15 attack: no parameter made every state "broken"
    check_workdir(path, workdir)  # issue 29 attack 03: a cwd inside root runs in the original
    argv = ["/bin/sh", "-c", workload] if isinstance(workload, str) else list(workload)
    show = sys.stderr.isatty() if progress is None else progress
    timings: dict[str, float] = {}
    notes: list[str] = []
    with set_aside(path) as original:
        scratch = Path(tempfile.mkdtemp(prefix=f"{path.name}.", dir=private_dir(path.parent)))
        try:
            if original is not None:
                if not original.is_dir() or original.is_symlink():
                    raise AuditError(f"{path} is not a directory")
                refuse_special(original, os.fspath(root))  # attack of main 1: a FIFO
                refuse_long_paths(original, path)  # round 15: copied by path
                linked = hard_linked(original)  # issue 29.6/29.12: a copy would split them
                if linked:
                    raise CannotRebuild(
                        os.fspath(root), [(p, "hard-linked (more than one name)") for p in linked]
                    )
                copy_original(original, path)
            began = time.monotonic()
            with _judging(path):
                recorder = TraceRecorder(path)  # the tree the workload starts from
                started, clock = mtimes(path), time.time_ns()
            if workdir is not None:
                recorder._start_cwd = workdir
            log = scratch / "workload.log"
            status = record_command(
                argv, scratch / "trace", cwd=workdir, env=env, output=log, timeout=record_timeout
            )
            if status != 0:
                raise WorkloadFailed(status, tail(log))
            timings["record"] = time.monotonic() - began
            began = time.monotonic()
            with _judging(path):
                model, states, distinct = _replay(recorder, path, scratch / "trace", models, seed)
                initial = before_the_run(model, started)
                for s in states:  # round 15: mtimes in the workload's order
                    s.times = state_times(model, s.persisted, initial, clock)
            (scratch / "trace").unlink()
            if "power" in models:  # issue 29.1: say how the power fates were sampled
                notes.append(POWER_SAMPLING.format(seed=seed))
            chosen = list(range(len(states)))
            sampled = None
            if max_states is not None and len(states) > max_states:
                chosen = sorted(random.Random(seed).sample(chosen, max_states))
                sampled = (
                    f"{max_states} of {len(states)} distinct states checked, chosen at random "
                    f"with seed {seed} (max_states); the rest were not checked"
                )
            timings["build"] = time.monotonic() - began
            began = time.monotonic()
            _check_the_end(model, check, path, scratch, timeout=timeout, cwd=workdir, env=env)
            if jobs > 1 and not namespaces_available():
                notes.append(
                    f"jobs={jobs} needs root and unshare (private mount namespaces); "
                    "the checks ran one at a time"
                )
                jobs = 1
            outcomes = run_checks(
                [s.flat for s in states],
                chosen,
                check,
                root=path,
                scratch=scratch,
                jobs=jobs,
                timeout=timeout,
                cwd=workdir,
                env=env,
                show=show,
                times=[s.times for s in states],
            )
            timings["checks"] = time.monotonic() - began
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    violations = [
        _violation(model, states[i], m, outcomes[i])
        for m in models
        for i in chosen
        if outcomes[i].status != 0 and m in states[i].by_model
    ]
    violations.sort(key=lambda v: (models.index(v.model), v.crash_point))
    checked = {m: sum(1 for i in chosen if m in states[i].by_model) for m in models}
    return AuditReport(
        root=os.fspath(root),
        models=models,
        operations=len(model.ops),
        calls=recorder.calls,
        boundaries=dict.fromkeys(models, len(model.ops) + 1),
        states=checked,
        distinct=distinct,
        checked=len(chosen),
        violations=tuple(violations),
        timings=timings,
        sampled=sampled,
        notes=tuple(notes),
        failing=sum(1 for i in chosen if outcomes[i].status != 0),
    )


def _replay(
    recorder: TraceRecorder, path: Path, trace: Path, models: Sequence[str], seed: int
) -> tuple[_CrashModel, list[_State], dict[str, int]]:
    """Replay the recording; refuse (:class:`AuditError`) when it does not rebuild the
    tree the workload left or holds no operation under ``path``."""
    recorder.feed(read_calls(trace))
    model = _CrashModel(recorder.ops, recorder.inodes)
    final = model._build(range(len(model.ops)), {})
    said = {p for p, _ in recorder.refusals}
    mismatches = recorder.refusals + [
        m for m in _compare(final, path, recorder.unseen) if m[0] not in said
    ]
    if mismatches:
        raise CannotRebuild(os.fspath(path), mismatches)
    if not recorder.ops:
        raise AuditError(
            f"the recording holds no operation under {path}: the workload wrote nothing "
            f"there (is --root the directory it writes? a relative root is taken from the "
            f"workload's working directory); nothing was judged"
        )
    states, distinct = _plan(model, models, seed)
    # a link's meaning follows the tree (a rename, a link to "." made later: s15 attack):
    # judged in every state a check would be shown, none of which may lead out
    out = {p: why for s in states for p, why in links_out(s.flat, recorder._bases())}
    if out:
        raise CannotRebuild(os.fspath(path), sorted(out.items()))
    return model, states, distinct


@contextlib.contextmanager
def _judging(path: Path) -> Iterator[None]:
    """Whatever goes wrong while modelling ``path`` is an :class:`AuditError` (nothing
    was judged), in one line: never mistaken for a verdict."""
    try:
        yield
    except (AuditError, OSError):
        raise
    except MemoryError:
        raise AuditError(
            f"ran out of memory modelling {path}: the model holds every file's data under "
            f"it (a sparse file's holes aside), some files in several versions; audit a "
            f"smaller configuration (files of a few GiB at most); nothing was judged"
        ) from None
    except Exception as exc:
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise AuditError(
            f"the audit failed while modelling the recording of {path} ({why}); this is a "
            f"defect of the audit, please report it with the workload; nothing was judged"
        ) from exc


def _scan(root: Path) -> dict[str, tuple[str, Data]]:
    """The tree at ``root`` as the workload left it, read by descriptors (no path longer
    than PATH_MAX, no symlink followed: :func:`walk_tree`)."""
    out: dict[str, tuple[str, Data]] = {}
    if not root.is_dir() or root.is_symlink():
        return out
    for rel, st, at, name in walk_tree(root):
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("symlink", os.fsencode(os.readlink(name, dir_fd=at)))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", b"")
        elif stat.S_ISREG(st.st_mode):
            out[rel] = ("file", load(os.open(name, _FILE, dir_fd=at)))
        else:
            out[rel] = ("other", b"")
    return out


_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _compare(final: _Flat, root: Path, unseen: Mapping[str, str]) -> list[tuple[str, str]]:
    """Where the replayed recording and the tree the workload left disagree."""
    replay = {p: (k, b) for p, k, b in final}
    disk = _scan(root)
    out: list[tuple[str, str]] = []
    if os.path.islink(root):
        out.append(("", "the audited directory itself is a symlink after the run"))
    for p in sorted(set(replay) | set(disk)):
        why = f" ({unseen[p]})" if p in unseen else ""
        r, d = replay.get(p), disk.get(p)
        if r is None:
            out.append((p, f"on disk after the run, but the recording never made it{why}"))
        elif d is None:
            out.append((p, f"the recording made it, but the run did not leave it{why}"))
        elif r[0] != d[0]:
            out.append((p, f"a {d[0]} on disk, a {r[0]} in the replay{why}"))
        elif r[1] != d[1]:
            out.append(
                (p, f"contents differ: {len(d[1])} bytes on disk, {len(r[1])} replayed{why}")
            )
    return out


def _plan(
    model: _CrashModel, models: Sequence[str], seed: int = 0
) -> tuple[list[_State], dict[str, int]]:
    """Every distinct crash state of ``models``, in crash-point order, each once."""
    digests: dict[int, tuple[Data, bytes]] = {}

    def digest(flat: _Flat) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for p, kind, payload in flat:
            known = digests.get(id(payload))
            if known is None or known[0] is not payload:
                known = digests[id(payload)] = (payload, data_digest(payload))
            h.update(f"{len(p)}:{p}:{kind}:".encode("utf-8", "surrogateescape") + known[1])
        return h.digest()

    index: dict[bytes, int] = {}
    states: list[_State] = []
    per_model: dict[str, set[int]] = {m: set() for m in models}
    for c in model.candidates(models, seed=seed):
        flat = model._build(c.persisted, c.fates, c.writes)
        key = digest(flat)
        i = index.get(key)
        if i is None:
            i = index[key] = len(states)
            states.append(_State(flat, persisted=c.persisted))
        states[i].by_model.setdefault(c.model, c)
        per_model[c.model].add(i)
    return states, {m: len(s) for m, s in per_model.items()}


def _check_the_end(
    model: _CrashModel,
    check: Check,
    path: Path,
    scratch: Path,
    *,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
) -> None:
    """A check command that cannot run (the shell's 127, command not found, or 126, not
    executable; or a usage error, exit 2, the same on the first state as on the last: a
    script that is not there, s15 attack) on the directory as the workload left it would
    make every crash state a "violation" that says nothing about crashes (audit5 attack
    10): refused (:class:`AuditError`). Any other rejection of that state is judged as the
    crash right after the last operation (a workload whose own end does not load is
    broken)."""
    if callable(check):
        return
    final = model._build(range(len(model.ops)), {})
    end = run_checks(
        [final], [0], check, root=path, scratch=scratch, jobs=1, timeout=timeout,
        cwd=cwd, env=env, show=False,
    )[0]  # fmt: skip
    if end.status == 2 and _USAGE.search(end.output):  # python's "can't open file", argparse
        first = run_checks(
            [model._build((), {})], [0], check, root=path, scratch=scratch, jobs=1,
            timeout=timeout, cwd=cwd, env=env, show=False,
        )[0]  # fmt: skip
        if first.status != 2 or first.output != end.output:
            return  # the first state and the last told apart: a verdict on the save
    elif end.status not in (126, 127):
        return
    said = [line.strip(" |") for line in end.output.splitlines() if line.strip(" |")]
    raise AuditError(
        f"the check command could not run (exit {end.status}"
        f"{': ' + said[-1] if said else ''}); nothing was judged: fix the --check command"
    )


_USAGE = re.compile(r"can't open file|^usage:|error: unrecognized arguments", re.M | re.I)
"""What python and argparse say on a usage error (exit 2)."""


def _listing(flat: _Flat) -> tuple[str, ...]:
    out = []
    for p, kind, payload in flat:
        if kind == "dir":
            out.append(p + "/")
        elif kind == "symlink":
            out.append(f"{p} -> {text(payload)}")
        else:
            zero = ", all zero" if payload and all_zero(payload) else ""
            out.append(f"{p} ({len(payload)} bytes{zero})")
    return tuple(out)


def _damage(model: _CrashModel, flat: _Flat, k: int) -> tuple[str, ...]:
    """How the state's files differ from the live tree at the moment of the crash."""
    live = {p: b for p, kind, b in model._build(range(k), {}) if kind == "file"}
    here = {p: b for p, kind, b in flat if kind == "file"}
    out = []
    for p in sorted(set(live) | set(here)):
        now, then = here.get(p), live.get(p)
        if now is None:
            assert then is not None
            out.append(f"{p}: missing ({len(then)} bytes at the crash)")
        elif then is None or now == then:
            continue
        elif now and all_zero(now):
            out.append(f"{p}: zero-filled ({len(now)} bytes)")
        elif len(now) < len(then):
            out.append(f"{p}: short, {len(now)} of {len(then)} bytes")
        else:
            out.append(f"{p}: older contents ({len(now)} bytes; {len(then)} at the crash)")
    return tuple(out)


def _violation(model: _CrashModel, state: _State, m: str, outcome: Outcome) -> Violation:
    c = state.by_model[m]
    k = c.crash_point
    ops = model.ops
    return Violation(
        model=m,
        crash_point=k,
        operation=ops[k - 1].description if k else "(before the first operation)",
        context=tuple(f"#{i + 1} {ops[i].description}" for i in range(max(0, k - _CONTEXT), k)),
        survived=c.note,
        listing=_listing(state.flat),
        damaged=_damage(model, state.flat, k),
        status=outcome.status,
        output=outcome.output,
    )
