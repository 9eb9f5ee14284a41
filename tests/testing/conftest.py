"""Counts what the power-loss simulation checked, for the summary line and the README."""

from __future__ import annotations

import json
import os
import tempfile
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
    model = _model_summary()
    for line in [*_SUMMARY, *([model] if model else [])]:
        terminalreporter.write_line(line)


_TOTALS_DIR = "ATOMIC_CKPT_MODEL_TOTALS"
"""A directory each xdist worker writes its model-check totals to, for the summary."""
_KEYS = ("sequences", "operations", "crash_states", "distinct_states")


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and _TOTALS_DIR not in os.environ:
        os.environ[_TOTALS_DIR] = tempfile.mkdtemp(prefix="atomic_ckpt-model-totals-")


@pytest.fixture(scope="session")
def model_totals() -> Iterator[object]:
    """Totals of the model check (tests/testing/test_model_*.py), for the summary: summed
    over the xdist workers through files in ``$ATOMIC_CKPT_MODEL_TOTALS``."""
    from atomic_ckpt.testing.sequences import Totals

    totals = Totals()
    yield totals
    if _TOTALS_DIR in os.environ:  # unset in a worker whose controller never loaded this
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        where = Path(os.environ[_TOTALS_DIR]) / f"{worker}.json"
        where.write_text(json.dumps({k: getattr(totals, k) for k in _KEYS}))


def _model_summary() -> str | None:
    where = os.environ.get(_TOTALS_DIR)
    parts = sorted(Path(where).glob("*.json")) if where else []
    if not parts:
        return None
    sums = dict.fromkeys(_KEYS, 0)
    for part in parts:
        for k, v in json.loads(part.read_text()).items():
            sums[k] += v
    return (
        f"model check: {sums['sequences']} sequences, {sums['operations']} operations "
        f"recorded, {sums['crash_states']} crash states ({sums['distinct_states']} distinct) "
        "checked"
    )
