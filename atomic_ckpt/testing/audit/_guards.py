"""Refusals taken before the audit parks the original (issue 29): each raises AuditError."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt.testing.audit._errors import AuditError


def check_workdir(root: Path, workdir: str | None) -> None:
    """Refuse a working directory (the workload's and the check's) inside ``root``: the
    audit renames ``root`` aside, and a cwd follows the inode, so the workload and checks
    would run in the parked original (a false clean, or the user's data changed)."""
    here = os.path.realpath(workdir if workdir is not None else os.getcwd())
    target = os.path.realpath(root)
    if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
        raise AuditError(
            f"the working directory {here} is inside the audited directory {root}: the audit "
            f"moves that directory aside while it runs, so run it from outside (cd to "
            f"{os.path.dirname(target)}, say) with --root spelled from there"
        )


def check_root(root: Path) -> None:
    """Refuse a root that is a symlink, naming its target."""
    if os.path.islink(root):
        raise AuditError(
            f"{root} is a symlink (to {os.readlink(root)}): the audit shows crash states "
            f"at the directory itself; pass its target, --root {os.path.realpath(root)}"
        )
