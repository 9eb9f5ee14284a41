"""Modification times for crash states: each entry's mtime follows the last operation of
the state that changed it, in the workload's order.

So a check that picks the newest checkpoint by mtime sees the order the workload made
them in, not the order the audit wrote each state's files in (round 15).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from atomic_ckpt.testing._mirror import _UNIVERSE
from atomic_ckpt.testing._states import _CrashModel
from atomic_ckpt.testing.audit._materialize import walk_tree

STEP_NS = 1000
"""The time between two operations in the states' clock (1 µs: apart in a float mtime)."""


def mtimes(tree: Path) -> dict[str, int]:
    """The mtime (ns) of each path under ``tree`` (none if it does not exist)."""
    return {rel: st.st_mtime_ns for rel, st, _, _ in walk_tree(tree)} if tree.is_dir() else {}


def before_the_run(model: _CrashModel, by_path: Mapping[str, int]) -> dict[int, int]:
    """The mtime (ns) of each inode the workload started from, by the path it had then
    (``by_path``: :func:`mtimes` of the copy it ran on, made with the original's times)."""
    out: dict[int, int] = {}

    def walk(ino: int, rel: str) -> None:
        for name, child in model._inodes[ino].base_entries.items():
            path = f"{rel}{name}"
            if path in by_path:
                out.setdefault(child, by_path[path])
            if model._inodes[child].kind == "dir":
                walk(child, path + "/")

    walk(_UNIVERSE, "")
    return out


def state_times(
    model: _CrashModel, persisted: Collection[int], initial: Mapping[int, int], start: int
) -> dict[str, int]:
    """Each path's mtime (ns) in the state made of ``persisted``: ``start`` plus the index
    of the last operation that changed it (a write or truncate its file's, a new or
    removed name its directory's; a rename moves a file without changing its time), else
    its time before the run."""
    entries = {i: dict(n.base_entries) for i, n in enumerate(model._inodes) if n.kind == "dir"}
    last: dict[int, int] = {}
    for i in sorted(persisted):
        op = model.ops[i]
        if op.kind == "entry":
            for name, child in op.effects:
                if child is None:
                    entries[op.inode].pop(name, None)
                else:
                    entries[op.inode][name] = child
            last[op.inode] = i
        elif op.kind == "data":
            last[op.inode] = i
    out: dict[str, int] = {}
    seen: set[int] = set()

    def walk(ino: int, rel: str) -> None:
        for name, child in entries[ino].items():
            if child in seen:
                continue
            path = f"{rel}{name}"
            if child in last:
                out[path] = start + (last[child] + 1) * STEP_NS
            elif child in initial:
                out[path] = initial[child]
            if model._inodes[child].kind == "dir":
                seen.add(child)
                walk(child, path + "/")

    walk(_UNIVERSE, "")
    return out
