"""Counts what the power-loss simulation checked, for the summary line and the README."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_stats import CrashStats

_SUMMARY: list[str] = []


@pytest.fixture(scope="session")
def crash_stats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashStats]:
    """Session totals; written to ``$ATOMIC_CKPT_CRASH_STATS`` (or the pytest temp dir)."""
    stats = CrashStats()
    yield stats
    out = Path(
        os.environ.get("ATOMIC_CKPT_CRASH_STATS")
        or tmp_path_factory.getbasetemp() / "crash_stats.json"
    )
    out.write_text(json.dumps(stats.as_dict(), indent=1) + "\n")
    models = ", ".join(f"{m} {n}" for m, n in sorted(stats.by_model.items()))
    _SUMMARY.append(
        f"power-loss simulation: {stats.states_checked} distinct crash states checked "
        f"({models}) over {stats.workloads} workloads, plus {stats.chosen_states} "
        f"Hypothesis-chosen states; totals in {out}"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _SUMMARY:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def model_totals() -> Iterator[object]:
    """Totals of the model check (tests/testing/test_model_check.py), for the summary."""
    from atomic_ckpt.testing.sequences import Totals

    totals = Totals()
    yield totals
    _SUMMARY.append(
        f"model check: {totals.sequences} sequences, {totals.operations} operations recorded, "
        f"{totals.crash_states} crash states ({totals.distinct_states} distinct) checked"
    )
