"""Where a symlink in a tree leads, resolved as the kernel does: component by component,
following each link before the ``..`` after it (issue 29, s15 attack: ``here/../x`` with
``here -> .`` leaves the directory ``here`` sits in; ``os.path.normpath`` says it stays)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from atomic_ckpt.testing._mirror import _UNIVERSE, _Inode
from atomic_ckpt.testing._sparse import Data, text

Lookup = Callable[[str], "tuple[str, Data] | None"]
"""(kind, payload) of the entry at a path below the root, reached through no symlink;
None when there is none."""

_HOPS = 40  # the kernel's limit on links followed in one resolution (ELOOP)


def resolve(lookup: Lookup, bases: tuple[str, ...], at: str, target: str) -> str | None:
    """The path below the root (``""``: the root) that the link ``target``, sitting in the
    directory ``at`` (below the root), leads to; None when it leads out of the tree (or
    loops). ``bases`` are the root's real path and its spellings, the first the real one.
    A missing component is taken as a directory still to be made: the audit checks every
    state a check is shown, so a later change is judged in the state that holds it."""
    stack = [p for p in at.split("/") if p]
    todo: list[str] = []
    hops = 0

    def push(link: str) -> bool:
        nonlocal stack
        if os.path.isabs(link):
            rest = _below(bases, link)
            if rest is None:
                return False
            stack = []
            link = rest
        todo.extend(reversed(link.split("/")))
        return True

    if not push(target):
        return None
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if stack:
                stack.pop()
                continue
            # above the root: back in only by the root's own name in its real parent
            while todo and todo[-1] in ("", "."):
                todo.pop()
            if not todo or todo[-1] != os.path.basename(bases[0]):
                return None
            todo.pop()
            continue
        stack.append(part)
        entry = lookup("/".join(stack))
        if entry is None or entry[0] != "symlink":
            continue
        hops += 1
        stack.pop()
        if hops > _HOPS or not push(text(entry[1])):
            return None
    return "/".join(stack)


def _below(bases: tuple[str, ...], path: str) -> str | None:
    """The rest of the absolute ``path`` after a base it starts with, unnormalised (its
    ``..`` are resolved in the tree); None when it starts with none."""
    for base in bases:
        if path == base or path.startswith(base + "/"):
            return path[len(base) :]
    return None


def links_out(
    entries: Iterable[tuple[str, str, Data]], bases: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(path, why) for each symlink among ``entries`` (path, kind, payload: one tree)
    that leads out of it."""
    tree = {path: (kind, payload) for path, kind, payload in entries}
    out = []
    for path, (kind, payload) in tree.items():
        if kind != "symlink":
            continue
        if resolve(tree.get, bases, os.path.dirname(path), text(payload)) is None:
            out.append(
                (
                    path,
                    f"cannot rebuild: {path} is a symlink out of the audited tree -> "
                    f"{text(payload)}: the check would read the live target in every crash state",
                )
            )
    return out


def model_entries(
    inodes: Sequence[_Inode], ino: int = _UNIVERSE, rel: str = ""
) -> Iterator[tuple[str, str, Data]]:
    """(path, kind, payload) of every entry of a replay model's tree below ``ino``."""
    for name, child in inodes[ino].entries.items():
        node = inodes[child]
        yield f"{rel}{name}", node.kind, node.data
        if node.kind == "dir":
            yield from model_entries(inodes, child, f"{rel}{name}/")


def model_lookup(inodes: Sequence[_Inode]) -> Lookup:
    """:data:`Lookup` on a replay model's tree as it is now."""

    def lookup(rel: str) -> tuple[str, Data] | None:
        ino = _UNIVERSE
        for part in rel.split("/"):
            child = inodes[ino].entries.get(part)
            if child is None:
                return None
            ino = child
        return inodes[ino].kind, inodes[ino].data

    return lookup
