"""Fixtures shared by every test module."""

from __future__ import annotations

import os
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
    """The real-crash figures of an xdist run (a run in one process prints its own)."""
    if not _REAL_STATS and not _REAL_FACTS:
        return
    tr = terminalreporter
    tr.section("atomic_ckpt real crash figures" + (" (soak)" if any(_REAL_SOAK) else ""))
    for key in sorted(_REAL_STATS):
        tr.write_line(f"{key}: {_REAL_STATS[key]}")
    for key in sorted(_REAL_FACTS):
        tr.write_line(f"{key}: {_REAL_FACTS[key]}")
