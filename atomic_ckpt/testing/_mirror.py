"""The model of the live scratch tree: one inode per file, link and directory, and an Op
for every change to it, including the save function's own writes found by looking."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from atomic_ckpt._core.l1_names.names import ROOT_LOCK, parse_tmp
from atomic_ckpt.testing._results import Op
from atomic_ckpt.testing._sparse import Data, load
from atomic_ckpt.testing._writes import Write

_Kind: TypeAlias = Literal["file", "dir", "symlink"]
_UNIVERSE = 0  # the inode of the scratch directory that holds the root
_SMALL = 1 << 20


@dataclass
class _Inode:
    kind: _Kind
    base_data: Data = b""
    """Durable contents at the start (a new file starts empty; a symlink: its target)."""
    base_entries: dict[str, int] = field(default_factory=dict)
    data: Data = b""
    """Contents now (the live filesystem, as recorded)."""
    entries: dict[str, int] = field(default_factory=dict)
    real: int | None = None
    """st_ino of the live file, to notice a name that now means another file."""
    stamp: tuple[int, int, int] | None = None


def _kind_of(st: os.stat_result) -> _Kind | None:
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return None


def _ignored(name: str) -> bool:
    """Lock files: the scanner ignores them and they hold nothing."""
    if name == ROOT_LOCK:
        return True
    tmp = parse_tmp(name)
    return tmp is not None and tmp.is_lock


class _Mirror:
    """Mirrors the live scratch tree in the model and logs every change as an Op."""

    def __init__(self, universe: Path) -> None:
        self.universe = universe
        self.inodes: list[_Inode] = []
        self.ops: list[Op] = []
        # inode 0: the universe, durable by assumption (an audited workload may create it)
        exists = os.path.isdir(universe)
        self._new("dir", os.lstat(universe).st_ino if exists else None)
        if exists:
            self._load(_UNIVERSE, universe)
        for inode in self.inodes:
            inode.base_data, inode.base_entries = inode.data, dict(inode.entries)

    def ignores(self, name: str) -> bool:
        """Names left out of the model (the library's lock files)."""
        return _ignored(name)

    def _new(self, kind: _Kind, real: int | None) -> int:
        self.inodes.append(_Inode(kind, real=real))
        return len(self.inodes) - 1

    def _load(self, ino: int, path: Path) -> None:
        """Adopt the existing tree under ``path`` as the (durable) starting state."""
        for name in sorted(os.listdir(path)):
            if self.ignores(name):
                continue
            child = path / name
            st = os.lstat(child)
            kind = _kind_of(st)
            if kind is None:
                continue
            new = self._new(kind, st.st_ino)
            self.inodes[ino].entries[name] = new
            if kind == "dir":
                self._load(new, child)
            elif kind == "symlink":
                self.inodes[new].data = os.fsencode(os.readlink(child))
            else:
                self.inodes[new].data = load(child)  # a sparse file's holes left out

    def rel(self, path: str | os.PathLike[str]) -> str | None:
        absolute = os.path.abspath(os.fspath(path))
        base = os.fspath(self.universe)
        if absolute == base:
            return ""
        if not absolute.startswith(base + os.sep):
            return None
        return absolute[len(base) + 1 :]

    def lookup(self, path: str | os.PathLike[str]) -> int | None:
        rel = self.rel(path)
        if rel is None:
            return None
        ino = _UNIVERSE
        for part in rel.split("/") if rel else []:
            node = self.inodes[ino]
            if node.kind != "dir" or part not in node.entries:
                return None
            ino = node.entries[part]
        return ino

    def parent(self, path: str | os.PathLike[str]) -> tuple[int, str] | None:
        p = Path(os.path.abspath(os.fspath(path)))
        ino = self.lookup(p.parent)
        return None if ino is None or self.inodes[ino].kind != "dir" else (ino, p.name)

    def emit(
        self,
        kind: Literal["entry", "data", "sync"],
        inode: int,
        description: str,
        *,
        effects: tuple[tuple[str, int | None], ...] = (),
        data: Data = b"",
        by: Literal["library", "observed", "traced"] = "library",
        torn: Data | None = None,
        writes: tuple[Write, ...] | None = None,
        covers: int | None = None,
        began: int | None = None,
        commits: bool = True,
    ) -> None:
        self.ops.append(
            Op(
                len(self.ops), kind, inode, description, effects, data, by, torn, writes,
                covers, began, commits,
            )
        )  # fmt: skip
        if inode < 0:  # a sync of everything
            return
        node = self.inodes[inode]
        if kind == "entry":
            for name, child in effects:
                if child is None:
                    node.entries.pop(name, None)
                else:
                    node.entries[name] = child
        elif kind == "data":
            node.data = data

    def observe(self) -> None:
        """Log what changed on disk since the last look: the save function's writes."""
        self._observe_dir(_UNIVERSE, self.universe, "")

    def _observe_dir(self, ino: int, path: Path, rel: str) -> None:
        node = self.inodes[ino]
        try:
            names = [n for n in sorted(os.listdir(path)) if not self.ignores(n)]
        except (FileNotFoundError, NotADirectoryError):
            names = []
        for gone in sorted(set(node.entries) - set(names)):
            self.emit("entry", ino, f"unlink {rel}{gone}", effects=((gone, None),), by="observed")
        for name in names:
            child_path = path / name
            try:
                st = os.lstat(child_path)
            except FileNotFoundError:
                continue
            kind = _kind_of(st)
            if kind is None:
                continue
            child = node.entries.get(name)
            if (
                child is None
                or self.inodes[child].kind != kind
                or self.inodes[child].real != st.st_ino
            ):
                linked = self._linked(kind, st, child_path)
                if linked is not None:  # a hard link: a new name for a known file
                    self.emit(
                        "entry", ino, f"link {rel}{name}", effects=((name, linked),), by="observed"
                    )
                    self._observe_file(linked, child_path, st, f"{rel}{name}")
                    continue
                child = self._new(kind, st.st_ino)
                verb = {"dir": "mkdir", "file": "create", "symlink": "symlink"}[kind]
                if kind == "symlink":
                    target = os.readlink(child_path)
                    self.inodes[child].base_data = self.inodes[child].data = os.fsencode(target)
                    verb = f"symlink -> {target}:"
                self.emit(
                    "entry", ino, f"{verb} {rel}{name}", effects=((name, child),), by="observed"
                )
            if kind == "dir":
                self._observe_dir(child, child_path, f"{rel}{name}/")
            elif kind == "file":
                self._observe_file(child, child_path, st, f"{rel}{name}")

    def _linked(self, kind: _Kind, st: os.stat_result, path: Path) -> int | None:
        """The model inode of the file ``path`` is a hard link to, if any: a file with
        several names whose inode number and contents we already know."""
        if kind != "file" or st.st_nlink < 2:
            return None
        for i, inode in enumerate(self.inodes):
            if inode.kind == "file" and inode.real == st.st_ino and inode.data == path.read_bytes():
                return i
        return None

    def _observe_file(self, ino: int, path: Path, st: os.stat_result, rel: str) -> None:
        node = self.inodes[ino]
        stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        # Timestamps can be coarser than a rewrite: small files are always reread.
        if stamp == node.stamp and st.st_size > _SMALL:
            return
        node.stamp = stamp
        data = path.read_bytes()
        if data != node.data:
            self.emit("data", ino, f"write {rel} ({len(data)} bytes)", data=data, by="observed")
