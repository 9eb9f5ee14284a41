"""``atomic-ckpt audit``: a crash-consistency audit of any program's checkpointing.

Record a workload once under ``strace``, rebuild the tree as a process kill or a power
loss would leave it at every operation boundary (the same crash model as the library's
own power-loss simulator, :func:`atomic_ckpt.testing.explore`, fed by a system-call
trace instead of the library's hooks), and run the user's check (typically: resume from
the newest checkpoint) on each state at the audited path. See ``docs/guides/audit.md``.

Layout: ``_strace`` (run strace, read its trace), ``_trace`` (replay the calls on the
model), ``_materialize`` (show states at the path, set the original aside),
``_checks`` (run a check: a command, in a mount namespace, or a forked function),
``_report`` (the report, text and JSON), ``_audit`` (the whole audit). The
``atomic-ckpt audit`` command line is :mod:`atomic_ckpt.cli.audit`.
"""

from __future__ import annotations

from atomic_ckpt.testing._results import AUDIT_MODELS
from atomic_ckpt.testing.audit._audit import audit
from atomic_ckpt.testing.audit._checks import Check
from atomic_ckpt.testing.audit._errors import AuditError, CannotRebuild, WorkloadFailed
from atomic_ckpt.testing.audit._procs import adopt_orphans
from atomic_ckpt.testing.audit._report import AuditReport, Violation
from atomic_ckpt.testing.audit._strace import StraceNotFound

__all__ = [
    "AUDIT_MODELS",
    "AuditError",
    "AuditReport",
    "CannotRebuild",
    "Check",
    "StraceNotFound",
    "Violation",
    "WorkloadFailed",
    "adopt_orphans",
    "audit",
]
