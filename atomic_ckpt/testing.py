"""Power-loss simulation: check a save function against every state a crash could leave.

In the style of ALICE, CrashMonkey and LazyFS: run the save once on a scratch
directory while recording every filesystem operation it makes, then rebuild,
at every operation boundary, the states a power loss could leave on disk, and
run the real scanner and loader on each.

What is recorded:

* the library's own operations, by hooking :mod:`atomic_ckpt._fs` (the one
  module that makes the durability syscalls): fsyncs, renames, the marker
  write, tree removal;
* everything else (the files the save function wrote, ``mkdir`` of the
  staging directory, ``rmdir``): found by comparing the real tree with the
  model before each hooked operation. These are unsynced writes: a save
  function's own fsyncs are not seen, so its files count as volatile until the
  library fsyncs them (the conservative reading).

The model keeps, per inode, file data or directory entries. An fsync of a file
makes its data durable; an fsync of a directory makes its entries durable; a
rename is durable once its parent directory is fsynced. Three crash models:

``strict``
    Everything not fsynced is lost.
``ext4``
    Like ext4's ordered journal: every metadata operation before the last
    fsync survives (an fsync commits the journal, so an fsynced file survives
    with its entry), later ones survive as a prefix; file data written but not
    fsynced is lost, present, zero-filled at full length, or torn (truncated).
``subset``
    Any subset of the operations not yet covered by an fsync survives, in any
    combination (all of them, each one alone, all but one, and random subsets).

Not modelled: the order of the save function's own writes between two hooked
operations (they are logged in path order; only the ``ext4`` prefix depends on
it), renames it makes itself (they look like a delete and a create), its own
fsyncs, hard links, partial overwrites inside a file (a file's contents change
as a whole), and file metadata (modes, times, xattrs). Symlinks are created
whole. Every file version is kept in memory: simulate with a small model.

Typical use, on your own save function::

    from atomic_ckpt.testing import check_invariants, explore

    def save(ckpts):
        with ckpts.commit(1) as path:
            model.save_pretrained(path)

    report = explore(save)
    assert report.ok, report

``explore`` passes ``save`` a :class:`~atomic_ckpt.CheckpointDir` on a scratch
root; the checker gets a :class:`CrashState` (a rebuilt root on disk, what
each step may hold at that moment, and a description of which operations
survived) and raises ``AssertionError`` to reject it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import random
import re
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from . import _fs, _repair
from ._checkpoint import CheckpointDir
from ._commit import Commit
from ._errors import CheckpointError
from ._manifest import Manifest
from ._names import MARKER, ROOT_LOCK, TAG_OLD, TMP_INFIX, parse_step, parse_tmp, step_name
from ._read import classify
from ._root import Root
from ._sync import SyncPolicy

__all__ = [
    "MODELS",
    "STEPS",
    "Checker",
    "CrashState",
    "Expectation",
    "Failure",
    "InvariantViolation",
    "Op",
    "Recording",
    "Replace",
    "Report",
    "Tree",
    "Version",
    "check_invariants",
    "explore",
    "mutant",
    "read_tree",
    "record",
]

Model: TypeAlias = Literal["strict", "ext4", "subset"]
MODELS: tuple[Model, ...] = ("strict", "ext4", "subset")
"""Every crash model, in the order :func:`explore` tries them at each crash point."""

DataFate: TypeAlias = Literal["lost", "kept", "zero", "torn"]
"""What a crash does to data written but not fsynced: dropped, kept, zero-filled
at full length, or truncated to half its length."""

_Kind: TypeAlias = Literal["file", "dir", "symlink"]
_MARKER_TMP_PREFIX = MARKER + TMP_INFIX
_TOKEN_RE = re.compile(r"[0-9a-f]{32}")
_ROOT_NAME = "ckpts"
_UNIVERSE = 0  # the inode of the scratch directory that holds the root
_SMALL = 1 << 20


# --------------------------------------------------------------------------- results


class InvariantViolation(AssertionError):
    """A crash state breaks one of the invariants of PROTOCOL.md (``I1`` to ``I4``)."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.detail = message


@dataclass(frozen=True)
class Tree:
    """What one checkpoint directory holds, its marker aside."""

    files: Mapping[str, bytes]
    dirs: frozenset[str]
    links: Mapping[str, str]

    def summary(self) -> str:
        parts = [f"{p} ({len(b)} bytes)" for p, b in sorted(self.files.items())]
        parts += [f"{d}/" for d in sorted(self.dirs)]
        parts += [f"{p} -> {t}" for p, t in sorted(self.links.items())]
        return ", ".join(parts) or "(empty)"


@dataclass(frozen=True)
class Version:
    """The contents one save (or the initial state) gave a step."""

    step: int
    label: str
    """``initial``, ``commit #i`` or ``mark_complete #i`` (i counts the recorded saves)."""
    tree: Tree
    marker: bytes | None
    """The marker's bytes (empty: legacy), or None when unknown (the save raised)."""

    def matches(self, tree: Tree, marker: bytes | None) -> bool:
        return self.tree == tree and (self.marker is None or self.marker == marker)


