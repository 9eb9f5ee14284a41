"""Seeded saves, the ``_fs`` hook and the invariant checker of the real-crash tests.

Imported both by the tests and by ``_crash_child.py`` (the process the tests
kill), so it depends on nothing but the standard library and atomic_ckpt.

A *plan* is a sequence of saves; save ``i`` commits step ``plan[i].step`` with
bytes derived from ``(seed, step, i)`` alone. Every file starts with a header
naming its seed, step, save and path, so the checker can tell which save a
directory holds without trusting the marker, and notices a mix of two saves,
a truncated file, a zero-filled file or a missing one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import signal
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomic_ckpt import MARKER, TMP_INFIX, CheckpointDir, SyncPolicy
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l2_syscalls import fs as _fs

SOAK = os.environ.get("ATOMIC_CKPT_SOAK", "").strip() not in ("", "0")

PREFIX_ENV = "ATOMIC_CKPT_TEST_PREFIX"
"""The step-name prefix of the roots these tests (and their children) use: plain roots
stage as ``N.tmp-<hex>``, prefixed ones as ``.tmp-<prefix>N.<hex>`` (the ``root_prefix``
fixture runs a test on both)."""


def prefix() -> str:
    """The prefix of this run's roots (``""`` unless ``root_prefix`` set one)."""
    return os.environ.get(PREFIX_ENV, "")


"""``ATOMIC_CKPT_SOAK=1`` runs every enumeration in full and many more Hypothesis examples."""

HOOKED = tuple(sorted(n for n in _fs.__all__ if callable(getattr(_fs, n))))
"""Every function of the syscall module ``_core.l2_syscalls.fs`` (the durability syscalls)."""

FSYNCS = ("fsync_fd", "fsync_file", "fsync_dir")

STATS: Counter[str] = Counter()
"""Figures for the README, printed at the end of the session (see conftest.py)."""
FACTS: dict[str, str] = {}
"""Observations printed beside the figures, e.g. which replace path a filesystem took."""

_SIZES = (0, 1, 100, 4096, 65_537, 300_000)
_HEADER = re.compile(
    rb"atomic_ckpt crash test seed=(\d+) step=(\d+) save=(\d+) file=([^\n]*)\n", re.ASCII
)


# ---------------------------------------------------------------- seeded saves


@dataclass(frozen=True)
class Save:
    """One commit of a plan: save number ``index`` (unique in its plan) of ``step``."""

    index: int
    step: int


def plan_of(steps: list[int] | tuple[int, ...]) -> list[Save]:
    """The plan committing ``steps`` in order (a repeated step is a replacement)."""
    return [Save(i, s) for i, s in enumerate(steps)]


def random_steps(seed: int, n: int) -> list[int]:
    """``n`` steps: mostly new, increasing steps, about a third replacing an earlier one."""
    rng = random.Random(f"steps/{seed}")
    steps: list[int] = []
    for _ in range(n):
        if steps and rng.random() < 0.35:
            steps.append(rng.choice(steps))
        else:
            steps.append((max(steps) if steps else 0) + rng.randint(1, 3))
    return steps


def save_files(seed: int, save: Save, *, single: bool = False) -> dict[str, bytes]:
    """The files (relative path -> bytes) that ``save`` writes; ``single``: one small file."""
    rng = random.Random(f"files/{seed}/{save.step}/{save.index}")
    if single:
        names = ["model.bin"]
    else:
        names = [n for n in ("model.bin", "optim.bin", "sub/shard.bin") if rng.random() < 0.7]
        names = names or ["model.bin"]
    out: dict[str, bytes] = {}
    for rel in names:
        size = rng.choice(_SIZES[:4] if single else _SIZES)
        head = f"atomic_ckpt crash test seed={seed} step={save.step} save={save.index} file={rel}\n"
        out[rel] = head.encode() + rng.randbytes(size)
    return out


def write_files(directory: Path, files: dict[str, bytes], hook: FsHook | None = None) -> None:
    """Write ``files`` into ``directory`` as a save function would (no fsync: the library's job).

    With a hook, each file's write is an event (``save_write``), so a test can
    crash the save halfway.
    """
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(exist_ok=True)
        if hook is None:
            _write(path, data)
        else:
            hook.call("save_write", _write, path, data)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def commit_save(
    ckpts: CheckpointDir,
    seed: int,
    save: Save,
    *,
    single: bool = False,
    hook: FsHook | None = None,
) -> None:
    """Commit ``save`` (its seeded files) with ``ckpts``."""
    with ckpts.commit(save.step, metadata={"seed": seed, "save": save.index}) as staging:
        write_files(staging, save_files(seed, save, single=single), hook)


