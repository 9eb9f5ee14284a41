"""Why an audit could not judge a workload (the command line exits 2 on each)."""

from __future__ import annotations


class AuditError(RuntimeError):
    """The audit could not run or could not trust what it recorded; nothing was judged."""


class WorkloadFailed(AuditError):
    """The recorded run of the workload exited non-zero: there is no good run to audit."""

    def __init__(self, status: int, tail: str) -> None:
        super().__init__(
            f"the workload exited with status {status} while being recorded; fix it (or its "
            f"configuration) so that it runs to the end, then audit again. Its last output:\n"
            f"{tail}"
        )
        self.status = status
        self.tail = tail


class CannotRebuild(AuditError):
    """Replaying the recording does not give the tree the workload left: some write was
    not seen (a process outside the trace, a path through an alias, O_DIRECT), so the crash
    states would be wrong and the audit refuses to judge them."""

    def __init__(self, root: str, mismatches: list[tuple[str, str]]) -> None:
        lines = "\n".join(f"  {path}: {why}" for path, why in mismatches[:20])
        more = f"\n  ... and {len(mismatches) - 20} more" if len(mismatches) > 20 else ""
        super().__init__(
            f"cannot rebuild the crash states of {root}: replaying the recorded operations "
            f"does not reproduce the tree the workload left, so some write was not seen "
            f"(a process outside the trace, a path through an alias of it, O_DIRECT). "
            f"Nothing was judged. Differences:\n{lines}{more}"
        )
        self.root = root
        self.mismatches = mismatches
        self.paths = [p for p, _ in mismatches]
