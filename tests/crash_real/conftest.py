"""Fixtures of the real-crash tests: mounts that are always undone, and the session's figures.

Tests that mount filesystems are marked ``root`` (``pytest -m root`` selects
them, ``-m "not root"`` leaves them out) and skip, saying why, where they
cannot run: not root, a tool missing, a filesystem the kernel lacks.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _real_mounts import KINDS, Mount, Mounter, mount_or_skip
from _real_support import FACTS, PREFIX_ENV, SOAK, STATS


@pytest.fixture
def mounter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounter]:
    """Makes mounts; every one of them (and its loop device) is undone at teardown."""
    m = Mounter(tmp_path_factory.mktemp("mnt"))
    try:
        yield m
    finally:
        m.close()


@pytest.fixture(params=KINDS)
def real_fs(request: pytest.FixtureRequest, mounter: Mounter) -> Mount:
    """Each real filesystem in turn: loop-mounted ext4, xfs, btrfs; tmpfs; overlayfs."""
    return mount_or_skip(mounter, request.param)


@pytest.fixture(params=["", "checkpoint-"], ids=["plain", "prefixed"])
def root_prefix(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on plain roots (staging ``N.tmp-<hex>``) and on prefixed ones
    (``.tmp-checkpoint-N.<hex>``): the prefix reaches child processes through the
    environment."""
    monkeypatch.setenv(PREFIX_ENV, request.param)
    return str(request.param)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not STATS and not FACTS:
        return
    tr = terminalreporter
    tr.section("atomic_ckpt real crash figures" + (" (soak)" if SOAK else ""))
    for key in sorted(STATS):
        tr.write_line(f"{key}: {STATS[key]}")
    for key in sorted(FACTS):
        tr.write_line(f"{key}: {FACTS[key]}")


FIGURES = "atomic_ckpt_real_figures"
"""The key of this worker's figures in pytest-xdist's ``workeroutput`` (tests/conftest.py
adds them up on the controller, which prints them: a worker's summary is not shown)."""


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[FIGURES] = {"stats": dict(STATS), "facts": dict(FACTS), "soak": SOAK}