def new_dir(
    root: Path,
    *,
    single: bool = False,
    sync: SyncPolicy | None = None,
    workers: int | None = None,
) -> CheckpointDir:
    """The CheckpointDir the tests use (``single``: no checksums, one thread only).

    ``workers=1`` makes the order of the library's calls fixed (the marker is
    otherwise written while other threads flush), for tests that count calls.
    """
    return CheckpointDir(
        root,
        prefix=prefix(),
        checksum=None if single else "crc32",
        lock_timeout=60,
        workers=1 if single else workers,
        sync=sync,
    )


# ---------------------------------------------------------------- the _fs hook


@dataclass(frozen=True)
class Event:
    """One call of a hooked function: its 1-based number, name and (first) path."""

    index: int
    name: str
    path: str
    target: str = ""


@dataclass
class FsHook:
    """Wraps every function of :data:`HOOKED` (and the save's writes) as numbered events.

    ``before(event)`` runs before the real call (raise there to fail the call
    instead of making it), ``after(event)`` after it returned. Thread-safe: the
    library fsyncs files from a pool of threads.
    """

    before: Callable[[Event], None] | None = None
    after: Callable[[Event], None] | None = None
    events: list[Event] = field(default_factory=list)
    raised: list[tuple[Event, BaseException]] = field(default_factory=list)
    """The real calls that raised (not the ones ``before`` failed)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` as the event ``name``."""
        path = _describe(name, args[0]) if args else ""
        target = str(args[1]) if len(args) > 1 and name.startswith("rename") else ""
        with self._lock:
            event = Event(len(self.events) + 1, name, path, target)
            self.events.append(event)
        if self.before is not None:
            self.before(event)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            with self._lock:
                self.raised.append((event, exc))
            raise
        if self.after is not None:
            self.after(event)
        return result

    @contextlib.contextmanager
    def installed(self) -> Iterator[FsHook]:
        """Patch the syscall module for the duration (calls inside _fs are hooked too)."""
        real = {name: getattr(_fs, name) for name in HOOKED}

        def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def hooked(*args: Any, **kwargs: Any) -> Any:
                return self.call(name, fn, *args, **kwargs)

            return hooked

        try:
            for name, fn in real.items():
                setattr(_fs, name, wrap(name, fn))
            yield self
        finally:
            for name, fn in real.items():
                setattr(_fs, name, fn)


def _describe(name: str, arg: object) -> str:
    if name == "fsync_fd" and isinstance(arg, int):
        try:
            return os.readlink(f"/proc/self/fd/{arg}")
        except OSError:
            return f"fd {arg}"
    return str(arg)


@contextlib.contextmanager
def forced_fallback() -> Iterator[None]:
    """Make RENAME_EXCHANGE look unsupported, so a replace takes the move-aside fallback."""
    real = _fs.rename_exchange

    def unsupported(a: Path, b: Path) -> None:
        raise OSError(errno.EINVAL, "RENAME_EXCHANGE switched off by the test", str(a))

    _fs.rename_exchange = unsupported
    try:
        yield
    finally:
        _fs.rename_exchange = real


# ---------------------------------------------------------------- the checker


