"""What an audit found: the states it checked per model, every violation with enough
context to see why, and the time it spent; as text and as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Violation:
    """A crash state whose check failed."""

    model: str
    """``kill`` or ``power``."""
    crash_point: int
    """How many recorded operations completed before the crash."""
    operation: str
    """The operation the crash follows (``(before the first operation)`` at 0)."""
    context: tuple[str, ...]
    """That operation and a few before it, numbered."""
    survived: str
    """What the model kept (e.g. names kept, unsynced data zero-filled)."""
    listing: tuple[str, ...]
    """What is on disk in that state, one entry a line, relative to the audited path."""
    damaged: tuple[str, ...]
    """Files short, zero-filled, older or missing compared with the moment of the crash."""
    status: int
    """The check's exit status."""
    output: str
    """The tail of the check's stdout and stderr."""

    def __str__(self) -> str:
        lines = [f"[{self.model}] crash after operation #{self.crash_point}: {self.operation}"]
        lines.append(f"  survived: {self.survived}")
        lines += ["  recorded operations:"] + [f"    {c}" for c in self.context]
        lines += ["  on disk:"] + [f"    {e}" for e in self.listing or ("(empty)",)]
        if self.damaged:
            lines += ["  damaged:"] + [f"    {d}" for d in self.damaged]
        lines.append(f"  check exited {self.status}; its output ends:")
        lines += [f"    | {o}" for o in (self.output.splitlines() or ["(no output)"])]
        return "\n".join(lines)


@dataclass(frozen=True)
class AuditReport:
    """The outcome of :func:`~atomic_ckpt.testing.audit` (and ``atomic-ckpt audit``)."""

    root: str
    models: tuple[str, ...]
    operations: int
    """Recorded filesystem operations under the audited directory (after collapsing a
    file's consecutive writes into one)."""
    calls: int
    """System calls of the workload the recorder replayed."""
    boundaries: Mapping[str, int]
    """Crash points per model (operations + 1)."""
    states: Mapping[str, int]
    """Distinct crash states checked, per model."""
    distinct: Mapping[str, int]
    """Distinct crash states per model before sampling (equal to ``states`` unless sampled)."""
    checked: int
    """Checks run: a state two models share is checked once."""
    violations: tuple[Violation, ...]
    timings: Mapping[str, float]
    """Seconds spent recording, building states and checking."""
    sampled: str | None = None
    """How the states were sampled past ``max_states``, or None if all were checked."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    failing: int | None = None
    """Distinct states whose check failed, each counted once however many models (and
    crash points) lead to it; at most :attr:`checked`. None: one per violation."""

    @property
    def ok(self) -> bool:
        """No crash state failed its check."""
        return not self.violations

    def by_model(self, model: str) -> tuple[Violation, ...]:
        """The violations of one model."""
        return tuple(v for v in self.violations if v.model == model)

    @property
    def verdict(self) -> str:
        """One line: clean, or how many states of which model fail."""
        if self.ok:
            per = ", ".join(f"{self.states.get(m, 0)} {m}" for m in self.models)
            return f"clean: all {self.checked} distinct crash states pass ({per})" + (
                " [sampled]" if self.sampled else ""
            )
        counts = ", ".join(
            f"{m} {len(self.by_model(m))} of {self.states.get(m, 0)}" for m in self.models
        )
        return (
            f"BROKEN: {self.failed} of {self.checked} distinct crash states fail the check "
            f"({counts}): a crash at those points leaves a checkpoint the check cannot "
            "resume from" + (" [sampled]" if self.sampled else "")
        )

    @property
    def failed(self) -> int:
        """Distinct states that failed, each once (:attr:`failing`, when known)."""
        return len(self.violations) if self.failing is None else self.failing

    def summary(self) -> str:
        """The header: counts per model and the time split."""
        t = self.timings
        lines = [
            f"atomic-ckpt audit of {self.root}: {self.operations} operations recorded, "
            f"{self.checked} distinct states checked",
            f"  time: record {t.get('record', 0):.1f} s ({self.calls} system calls), build "
            f"states {t.get('build', 0):.1f} s, checks {t.get('checks', 0):.1f} s",
        ]
        for m in self.models:
            lines.append(
                f"  {m:<5}: {self.boundaries.get(m, 0)} crash points, "
                f"{self.states.get(m, 0)} distinct states checked, "
                f"{len(self.by_model(m))} violations"
            )
        if self.sampled:
            lines.append(f"  sampled: {self.sampled}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def render(self, *, limit: int = 10) -> str:
        """The whole report: summary, the first ``limit`` violations, the verdict."""
        parts = [self.summary()]
        for i, v in enumerate(self.violations[:limit], 1):
            parts.append(f"violation {i} of {len(self.violations)}\n{v}")
        if len(self.violations) > limit:
            parts.append(
                f"... {len(self.violations) - limit} more violations (all of them: --json FILE)"
            )
        parts.append(self.verdict)
        return "\n\n".join(parts)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (what ``--json`` writes)."""
        return {
            "root": self.root,
            "ok": self.ok,
            "verdict": self.verdict,
            "models": list(self.models),
            "operations": self.operations,
            "calls": self.calls,
            "boundaries": dict(self.boundaries),
            "states": dict(self.states),
            "distinct_states": dict(self.distinct),
            "checked": self.checked,
            "failing": self.failed,
            "sampled": self.sampled,
            "timings": dict(self.timings),
            "notes": list(self.notes),
            "violations": [
                {**asdict(v), "context": list(v.context), "listing": list(v.listing)}
                for v in self.violations
            ],
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)
