"""The recorder: hooks the library's filesystem calls
(:mod:`atomic_ckpt._core.l2_syscalls.fs`) and its saves (``Commit.publish``,
``CheckpointDir.mark_complete``, ``_delete.move_aside``), and
logs each as operations on the model of the scratch tree.

The plain :mod:`os` calls that change a name (:data:`BOUNDARIES`: unlink, symlink, mkdir,
rmdir, link, an ``os.open`` that creates or writes) are operation boundaries too, where
they name an entry of the root outside a staging directory: the tree is looked at before
and after each, so two of them (``unlink`` then ``symlink`` where one atomic rename was
meant) are two operations with a crash point between, never one observed change."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from atomic_ckpt import MARKER, TMP_INFIX, CheckpointDir, Commit, parse_step
from atomic_ckpt._core.l1_names.names import TAG_OLD, parse_tmp
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l3_formats.read import classify
from atomic_ckpt._core.l4_protocol import amend as _amend
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol.root import Root
from atomic_ckpt.testing._mirror import _Mirror
from atomic_ckpt.testing._results import Tree, Version

_MARKER_TMP_PREFIX = MARKER + TMP_INFIX
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

BOUNDARIES: dict[str, int] = {
    "unlink": 0,
    "remove": 0,
    "rmdir": 0,
    "mkdir": 0,
    "symlink": 1,
    "link": 1,
    "open": 0,
}
"""The :mod:`os` calls the recorder makes operation boundaries, and the index of the
argument naming the path each changes."""


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


@dataclass
class _Save:
    kind: Literal["commit", "mark_complete", "delete"]
    steps: tuple[int, ...]
    start: int
    tree: Tree | None = None
    marker: bytes | None = None
    end: int | None = None
    """Operations recorded when it returned; None if it raised."""


_REAL_OPEN = os.open


class _Recorder(_Mirror):
    """Logs every filesystem call of the library, and where each save starts and returns."""

    def __init__(self, universe: Path, root: Path, prefix: str) -> None:
        super().__init__(universe)
        self.root = root
        self.prefix = prefix
        self.saves: list[_Save] = []
        self.lock = threading.RLock()
        self.busy = False
        self.moved_aside = False
        self.initial = self._initial_versions()

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

    # ---- the hooks on atomic_ckpt._core.l2_syscalls.fs

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
            for name, index in BOUNDARIES.items():
                patch(os, name, self._boundary(getattr(os, name), index))
            patch(Commit, "publish", self._publish_hook(Commit.publish))
            patch(CheckpointDir, "mark_complete", self._adopt_hook(CheckpointDir.mark_complete))
            patch(_delete, "move_aside", self._delete_hook(_delete.move_aside))
            patch(_amend, "_rewrite_marker", self._remark_hook(_amend._rewrite_marker))
            patch(_carry, "place", self._place_hook(_carry.place))
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

    def _boundary(self, real: Callable[..., Any], index: int) -> Callable[..., Any]:
        """``real`` (an :mod:`os` call), with the tree looked at before and after it when
        it changes an entry of the root outside a staging directory."""

        @functools.wraps(real)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if (
                real is _REAL_OPEN
                and not (args[1] if len(args) > 1 else kwargs["flags"]) & _WRITING
            ):
                return real(*args, **kwargs)
            if (
                len(args) <= index
                or kwargs.get("dir_fd") is not None
                or not self._visible(args[index])
            ):
                return real(*args, **kwargs)
            with self.lock:
                if self.busy:
                    return real(*args, **kwargs)
                self.busy = True
                try:
                    self.observe()
                    return real(*args, **kwargs)
                finally:
                    self.observe()
                    self.busy = False

        return wrapper

    def _visible(self, path: Any) -> bool:
        """True if ``path`` names the root or an entry under it that is in no temporary
        (staging, aside) directory: a change there is one the scanner can see."""
        if isinstance(path, int):
            return False
        root = self.rel(self.root)
        rel = self.rel(path)
        if root is None or rel is None:
            return False
        if rel == root:
            return True
        if not rel.startswith(root + "/" if root else ""):
            return False
        parts = rel[len(root) + 1 :].split("/") if root else rel.split("/")
        if self.ignores(parts[-1]):  # a lock file: it holds nothing the scanner reads
            return False
        return not any(TMP_INFIX in part or parse_tmp(part) is not None for part in parts)

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
        if name in self.inodes[directory].entries:  # unlinked first, never written through
            self.emit("entry", directory, f"unlink {self.rel(path)}", effects=((name, None),))
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
            if self.rel(commit.path) is None or commit.state != "open" or commit._step is None:
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

    def _place_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """Carried files reach their names inside the publish: what the save commits is
        the tree once they are placed (their private waiting names are gone by then)."""

        def place(staging: Path, *a: Any, **kw: Any) -> Any:
            result = real(staging, *a, **kw)
            save = self.saves[-1] if self.saves else None
            if save is not None and save.end is None and self.rel(staging) is not None:
                with self.lock:
                    self.observe()
                save.tree = read_tree(staging)
            return result

        return place

    def _remark_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """A metadata-only amend: the same files, a new marker written in place."""

        def rewrite(root: Root, base: Any, metadata: Any) -> Any:
            if self.rel(base.path) is None:
                return real(root, base, metadata)
            with self.lock:
                self.observe()
            tree = read_tree(base.path)
            save = self._begin(_Save("commit", (base.step,), len(self.ops), tree=tree))
            result = real(root, base, metadata)
            save.marker = _read_marker_bytes(base.path)
            save.end = len(self.ops)
            return result

        return rewrite

    def _adopt_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def mark_complete(ckpts: CheckpointDir, step: int, **options: Any) -> Any:
            if not self._mine(ckpts):
                return real(ckpts, step, **options)
            path = ckpts.path_of(step)
            with self.lock:
                self.observe()
            tree = read_tree(path) if path.is_dir() and not path.is_symlink() else None
            save = self._begin(_Save("mark_complete", (step,), len(self.ops), tree=tree))
            result = real(ckpts, step, **options)
            save.marker = _read_marker_bytes(path)
            save.end = len(self.ops)
            return result

        return mark_complete

    def _delete_hook(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def move_aside(root: Root, paths: list[Path], **kw: Any) -> Any:
            if self.rel(root.path) is None:
                return real(root, paths, **kw)
            steps = tuple(
                s for s in (parse_step(Path(p).name, root.prefix) for p in paths) if s is not None
            )
            with self.lock:
                self.observe()
            save = self._begin(_Save("delete", steps, len(self.ops)))
            result = real(root, paths, **kw)
            save.end = len(self.ops)
            return result

        return move_aside