def read_tree(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` but the marker; anything else fails the test."""
    out: dict[str, bytes] = {}
    for top, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            path = Path(top, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                continue
            assert stat.S_ISREG(mode), f"{path} is neither a file nor a directory"
            rel = path.relative_to(directory).as_posix()
            if rel != MARKER:
                out[rel] = path.read_bytes()
    return out


def identify(files: dict[str, bytes], where: Path) -> tuple[int, int, int]:
    """The (seed, step, save) every file of a checkpoint claims; they must agree."""
    assert files, f"I1: complete checkpoint {where} holds no file at all"
    claims = set()
    for rel, data in files.items():
        m = _HEADER.match(data)
        assert m is not None, (
            f"I1: {where / rel} does not start with a save header "
            f"({len(data)} bytes, begins {data[:24]!r}): torn, truncated or zero-filled"
        )
        assert m[4].decode() == rel, f"I1: {where / rel} holds the bytes of {m[4].decode()}"
        claims.add((int(m[1]), int(m[2]), int(m[3])))
    assert len(claims) == 1, f"I1: {where} mixes the files of several saves: {sorted(claims)}"
    return claims.pop()


def marked_steps(root: Path) -> list[int]:
    """Steps with a directory holding a marker, found without the library's scanner."""
    if not root.is_dir():
        return []
    out = []
    head = prefix()
    for name in os.listdir(root):
        digits = name[len(head) :] if name.startswith(head) else ""
        if TMP_INFIX in name or re.fullmatch(r"0|[1-9][0-9]*", digits, re.ASCII) is None:
            continue
        path = root / name
        if stat.S_ISDIR(os.lstat(path).st_mode) and os.path.lexists(path / MARKER):
            out.append(int(digits))
    return sorted(out)


def check_root(
    root: Path,
    seed: int,
    plan: list[Save],
    returned: int,
    *,
    single: bool = False,
    window: bool = False,
) -> dict[int, int]:
    """Assert I1-I4 on ``root`` after ``plan[:returned]`` returned and a crash or kill.

    ``plan[returned]`` (if any) was in flight: it may or may not be visible.
    ``window``: a fallback replace may have been interrupted between its two
    renames, so a committed step may be missing until clean() (documented).
    Returns ``{step: save index}`` of what the scanner reports complete.
    """
    ckpts = new_dir(root, single=single)
    found = ckpts.checkpoints()
    in_flight = plan[returned] if returned < len(plan) else None
    last: dict[int, int] = {s.step: s.index for s in plan[:returned]}
    # Every directory with a marker is complete: a torn marker would show up here.
    assert [c.step for c in found] == marked_steps(root), (
        f"scanner reports {[c.step for c in found]} complete, but {marked_steps(root)} "
        "have a marker: a marker is torn or unreadable"
    )
    holds: dict[int, int] = {}
    for c in found:
        files = read_tree(c.path)
        got_seed, got_step, index = identify(files, c.path)
        assert (got_seed, got_step) == (seed, c.step), f"I1: {c.path} holds another step's save"
        allowed = {last[c.step]} if c.step in last else set()
        if in_flight is not None and in_flight.step == c.step:
            allowed.add(in_flight.index)
        assert index in allowed, (
            f"I1/I2: step {c.step} holds save {index}, expected one of {sorted(allowed)} "
            f"(returned: {[(s.step, s.index) for s in plan[:returned]]})"
        )
        expected = save_files(seed, plan[index], single=single)
        assert sorted(files) == sorted(expected), (
            f"I1: {c.path} holds files {sorted(files)}, save {index} wrote {sorted(expected)}"
        )
        for rel, data in expected.items():
            assert files[rel] == data, f"I1: {c.path / rel} differs from save {index}'s bytes"
        recorded = "an empty (legacy) marker" if c.manifest.legacy else c.manifest.metadata
        assert c.manifest.metadata.get("save") == index, (
            f"I1: {c.path} holds save {index}'s files, but its marker is {recorded}"
        )
        ckpts.verify(c.step)
        holds[c.step] = index
    if not window:
        for step, index in last.items():
            assert step in holds, f"I2/I3: step {step} (save {index} returned) is missing"
    latest = ckpts.latest()
    assert (latest.step if latest else None) == (max(holds) if holds else None), "I4"
    return holds


def leftovers(root: Path) -> list[str]:
    """Names in ``root`` that are not checkpoints: anything ``.tmp-`` but the root lock."""
    if not root.is_dir():
        return []
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and n != ROOT_LOCK)


def continue_and_clean(
    root: Path, seed: int, plan: list[Save], returned: int, *, single: bool = False
) -> list[str]:
    """A new writer commits the rest of the plan; then clean() removes every orphan.

    Returns the orphans clean() removed.
    """
    ckpts = new_dir(root, single=single)
    for save in plan[returned:]:
        commit_save(ckpts, seed, save, single=single)
    holds = check_root(root, seed, plan, len(plan), single=single)
    assert sorted(holds) == sorted({s.step for s in plan})
    orphans = leftovers(root)
    removed = {p.name for p in ckpts.clean()}
    assert leftovers(root) == [], f"clean() left {leftovers(root)} in {root}"
    assert set(orphans) <= removed, f"clean() did not report {set(orphans) - removed}"
    assert sorted(os.listdir(root)) == sorted(f"{prefix()}{s}" for s in holds)
    return orphans


# ---------------------------------------------------------------- kill children


def say(line: str) -> None:
    """A child's report to its parent: one line on stdout, unbuffered (it may die next)."""
    os.write(1, (line + "\n").encode())


def kill_hook(*, record: bool, kill_at: int, kill_when: str) -> FsHook:
    """The hook a kill child runs under.

    With ``record`` it reports every hooked call (``event N NAME PATH``) and every
    return (``returned N``); it SIGKILLs its own process ``kill_when`` (before or
    after) call number ``kill_at``, saying ``hook N NAME WHEN`` first.
    """

    def kill(event: Event, when: str) -> None:
        if event.index == kill_at and when == kill_when:
            say(f"hook {event.index} {event.name} {when}")
            os.kill(os.getpid(), signal.SIGKILL)

    def before(event: Event) -> None:
        if record:
            say(f"event {event.index} {event.name} {event.path}")
        kill(event, "before")

    def after(event: Event) -> None:
        if record:
            say(f"returned {event.index}")
        kill(event, "after")

    return FsHook(before=before, after=after)
