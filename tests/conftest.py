"""Fixtures shared by every test module."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import resource
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import CheckpointDir


@pytest.fixture
def ckpts(tmp_path: Path) -> CheckpointDir:
    """A CheckpointDir on a fresh root (not yet created on disk)."""
    return CheckpointDir(tmp_path / "ckpts")


@pytest.fixture(scope="session")
def mypy_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mypy cache directory for the tests that run `mypy --strict` (tests/typing,
    tests/remote): this worker's own copy of the repository's ``.mypy_cache`` when one
    exists (``.ci/run``'s mypy stage writes it, with the same options), else empty, and
    shared by this worker's mypy runs. mypy re-checks every module whose source or options
    changed, so the errors are the same; what is skipped is re-analysing torch's and the
    other dependencies' stubs, about half a minute per run.

    ``.ci/run`` runs its mypy stage beside this test run, holding an exclusive lock on
    ``.mypy_cache.lock`` while it writes the cache; the copy is taken under a shared lock on
    that file, so it waits for the stage to end instead of copying a cache half written."""
    where = tmp_path_factory.mktemp("mypy-cache") / "cache"
    repo = Path(__file__).resolve().parent.parent
    repo_cache = repo / ".mypy_cache"
    lock_path = repo / ".mypy_cache.lock"
    with contextlib.ExitStack() as held:
        with contextlib.suppress(FileNotFoundError):  # no lock file: nothing writes the cache
            lock = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
            held.callback(os.close, lock)
            fcntl.flock(lock, fcntl.LOCK_SH)
        if repo_cache.is_dir():
            shutil.copytree(repo_cache, where, symlinks=True, ignore_dangling_symlinks=True)
    return where


@pytest.fixture
def umask_027() -> Iterator[int]:
    """Run the test under umask 0o027 (group loses write, others lose everything)."""
    old = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(old)


_REAL_STATS: Counter[str] = Counter()
_REAL_FACTS: dict[str, str] = {}
_REAL_SOAK: list[bool] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the pytest-xdist controller: add up each worker's real-crash figures (sent by
    tests/crash_real/conftest.py), as one process would have counted them."""
    figures = getattr(node, "workeroutput", {}).get("atomic_ckpt_real_figures")
    if figures:
        _REAL_STATS.update(figures["stats"])
        _REAL_FACTS.update(figures["facts"])
        _REAL_SOAK.append(figures["soak"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    _time_summary(terminalreporter)
    _real_figures(terminalreporter)


def _real_figures(tr: pytest.TerminalReporter) -> None:
    """The real-crash figures of an xdist run (a run in one process prints its own)."""
    if not _REAL_STATS and not _REAL_FACTS:
        return
    tr.section("atomic_ckpt real crash figures" + (" (soak)" if any(_REAL_SOAK) else ""))
    for key in sorted(_REAL_STATS):
        tr.write_line(f"{key}: {_REAL_STATS[key]}")
    for key in sorted(_REAL_FACTS):
        tr.write_line(f"{key}: {_REAL_FACTS[key]}")


# Time per file and per worker (docs/contributing.md, the time budget): each test's wall
# time (setup, call, teardown) and CPU time (its worker's and the children it waited for),
# added up on the controller. The busiest worker's total is the run's critical path.
_CPU_AT_START = pytest.StashKey[float]()
_FILE_WALL: Counter[str] = Counter()
_FILE_CPU: Counter[str] = Counter()
_WORKER_WALL: Counter[str] = Counter()
_IS_WORKER: list[bool] = []
TIME_SUMMARY_FILES = 15


def _cpu_seconds() -> float:
    me, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    _IS_WORKER.append(hasattr(config, "workerinput"))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In a run of the slow tier alone (``-m slow``, as ``.ci/run`` does on 4 workers),
    leave out test files that cannot hold a slow test: every slow test's file spells the
    mark (``pytest.mark.slow``, or at least the word "slow"), so a file without the word is
    not imported. Collecting the whole suite costs each worker about 20 s of CPU (torch,
    the frameworks, every module); the slow tier's 15 files are a fraction of that. Any
    other marker expression (``-m ""``, the default ``not slow``) collects everything."""
    if config.getoption("markexpr", "") != "slow":
        return None
    name = collection_path.name
    if collection_path.suffix != ".py" or not name.startswith("test_"):
        return None
    return not _says_slow(collection_path)


def _says_slow(path: Path) -> bool:
    try:
        return "slow" in path.read_text(encoding="utf-8").lower()
    except OSError:
        return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The rule :func:`pytest_ignore_collect` relies on, checked in every run that collects
    the whole suite (the README's command among them): a slow test whose file does not say
    "slow" (a mark reached through another module's name) would be silently left out of
    ``-m slow``, so it stops the run instead."""
    checked: dict[Path, bool] = {}
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        path = item.path
        if path not in checked:
            checked[path] = _says_slow(path)
        if not checked[path]:
            raise pytest.UsageError(
                f"{item.nodeid} is marked slow but its file never says 'slow': `-m slow` "
                "would not collect it (tests/conftest.py, pytest_ignore_collect). Mark it "
                "with pytest.mark.slow written in the file."
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    item.stash[_CPU_AT_START] = _cpu_seconds()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    report = yield
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        report.user_properties.append(("cpu_seconds", _cpu_seconds() - item.stash[_CPU_AT_START]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if any(_IS_WORKER):
        return  # the controller adds up (a run in one process is its own controller)
    path = report.nodeid.split("::", 1)[0]
    node = getattr(report, "node", None)
    _FILE_WALL[path] += report.duration
    _WORKER_WALL[node.gateway.id if node is not None else "this process"] += report.duration
    _FILE_CPU[path] += sum(v for k, v in report.user_properties if k == "cpu_seconds")


def _time_summary(tr: pytest.TerminalReporter) -> None:
    if not _FILE_WALL:
        return
    tr.section("time per worker and per file (docs/contributing.md)")
    busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_WORKER_WALL.items()))
    tr.write_line(f"tests' wall time per worker: {busy} (the busiest is the critical path)")
    tr.write_line(
        f"all tests: {sum(_FILE_WALL.values()):.0f} s wall, {sum(_FILE_CPU.values()):.0f} s CPU"
        f" ({len(_FILE_WALL)} files); the {TIME_SUMMARY_FILES} costliest files, wall / CPU:"
    )
    for path, wall in _FILE_WALL.most_common(TIME_SUMMARY_FILES):
        tr.write_line(f"{wall:8.1f} s {_FILE_CPU[path]:8.1f} s  {path}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (torch, the frameworks, every test module: millions of
    objects) out of the garbage collector's reach (``gc.freeze``): each full collection a
    test triggers then walks only what tests made since, not the whole heap again."""
    if os.environ.get("ATOMIC_CKPT_NO_GC_FREEZE"):
        return
    gc.collect()
    gc.freeze()
