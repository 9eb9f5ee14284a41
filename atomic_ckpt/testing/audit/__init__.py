"""``atomic-ckpt audit``: a crash-consistency audit of any program's checkpointing.

Record a workload once under ``strace``, rebuild the tree as a process kill or a power
loss would leave it at every operation boundary (the same crash model as the library's
own power-loss simulator, :func:`atomic_ckpt.testing.explore`, fed by a system-call
trace instead of the library's hooks), and run the user's check (typically: resume from
the newest checkpoint) on each state at the audited path. See ``docs/guides/audit.md``.

Layout: ``_strace`` (run strace, read its trace), ``_trace`` (replay the calls on the
model), ``_materialize`` (show states at the path, set the original aside),
``_checks`` (run a check: a command, in a mount namespace, or a forked function),
``_report`` (the report, text and JSON), ``_audit`` (the whole audit), ``command``
(the ``atomic-ckpt audit`` command line).
"""

from __future__ import annotations

from ._audit import audit
from ._checks import Check
from ._errors import AuditError, CannotRebuild, WorkloadFailed
from ._report import AuditReport, Violation
from ._strace import StraceNotFound

__all__ = [
    "AuditError",
    "AuditReport",
    "CannotRebuild",
    "Check",
    "StraceNotFound",
    "Violation",
    "WorkloadFailed",
    "audit",
]
