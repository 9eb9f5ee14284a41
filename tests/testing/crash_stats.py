"""Totals of the power-loss simulation runs of one test session."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from atomic_ckpt.testing import Report


@dataclass
class CrashStats:
    """Totals over every :func:`atomic_ckpt.testing.explore` run of the session."""

    workloads: int = 0
    operations: int = 0
    states_generated: int = 0
    states_checked: int = 0
    by_model: Counter[str] = field(default_factory=Counter)
    chosen_states: int = 0

    def add(self, report: Report) -> None:
        self.workloads += 1
        self.operations += len(report.ops)
        self.states_generated += report.states_generated
        self.states_checked += report.states_checked
        self.by_model.update(report.checked_by_model)

    def as_dict(self) -> dict[str, object]:
        return {
            "workloads": self.workloads,
            "operations_recorded": self.operations,
            "crash_states_generated": self.states_generated,
            "distinct_crash_states_checked": self.states_checked,
            "checked_by_model": dict(self.by_model),
            "hypothesis_chosen_states_checked": self.chosen_states,
        }