@dataclass(frozen=True)
class Expectation:
    """What a step may show at one crash point."""

    step: int
    allowed: tuple[Version, ...]
    """The contents it may hold: the last save that returned (or the initial
    contents) and every save of it in flight."""
    stale: tuple[Version, ...]
    """Older saves: showing one of these loses a commit that returned (I2)."""
    required: bool
    """A save of it returned (or it was complete at the start) and no deletion began."""
    replacing: bool
    """A save that replaces a required version is in flight."""


@dataclass(frozen=True)
class CrashState:
    """One state a crash could leave, rebuilt on disk for a checker."""

    root: Path
    """The rebuilt checkpoint root (it may be missing: a crash can lose it)."""
    prefix: str
    sync: SyncPolicy
    """The durability steps the recorded commits performed."""
    model: str
    crash_point: int
    """How many recorded operations ran before the crash."""
    expected: Mapping[int, Expectation]
    description: str
    moved_aside: bool = False
    """The move-aside replace ran (RENAME_EXCHANGE unsupported, or ``replace="aside"``):
    its one documented window may hide a step until ``clean()``."""

    def checkpoints(self) -> CheckpointDir:
        """A non-durable CheckpointDir on the rebuilt root (checks never need fsync)."""
        return CheckpointDir(self.root, prefix=self.prefix, durable=False)


Checker: TypeAlias = Callable[[CrashState], object]
"""Raises (``AssertionError``, or anything) to reject a crash state."""


@dataclass(frozen=True)
class Op:
    """One recorded filesystem operation."""

    index: int
    kind: Literal["entry", "data", "sync"]
    """``entry``: directory entries change (create, mkdir, rename, unlink);
    ``data``: a file's contents change; ``sync``: an fsync."""
    inode: int
    """The directory (entry), file (data) or fsynced inode (sync)."""
    description: str
    effects: tuple[tuple[str, int | None], ...] = ()
    """entry ops: (name, inode or None for removed), applied atomically."""
    data: bytes = b""
    by: Literal["library", "observed"] = "library"
    """``library``: a hooked call into ``atomic_ckpt._fs``; ``observed``: found by
    comparing the tree with the model (the save function's writes, ``mkdir``)."""


@dataclass(frozen=True)
class Failure:
    """A crash state the checker rejected."""

    model: str
    crash_point: int
    invariant: str | None
    """``I1``..``I4`` for an :class:`InvariantViolation`, else None."""
    message: str
    description: str

    def __str__(self) -> str:
        return f"{self.message}\n{self.description}"


@dataclass(frozen=True)
class Report:
    """The outcome of :func:`explore`."""

    ops: tuple[Op, ...]
    states_generated: int
    """Crash states generated, duplicates included."""
    states_checked: int
    """Distinct crash states the checker ran on (distinct tree and expectations)."""
    checked_by_model: Mapping[str, int]
    failures: tuple[Failure, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failure(self) -> Failure | None:
        """The first rejected state (earliest crash point), or None."""
        return self.failures[0] if self.failures else None

    def __str__(self) -> str:
        head = (
            f"{len(self.ops)} operations recorded, {self.states_checked} distinct crash "
            f"states checked ({self.states_generated} generated)"
        )
        if self.ok:
            return head + ": all passed"
        return f"{head}: {len(self.failures)} rejected; the first:\n{self.failures[0]}"


# --------------------------------------------------------------------------- trees


def read_tree(directory: Path) -> Tree:
    """The contents of a checkpoint directory on disk, without its marker (or marker temps)."""
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    links: dict[str, str] = {}

    def walk(path: Path, rel: str) -> None:
        for name in sorted(os.listdir(path)):
            if not rel and (name == MARKER or name.startswith(_MARKER_TMP_PREFIX)):
                continue
            child = path / name
            st = os.lstat(child)
            if stat.S_ISLNK(st.st_mode):
                links[rel + name] = os.readlink(child)
            elif stat.S_ISDIR(st.st_mode):
                dirs.add(rel + name)
                walk(child, f"{rel}{name}/")
            elif stat.S_ISREG(st.st_mode):
                files[rel + name] = child.read_bytes()

    walk(directory, "")
    return Tree(files, frozenset(dirs), links)


def _read_marker_bytes(directory: Path) -> bytes | None:
    try:
        return (directory / MARKER).read_bytes()
    except OSError:
        return None


# --------------------------------------------------------------------------- the model


@dataclass
class _Inode:
    kind: _Kind
    base_data: bytes = b""
    """Durable contents at the start (a new file starts empty; a symlink: its target)."""
    base_entries: dict[str, int] = field(default_factory=dict)
    data: bytes = b""
    """Contents now (the live filesystem, as recorded)."""
    entries: dict[str, int] = field(default_factory=dict)
    real: int | None = None
    """st_ino of the live file, to notice a name that now means another file."""
    stamp: tuple[int, int, int] | None = None


@dataclass
class _Save:
    kind: Literal["commit", "mark_complete", "delete"]
    steps: tuple[int, ...]
    start: int
    tree: Tree | None = None
    marker: bytes | None = None
    end: int | None = None
    """Operations recorded when it returned; None if it raised."""


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


class _Recorder:
    """Mirrors the live scratch tree in the model and logs every change as an Op."""

    def __init__(self, universe: Path, root: Path, prefix: str) -> None:
        self.universe = universe
        self.root = root
        self.prefix = prefix
        self.inodes: list[_Inode] = []
        self.ops: list[Op] = []
        self.saves: list[_Save] = []
        self.lock = threading.RLock()
        self.busy = False
        self.moved_aside = False
        self._new("dir", os.lstat(universe).st_ino)  # inode 0: the universe, durable by assumption
        self._load(_UNIVERSE, universe)
        for inode in self.inodes:
            inode.base_data, inode.base_entries = inode.data, dict(inode.entries)
        self.initial = self._initial_versions()

    # ---- the live tree

    def _new(self, kind: _Kind, real: int | None) -> int:
        self.inodes.append(_Inode(kind, real=real))
        return len(self.inodes) - 1

    def _load(self, ino: int, path: Path) -> None:
        """Adopt the existing tree under ``path`` as the (durable) starting state."""
        for name in sorted(os.listdir(path)):
            if _ignored(name):
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
                self.inodes[new].data = child.read_bytes()

    def _initial_versions(self) -> dict[int, Version]:
        out: dict[int, Version] = {}
        if not self.root.is_dir():
            return out
        for name in sorted(os.listdir(self.root)):
            step = parse_step(name, self.prefix)
            path = self.root / name
            if step is None or not path.is_dir() or path.is_symlink():
                continue
            if classify(path, step).status == "complete":
                out[step] = Version(step, "initial", read_tree(path), _read_marker_bytes(path))
        return out

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
        data: bytes = b"",
        by: Literal["library", "observed"] = "library",
    ) -> None:
        self.ops.append(Op(len(self.ops), kind, inode, description, effects, data, by))
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
            names = [n for n in sorted(os.listdir(path)) if not _ignored(n)]
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

    # ---- the hooks on atomic_ckpt._fs

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        hooks: dict[str, Callable[..., Any]] = {
            "fsync_file": self._fsync,
            "fsync_dir": self._fsync,
            "rename": self._rename,
            "rename_noreplace": self._rename_noreplace,
            "rename_exchange": self._rename_exchange,
            "write_file_durable": self._write_file_durable,
            "remove_tree": self._remove_tree,
        }
        saved: list[tuple[object, str, object]] = []

        def patch(obj: object, name: str, value: object) -> None:
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        try:
            for name, hook in hooks.items():
                patch(_fs, name, self._guard(hook, getattr(_fs, name)))
            patch(Commit, "publish", self._publish_hook(Commit.publish))
            patch(CheckpointDir, "mark_complete", self._adopt_hook(CheckpointDir.mark_complete))
            patch(_repair, "move_aside", self._delete_hook(_repair.move_aside))
            yield
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)

    def _guard(self, hook: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                if self.busy:
                    return real(*args, **kwargs)
                self.busy = True
                try:
                    self.observe()
                    return hook(real, *args, **kwargs)
                finally:
                    self.busy = False

        return wrapper

    def _fsync(self, real: Callable[[Path], None], path: Path) -> None:
        # The real fsync is skipped: the scratch tree needs no durability, the
        # model records it.
        ino = self.lookup(path)
        if ino is None:
            real(path)  # outside the scratch tree, or missing: let it fail
            return
        self.emit("sync", ino, f"fsync {self.rel(path) or '.'}")

    def _rename_effects(self, src: Path, dst: Path, verb: str, *, exchange: bool = False) -> None:
        sp, dp = self.parent(src), self.parent(dst)
        moved, other = self.lookup(src), self.lookup(dst)
        if sp is None or dp is None or moved is None:
            return
        arrow = "<->" if exchange else "->"
        desc = f"{verb} {self.rel(src)} {arrow} {self.rel(dst)}"
        if exchange:
            assert other is not None
            if sp[0] == dp[0]:
                self.emit("entry", sp[0], desc, effects=((sp[1], other), (dp[1], moved)))
            else:
                self.emit("entry", dp[0], desc + " (new side)", effects=((dp[1], moved),))
                self.emit("entry", sp[0], desc + " (old side)", effects=((sp[1], other),))
        elif sp[0] == dp[0]:
            self.emit("entry", sp[0], desc, effects=((sp[1], None), (dp[1], moved)))
        else:  # two directories: modelled as two entry operations
            self.emit("entry", dp[0], desc + " (link)", effects=((dp[1], moved),))
            self.emit("entry", sp[0], desc + " (unlink)", effects=((sp[1], None),))

    def _rename(self, real: Callable[[Path, Path], None], src: Path, dst: Path) -> None:
        real(src, dst)
        tmp = parse_tmp(Path(dst).name)
        if tmp is not None and tmp.tag == TAG_OLD:
            self.moved_aside = True
        self._rename_effects(src, dst, "rename")

    def _rename_noreplace(self, real: Callable[[Path, Path], None], src: Path, dst: Path) -> None:
        real(src, dst)
        self._rename_effects(src, dst, "rename (noreplace)")

    def _rename_exchange(self, real: Callable[[Path, Path], None], a: Path, b: Path) -> None:
        real(a, b)
        self._rename_effects(a, b, "exchange", exchange=True)

    def _write_file_durable(
        self,
        real: Callable[..., None],
        path: Path,
        data: bytes,
        *,
        tmp: Path | None,
        sync: bool,
    ) -> None:
        real(path, data, tmp=tmp, sync=False)  # the fsync is recorded, not made
        where = self.parent(path)
        if where is None:
            return
        directory, name = where
        if tmp is not None:
            new = self._new("file", os.lstat(path).st_ino)
            tmp_name = Path(tmp).name
            self.emit("entry", directory, f"create {self.rel(tmp)}", effects=((tmp_name, new),))
            self.emit("data", new, f"write {self.rel(tmp)} ({len(data)} bytes)", data=data)
            if sync:
                self.emit("sync", new, f"fsync {self.rel(tmp)}")
            self.emit(
                "entry",
                directory,
                f"rename {self.rel(tmp)} -> {self.rel(path)}",
                effects=((tmp_name, None), (name, new)),
            )
            return
        existing = self.inodes[directory].entries.get(name)
        if existing is not None and self.inodes[existing].kind == "file":
            target = existing
            if self.inodes[target].data:
                self.emit("data", target, f"truncate {self.rel(path)} (O_TRUNC)", data=b"")
        else:
            target = self._new("file", None)
            self.emit("entry", directory, f"create {self.rel(path)}", effects=((name, target),))
        self.inodes[target].real = os.lstat(path).st_ino
        self.emit("data", target, f"write {self.rel(path)} ({len(data)} bytes)", data=data)
        if sync:
            self.emit("sync", target, f"fsync {self.rel(path)}")

    def _remove_tree(self, real: Callable[[Path], None], path: Path) -> None:
        where, ino = self.parent(path), self.lookup(path)
        real(path)
        if where is None or ino is None:
            return
        if self.inodes[ino].kind == "dir" and MARKER in self.inodes[ino].entries:
            # remove_tree unlinks the marker first
            self.emit("entry", ino, f"unlink {self.rel(path)}/{MARKER}", effects=((MARKER, None),))
        self._remove_below(ino, self.rel(path) or "")
        self.emit("entry", where[0], f"remove {self.rel(path)}", effects=((where[1], None),))

    def _remove_below(self, ino: int, rel: str) -> None:
        node = self.inodes[ino]
        if node.kind != "dir":
            return
        for name in sorted(node.entries):
            child = node.entries[name]
            self._remove_below(child, f"{rel}/{name}")
            self.emit("entry", ino, f"unlink {rel}/{name}", effects=((name, None),))

    # ---- the hooks on CheckpointDir: where each save starts and returns

    def _mine(self, ckpts: CheckpointDir) -> bool:
        return self.rel(ckpts.root) is not None

    def _begin(self, save: _Save) -> _Save:
        self.saves.append(save)
        return save

    def _publish_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def publish(commit: Commit, *a: Any, **kw: Any) -> Any:
            if self.rel(commit.path) is None or commit.state != "open":
                return real(commit, *a, **kw)
            with self.lock:
                self.observe()
            tree = read_tree(commit.path)
            save = self._begin(_Save("commit", (commit.step,), len(self.ops), tree=tree))
            result = real(commit, *a, **kw)
            save.marker = _read_marker_bytes(commit.final)
            save.end = len(self.ops)
            return result

        return publish

    def _adopt_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def mark_complete(ckpts: CheckpointDir, step: int) -> Any:
            if not self._mine(ckpts):
                return real(ckpts, step)
            path = ckpts.path_of(step)
            with self.lock:
                self.observe()
            tree = read_tree(path) if path.is_dir() and not path.is_symlink() else None
            save = self._begin(_Save("mark_complete", (step,), len(self.ops), tree=tree))
            result = real(ckpts, step)
            save.marker = _read_marker_bytes(path)
            save.end = len(self.ops)
            return result

        return mark_complete

    def _delete_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def move_aside(root: Root, paths: list[Path]) -> Any:
            if self.rel(root.path) is None:
                return real(root, paths)
            steps = tuple(
                s for s in (parse_step(Path(p).name, root.prefix) for p in paths) if s is not None
            )
            with self.lock:
                self.observe()
            save = self._begin(_Save("delete", steps, len(self.ops)))
            result = real(root, paths)
            save.end = len(self.ops)
            return result

        return move_aside


# --------------------------------------------------------------------------- crash states


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the scanner's warnings about the broken directories a crash state is full of."""
    log = logging.getLogger("atomic_ckpt")
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


@dataclass(frozen=True)
class _Candidate:
    crash_point: int
    model: str
    persisted: frozenset[int]
    fates: Mapping[int, DataFate]
    note: str


_Flat: TypeAlias = tuple[tuple[str, str, bytes], ...]


class Recording:
    """A recorded run: its operations, its saves, and the crash states they allow.

    Made by :func:`record` (a context manager); :meth:`explore` checks every
    crash state, :meth:`check` one chosen state.
    """

    def __init__(
        self,
        recorder: _Recorder,
        scratch: Path,
        *,
        prefix: str,
        sync: SyncPolicy,
        replace: Replace,
    ) -> None:
        self._rec = recorder
        self._scratch = scratch
        self.prefix = prefix
        self.sync = sync
        self.replace = replace
        self.ops: tuple[Op, ...] = tuple(recorder.ops)
        self._inodes = recorder.inodes
        self._root_rel = recorder.rel(recorder.root) or ""
        # For each op: the index of the first later fsync of its inode.
        never = len(self.ops) + 1
        self._next_sync = [never] * len(self.ops)
        pending: dict[int, list[int]] = {}
        for op in self.ops:
            if op.kind == "sync":
                for i in pending.pop(op.inode, []):
                    self._next_sync[i] = op.index
            else:
                pending.setdefault(op.inode, []).append(op.index)

    # ---- the model

    def covered(self, k: int) -> frozenset[int]:
        """Operations among the first ``k`` that an fsync among them made durable."""
        return frozenset(
            op.index for op in self.ops[:k] if op.kind != "sync" and self._next_sync[op.index] < k
        )

    def uncovered(self, k: int) -> tuple[int, ...]:
        """Operations among the first ``k`` that a crash after them may or may not keep."""
        return tuple(
            op.index for op in self.ops[:k] if op.kind != "sync" and self._next_sync[op.index] >= k
        )

    def expectations(self, k: int) -> dict[int, Expectation]:
        """What each step may show after a crash that lets the first ``k`` operations run."""
        steps = set(self._rec.initial)
        for s in self._rec.saves:
            steps.update(s.steps)
        out: dict[int, Expectation] = {}
        for step in sorted(steps):
            initial = self._rec.initial.get(step)
            current: list[Version] = [initial] if initial is not None else []
            every: list[Version] = list(current)
            required = initial is not None
            replacing = False
            for i, s in enumerate(self._rec.saves):
                if step not in s.steps or s.start > k:
                    continue
                if s.kind == "delete":
                    required = False
                    continue
                assert s.tree is not None or s.kind == "mark_complete"
                if s.tree is None:
                    continue
                v = Version(step, f"{s.kind} #{i}", s.tree, s.marker)
                every.append(v)
                if s.end is not None and s.end <= k:
                    current, required, replacing = [v], True, False
                else:
                    replacing = replacing or required
                    current.append(v)
            stale = tuple(v for v in every if all(v is not c for c in current))
            out[step] = Expectation(step, tuple(current), stale, required, replacing)
        return out

    def _context(self, k: int) -> tuple[tuple[int, int], ...]:
        def status(s: _Save) -> int:
            if s.start > k:
                return 0
            return 2 if s.end is not None and s.end <= k else 1

        return tuple((i, status(s)) for i, s in enumerate(self._rec.saves))

    def _build(self, persisted: Collection[int], fates: Mapping[int, DataFate]) -> _Flat:
        entries = {i: dict(n.base_entries) for i, n in enumerate(self._inodes) if n.kind == "dir"}
        data = {i: n.base_data for i, n in enumerate(self._inodes) if n.kind != "dir"}
        for i in sorted(persisted):
            op = self.ops[i]
            if op.kind == "entry":
                d = entries[op.inode]
                for name, child in op.effects:
                    if child is None:
                        d.pop(name, None)
                    else:
                        d[name] = child
            elif op.kind == "data":
                fate = fates.get(i, "kept")
                if fate == "zero":
                    data[op.inode] = bytes(len(op.data))
                elif fate == "torn":
                    data[op.inode] = op.data[: len(op.data) // 2]
                elif fate == "kept":
                    data[op.inode] = op.data
        flat: list[tuple[str, str, bytes]] = []
        seen: set[int] = set()

        def walk(ino: int, rel: str) -> None:
            for name in sorted(entries[ino]):
                child = entries[ino][name]
                if child in seen:  # a directory can hang in one place only
                    continue
                seen.add(child)
                kind = self._inodes[child].kind
                path = f"{rel}{name}"
                if kind == "dir":
                    flat.append((path, "dir", b""))
                    walk(child, path + "/")
                else:
                    flat.append((path, kind, data[child]))

        walk(_UNIVERSE, "")
        return tuple(flat)

    def _materialize(self, flat: _Flat) -> Path:
        top = self._scratch / "state"
        if top.exists():
            shutil.rmtree(top)
        top.mkdir()
        for path, kind, payload in flat:
            target = top / path
            if kind == "dir":
                target.mkdir()
            elif kind == "symlink":
                os.symlink(os.fsdecode(payload), target)
            else:
                target.write_bytes(payload)
        return top / self._root_rel

    # ---- the crash models

    def candidates(
        self, models: Sequence[str] = MODELS, *, samples: int = 16, seed: int = 0
    ) -> Iterator[_Candidate]:
        """Every crash state of the models, crash point by crash point."""
        unknown = set(models) - set(MODELS)
        if unknown:
            raise ValueError(f"unknown crash models {sorted(unknown)}; choose from {MODELS}")
        rng = random.Random(seed)
        for k in range(len(self.ops) + 1):
            covered = self.covered(k)
            loose = self.uncovered(k)
            for model in models:
                if model == "strict":
                    yield _Candidate(k, "strict", covered, {}, "everything not fsynced lost")
                elif model == "ext4":
                    yield from self._ext4(k, covered, loose, rng, samples)
                else:
                    yield from self._subset(k, covered, loose, rng, samples)

    def _ext4(
        self,
        k: int,
        covered: frozenset[int],
        loose: tuple[int, ...],
        rng: random.Random,
        samples: int,
    ) -> Iterator[_Candidate]:
        last_sync = max((op.index for op in self.ops[:k] if op.kind == "sync"), default=-1)
        journaled = {i for i in loose if self.ops[i].kind == "entry" and i < last_sync}
        tail = [i for i in loose if self.ops[i].kind == "entry" and i > last_sync]
        unsynced = [i for i in loose if self.ops[i].kind == "data"]
        fates_all: list[DataFate] = ["lost", "kept", "zero", "torn"]
        for j in range(len(tail) + 1):
            meta = covered | journaled | set(tail[:j])
            kept = (
                f"journal kept metadata ops before #{tail[j]}"
                if j < len(tail)
                else ("journal kept every metadata op")
            )
            choices: list[dict[int, DataFate]] = [dict.fromkeys(unsynced, f) for f in fates_all]
            if len(unsynced) > 1:
                choices += [
                    {i: rng.choice(fates_all) for i in unsynced}
                    for _ in range(max(1, samples // 4))
                ]
            for fates in choices:
                persisted = frozenset(meta | {i for i in unsynced if fates[i] != "lost"})
                yield _Candidate(k, "ext4", persisted, fates, kept)

    def _subset(
        self,
        k: int,
        covered: frozenset[int],
        loose: tuple[int, ...],
        rng: random.Random,
        samples: int,
    ) -> Iterator[_Candidate]:
        if not loose:
            return
        picks: list[frozenset[int]] = [frozenset(loose)]
        picks += [frozenset({i}) for i in loose]
        picks += [frozenset(loose) - {i} for i in loose]
        picks += [frozenset(i for i in loose if rng.random() < 0.5) for _ in range(samples)]
        for pick in picks:
            yield _Candidate(k, "subset", covered | pick, {}, "a subset of unsynced ops kept")

    # ---- checking

    def describe(self, c: _Candidate, flat: _Flat) -> str:
        """A readable account of a crash state: each operation's fate, and what is on disk."""
        tokens: dict[str, str] = {}

        def short(text: str) -> str:
            return _TOKEN_RE.sub(lambda m: tokens.setdefault(m[0], f"<t{len(tokens) + 1}>"), text)

        last = (
            f": #{c.crash_point - 1} {self.ops[c.crash_point - 1].description}"
            if c.crash_point
            else ""
        )
        lines = [
            f"[{c.model}] crash after {c.crash_point} of {len(self.ops)} operations{last}"
            f" ({c.note})"
        ]
        covered = self.covered(c.crash_point)
        for op in self.ops[: c.crash_point]:
            if op.kind == "sync":
                fate = ""
            elif op.index in covered:
                fate = "durable"
            elif op.index in c.persisted:
                fate = {"zero": "ZERO-FILLED", "torn": "TORN (half)"}.get(
                    c.fates.get(op.index, "kept"), "kept (not fsynced)"
                )
            else:
                fate = "LOST"
            who = "" if op.by == "library" else " [observed]"
            lines.append(f"  #{op.index:<3} {short(op.description)}{who}  {fate}".rstrip())
        lines.append("  on disk after the crash:")
        lines += [
            f"    {short(p)}{'/' if k == 'dir' else ''}"
            + (
                f" ({len(b)} bytes{', all zero' if b and not any(b) else ''})"
                if k == "file"
                else ""
            )
            + (f" -> {os.fsdecode(b)}" if k == "symlink" else "")
            for p, k, b in flat
        ] or ["    (nothing)"]
        return "\n".join(lines)

    def _run(self, c: _Candidate, flat: _Flat, checker: Checker) -> Failure | None:
        root = self._materialize(flat)
        description = self.describe(c, flat)
        state = CrashState(
            root=root,
            prefix=self.prefix,
            sync=self.sync,
            model=c.model,
            crash_point=c.crash_point,
            expected=self.expectations(c.crash_point),
            description=description,
            moved_aside=self._rec.moved_aside or self.replace == "aside",
        )
        try:
            with _quiet():
                checker(state)
        except Exception as exc:
            invariant = exc.invariant if isinstance(exc, InvariantViolation) else None
            message = str(exc) if isinstance(exc, AssertionError) else f"checker raised {exc!r}"
            return Failure(c.model, c.crash_point, invariant, message, description)
        return None

    def check(
        self,
        crash_point: int,
        *,
        persisted: Collection[int] = (),
        fates: Mapping[int, DataFate] | None = None,
        checker: Checker | None = None,
    ) -> Failure | None:
        """Check one crash state: the first ``crash_point`` ops ran, the fsynced ones are
        durable, and of the rest exactly ``persisted`` survived (their data with ``fates``)."""
        loose = set(self.uncovered(crash_point))
        if not set(persisted) <= loose:
            raise ValueError(f"ops {sorted(set(persisted) - loose)} are not unsynced at that point")
        fates = dict(fates or {})
        kept = frozenset(persisted) | {i for i, f in fates.items() if f != "lost" and i in loose}
        c = _Candidate(crash_point, "chosen", self.covered(crash_point) | kept, fates, "chosen")
        flat = self._build(c.persisted, c.fates)
        return self._run(c, flat, checker or check_invariants)

    def explore(
        self,
        checker: Checker | None = None,
        *,
        models: Sequence[str] = MODELS,
        samples: int = 16,
        seed: int = 0,
        keep_going: bool = False,
    ) -> Report:
        """Run ``checker`` on every distinct crash state of ``models``; stop at the first
        rejected one unless ``keep_going``."""
        checker = checker or check_invariants
        seen: set[tuple[bytes, tuple[tuple[int, int], ...]]] = set()
        by_model: dict[str, int] = dict.fromkeys(models, 0)
        failures: list[Failure] = []
        generated = 0
        context_at: dict[int, tuple[tuple[int, int], ...]] = {}
        for c in self.candidates(models, samples=samples, seed=seed):
            generated += 1
            flat = self._build(c.persisted, c.fates)
            ctx = context_at.get(c.crash_point)
            if ctx is None:
                ctx = context_at[c.crash_point] = self._context(c.crash_point)
            key = (hashlib.blake2b(repr(flat).encode(), digest_size=16).digest(), ctx)
            if key in seen:
                continue
            seen.add(key)
            by_model[c.model] += 1
            failure = self._run(c, flat, checker)
            if failure is not None:
                failures.append(failure)
                if not keep_going:
                    break
        return Report(self.ops, generated, len(seen), by_model, tuple(failures))


def _default_workdir() -> str | None:
    """A RAM-backed directory where there is one: each crash state is rebuilt on disk,
    and tmpfs creates and removes small trees about ten times faster than a disk."""
    shm = "/dev/shm"
    if sys.platform.startswith("linux") and os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


Replace: TypeAlias = Literal["exchange", "aside", "delete"]
"""How a recorded commit replaces an existing step: ``exchange`` (RENAME_EXCHANGE,
the library's way where the filesystem has it), ``aside`` (the move-aside fallback,
as where it has not), or ``delete`` (a protocol mutant: delete the old step, then
rename the new one, the window with neither that the library exists to avoid)."""


@contextlib.contextmanager
def _replacing(mode: Replace) -> Iterator[None]:
    """Make ``atomic_ckpt._fs.rename_exchange`` behave as ``mode`` says, for a recording."""
    if mode == "exchange":
        yield
        return
    hooked = _fs.rename_exchange

    def unsupported(a: Path, b: Path) -> None:
        raise OSError(errno.ENOSYS, "RENAME_EXCHANGE switched off by atomic_ckpt.testing", str(a))

    def delete_then_rename(a: Path, b: Path) -> None:
        _fs.remove_tree(b)
        _fs.rename(a, b)

    _fs.rename_exchange = unsupported if mode == "aside" else delete_then_rename
    try:
        yield
    finally:
        _fs.rename_exchange = hooked


@contextlib.contextmanager
def record(
    save: Callable[[CheckpointDir], object],
    *,
    setup: Callable[[CheckpointDir], object] | None = None,
    sync: SyncPolicy | None = None,
    replace: Replace = "exchange",
    prefix: str = "",
    checksum: str | None = "crc32",
    workdir: str | os.PathLike[str] | None = None,
) -> Iterator[Recording]:
    """Run ``save`` on a scratch checkpoint root and record what it does to the filesystem.

    ``setup`` runs first, unrecorded: what it leaves is the durable starting
    state (earlier checkpoints, a legacy directory to adopt). ``sync`` replaces
    the durability steps (the mutation tests switch single steps off, see
    :mod:`atomic_ckpt.testing` ``mutant``); ``replace`` chooses how an existing
    step is replaced. The scratch directory is made in ``workdir`` (default:
    ``/dev/shm`` where writable, else the system temp dir) and removed
    afterwards. Yields a :class:`Recording`.
    """
    where = workdir if workdir is not None else _default_workdir()
    scratch = Path(tempfile.mkdtemp(prefix="atomic_ckpt-crash-", dir=where)).resolve()
    policy = sync if sync is not None else SyncPolicy()
    try:
        universe = scratch / "fs"
        universe.mkdir()
        # One worker: the tree is fsynced inline, in a reproducible order.
        ckpts = CheckpointDir(
            universe / _ROOT_NAME, prefix=prefix, checksum=checksum, workers=1, sync=policy
        )
        if setup is not None:
            setup(ckpts)
        recorder = _Recorder(universe, ckpts.root, prefix)
        with recorder.hooked(), _replacing(replace):
            save(ckpts)
        recorder.observe()
        yield Recording(recorder, scratch, prefix=prefix, sync=policy, replace=replace)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def explore(
    save: Callable[[CheckpointDir], object],
    checker: Checker | None = None,
    *,
    setup: Callable[[CheckpointDir], object] | None = None,
    models: Sequence[str] = MODELS,
    samples: int = 16,
    seed: int = 0,
    keep_going: bool = False,
    sync: SyncPolicy | None = None,
    replace: Replace = "exchange",
    prefix: str = "",
    checksum: str | None = "crc32",
    workdir: str | os.PathLike[str] | None = None,
) -> Report:
    """Record ``save`` once, then check every crash state it allows; return a :class:`Report`.

    ``save`` gets a :class:`~atomic_ckpt.CheckpointDir` on a scratch root and
    commits through it (``with ckpts.commit(step) as path: ...``).
    ``checker`` (default :func:`check_invariants`) gets each :class:`CrashState`
    and raises ``AssertionError`` to reject it. ``samples`` bounds the random
    subsets tried per crash point (the ``subset`` model) and the random per-file
    data fates (``ext4``); ``seed`` makes them reproducible.
    """
    with record(
        save,
        setup=setup,
        sync=sync,
        replace=replace,
        prefix=prefix,
        checksum=checksum,
        workdir=workdir,
    ) as rec:
        return rec.explore(
            checker, models=models, samples=samples, seed=seed, keep_going=keep_going
        )


# --------------------------------------------------------------------------- mutants

STEPS = ("file", "subdir", "marker", "marker_tmp", "staging", "root")
"""The durability steps of :class:`~atomic_ckpt.SyncPolicy` a mutant can switch off:
each fsync method, and ``marker_tmp`` (the marker written in place where a
temporary name was asked for)."""


class _Mutant(SyncPolicy):
    def __init__(self, off: str) -> None:
        self.off = off

    def file(self, path: Path) -> None:
        if self.off != "file":
            super().file(path)

    def subdir(self, path: Path) -> None:
        if self.off != "subdir":
            super().subdir(path)

    def marker(self, directory: Path, data: bytes, *, tmp: Path | None) -> None:
        if self.off == "marker":
            _fs.write_file_durable(directory / MARKER, data, tmp=tmp, sync=False)
        else:
            super().marker(directory, data, tmp=None if self.off == "marker_tmp" else tmp)

    def staging(self, path: Path) -> None:
        if self.off != "staging":
            super().staging(path)

    def root(self, path: Path) -> None:
        if self.off != "root":
            super().root(path)

    def __repr__(self) -> str:
        return f"mutant(without={self.off!r})"


def mutant(without: str) -> SyncPolicy:
    """The full :class:`~atomic_ckpt.SyncPolicy` with one step (one of :data:`STEPS`)
    switched off: a protocol the crash simulation must reject."""
    if without not in STEPS:
        raise ValueError(f"unknown step {without!r}; choose one of {STEPS}")
    return _Mutant(without)


# --------------------------------------------------------------------------- invariants


def _complete_by_hand(root: Path, prefix: str) -> list[int]:
    """The complete steps of ``root`` read without the scanner (an independent check of I4)."""
    out: list[int] = []
    if not root.is_dir():
        return out
    for name in os.listdir(root):
        step = parse_step(name, prefix)
        path = root / name
        if step is None or path.is_symlink() or not path.is_dir():
            continue
        marker = path / MARKER
        if marker.is_symlink() or not marker.is_file():
            continue
        try:
            Manifest.from_bytes(marker.read_bytes())
        except CheckpointError:
            continue
        out.append(step)
    return sorted(out)


def _check_once(state: CrashState, when: str, *, window: bool) -> None:
    ckpts = state.checkpoints()
    found = ckpts.checkpoints()
    steps = [c.step for c in found]
    latest = ckpts.latest()
    by_hand = _complete_by_hand(state.root, state.prefix)
    if steps != by_hand:
        raise InvariantViolation(
            "I4", f"{when}the scanner reports steps {steps}, but the complete ones are {by_hand}"
        )
    if (latest.step if latest else None) != (steps[-1] if steps else None):
        raise InvariantViolation(
            "I4",
            f"{when}latest() is {latest and latest.step}, the highest complete step is "
            f"{steps[-1] if steps else None}",
        )
    for c in found:
        if c.path.name != step_name(state.prefix, c.step) or TMP_INFIX in c.path.name:
            raise InvariantViolation("I4", f"{when}{c.path.name} was reported as step {c.step}")
        e = state.expected.get(c.step)
        if e is None:
            raise InvariantViolation("I4", f"{when}step {c.step} is reported but was never saved")
        try:
            ckpts.verify(c.step)
        except CheckpointError as exc:
            raise InvariantViolation(
                "I1", f"{when}step {c.step} is reported complete but does not verify: {exc}"
            ) from None
        tree, marker = read_tree(c.path), _read_marker_bytes(c.path)
        if any(v.matches(tree, marker) for v in e.allowed):
            continue
        if any(v.matches(tree, marker) for v in e.stale):
            old = next(v for v in e.stale if v.matches(tree, marker))
            raise InvariantViolation(
                "I2",
                f"{when}step {c.step} shows {old.label}, older than "
                f"{e.allowed[0].label} which returned before the crash",
            )
        raise InvariantViolation(
            "I1",
            f"{when}step {c.step} holds contents no single save wrote: {tree.summary()}; "
            f"marker {len(marker or b'')} bytes; saves: "
            + "; ".join(f"{v.label}: {v.tree.summary()}" for v in e.allowed + e.stale),
        )
    for step, e in state.expected.items():
        if e.required and step not in steps:
            if e.replacing:
                if not window:
                    raise InvariantViolation(
                        "I3", f"{when}step {step} is missing while it was being replaced"
                    )
            else:
                raise InvariantViolation(
                    "I2",
                    f"{when}step {step} ({e.allowed[0].label}) returned before the crash "
                    "but is not reported",
                )


def check_invariants(state: CrashState, *, recover: bool = True) -> None:
    """Assert I1 to I4 of PROTOCOL.md on a crash state, with the real scanner and loader.

    I1: every step reported complete verifies and holds exactly one save's
    files and marker. I2: a step whose save returned before the crash is
    reported, with its newest returned contents. I3: a step being replaced is
    never missing. I4: ``latest()`` is the highest complete step and only
    canonically named, marked directories count. With ``recover``, ``clean()``
    then runs on the state and everything is checked again (``clean()`` must
    never remove a complete checkpoint, and must close the one window of the
    move-aside replace, where I3 is checked only after it).
    """
    _check_once(state, "", window=state.moved_aside and recover)
    if recover:
        state.checkpoints().clean()
        _check_once(state, "after clean(): ", window=False)
