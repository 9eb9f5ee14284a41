"""The replay's model: open files, pending write runs, paths below the root, operations."""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from atomic_ckpt.testing._mirror import _UNIVERSE, _Mirror
from atomic_ckpt.testing._sparse import Buffer, Data, cut, freeze, put, text, thaw, zero
from atomic_ckpt.testing._writes import coalesce, replay
from atomic_ckpt.testing.audit._strace import AT_FDCWD, Call, fd_arg, unescape
from atomic_ckpt.testing.audit._trace._links import links_out, model_entries

UNPLACED = "/(a descriptor the replay cannot place) "
"""The base of a path relative to a descriptor the replay cannot place (no directory of
that name is ever in a tree): a change made through one is refused."""
_PROC_ALIAS = re.compile(r"^/proc/(self|thread-self|\d+)(/task/\d+)?/(cwd|root|fd/\d+)(/|$)")


def canonical(path: str) -> str:
    """``path`` with its directory resolved through symlinks (as it is after the run): one
    spelling for a file outside the tree, whichever way the workload reached it."""
    head, tail = os.path.split(os.path.normpath(path))
    return os.path.join(os.path.realpath(head), tail)


@dataclass
class _Open:
    """An open file description: what it points at and where it writes next."""

    inode: int | None
    path: str
    pos: int = 0
    append: bool = False
    sync: bool = False
    writable: bool = True
    """Opened for writing (O_WRONLY, O_RDWR); unknown (placed by path only) counts as so."""
    outside: str | None = None
    """The path of a file outside the audited tree (its bytes read for a copy in)."""


class _Table(dict[int, _Open]):
    """A descriptor table (a process's, shared by its threads) and which of its
    descriptors are close-on-exec: an execve leaves them out of the new program's."""

    def __init__(self, entries: dict[int, _Open] | None = None, cloexec: Iterable[int] = ()):
        super().__init__(entries or {})
        self.cloexec: set[int] = set(cloexec)

    def put(self, fd: int, opened: _Open, cloexec: bool) -> None:
        self[fd] = opened
        (self.cloexec.add if cloexec else self.cloexec.discard)(fd)

    def drop(self, fd: int) -> None:
        self.pop(fd, None)
        self.cloexec.discard(fd)


@dataclass
class _Run:
    """Consecutive writes to one file, logged as one data operation when they end."""

    inode: int
    before: Data
    events: list[tuple[str, int, bytes, int]] = field(default_factory=list)
    """(write, offset, payload, 0), (truncate, length, b"", 0), (zero, offset, b"", length)"""
    calls: int = 0
    written: int = 0
    line: int = 0
    """The trace line its last call completed on."""
    lines: list[int] = field(default_factory=list)
    """The trace line each event's call completed on."""
    start: int = 0
    """The trace line its first call began on."""


class _Replay(_Mirror):
    """The state every family of system calls replays on: descriptor tables, working
    directories, file contents and the run of writes not yet logged."""

    _inode_names: dict[int, str]

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.root_real = os.path.realpath(root)
        self.root_alias = os.path.abspath(root)
        self.content: dict[int, Buffer] = {
            i: thaw(n.data) for i, n in enumerate(self.inodes) if n.kind == "file"
        }
        self.tables: dict[int, _Table] = {}
        self.cwd: dict[int, list[str]] = {}
        """Each thread's working directory, one shared cell for threads made with CLONE_FS."""
        self.unseen: dict[str, str] = {}
        self.calls = 0
        self._run: _Run | None = None
        self.dirty: set[int] = set()
        """Files with data operations no fsync has covered yet."""
        self._start_cwd = os.getcwd()
        self.copied_from: dict[str, int] = {}
        """Files outside the tree copied in (sendfile, copy_file_range), their bytes read
        after the run: the trace line of the last copy from each."""
        self.outside_names: dict[str, set[str]] = {}
        """Names outside the tree that a hard link made the same file's: each name's set."""
        self.copied_ids: dict[tuple[int, int], str] = {}
        """The (device, inode) of each file in :attr:`copied_from`, after the run."""
        self.mapped_outside: dict[str, int] = {}
        """Files outside the tree mapped shared through a descriptor open for writing: the
        trace line of the mapping (a copy from one is refused: round 15)."""
        self.refusals: list[tuple[str, str]] = []
        """Calls the replay cannot model exactly: (path or call, why); the audit refuses."""
        self.line = self.start = 0
        """The trace line of the call being replayed, and the line it began on."""
        self.unplaced: str | None = None
        """The descriptor a path of the call being replayed is relative to, when the
        replay cannot place it (:meth:`_bare`); a change it makes is refused."""
        self.journal_dirty: dict[int, bool] = {}
        """Inodes changed since the last journal commit: True when the change is one an
        fdatasync commits too (a size change, a new name), False for an fsync's only."""
        self.op_lines: list[int] = []
        """For each op, the trace line its (last) call completed on: an fsync covers only
        the ops that completed before it began (:meth:`_synced`)."""

    def ignores(self, name: str) -> bool:
        """Nothing is left out: the audit sees the tree as the workload's checker does."""
        return False

    def emit(
        self,
        kind: Literal["entry", "data", "sync"],
        inode: int,
        description: str,
        **kw: Any,
    ) -> None:
        """The mirror's emit, keeping :attr:`dirty` (files with unsynced data) and noting
        an op whose call began before earlier ops completed (:attr:`Op.began`)."""
        began = bisect.bisect_left(self.op_lines, self.start)
        if kind != "sync" and began < len(self.ops):
            kw["began"] = began
        self._journal(kind, inode, kw)
        super().emit(kind, inode, description, **kw)
        # never decreasing (fsyncs that overlapped are replayed in path order): bisect
        self.op_lines.append(max(self.line, self.op_lines[-1] if self.op_lines else 0))
        if kind == "data":
            self.dirty.add(inode)

    def _journal(self, kind: str, inode: int, kw: dict[str, Any]) -> None:
        """Which inodes a journal commit is owed for (ext4 commits at an fsync only when
        the inode changed since the last commit: round 13, defect 5)."""
        dirty = self.journal_dirty
        if kind == "entry":
            for who in [inode, *(c for _, c in kw.get("effects", ()) if c is not None)]:
                dirty[who] = True
        elif kind == "data":
            resized = len(kw.get("data", b"")) != len(self.inodes[inode].data)
            dirty[inode] = dirty.get(inode, False) or resized
        else:
            commits = inode < 0 or (
                inode in dirty and (dirty[inode] or not kw.pop("datasync", False))
            )
            kw.pop("datasync", None)
            kw["commits"] = commits
            if commits:
                dirty.clear()

    def _outside_links(self) -> None:
        """A symlink already in the tree that leads out of it is refused: every crash state
        would show the live target, whatever the workload did to it."""
        self.refusals.extend(links_out(model_entries(self.inodes), self._bases()))

    def _cwd(self, tid: int) -> list[str]:
        return self.cwd.setdefault(tid, [self._start_cwd])

    def _refuse(self, call: Call, why: str, path: str | None = None) -> None:
        self.refusals.append(
            (path or call.name, f"cannot rebuild: {call.name} (trace line {call.line}): {why}")
        )

    def _touched(self, call: Call) -> str | None:
        """The first path under the root that an argument of ``call`` names (as a path or
        a descriptor), relative to it (``.``: the root); None if it names none."""
        for arg in call.args:
            rel = self._rel(fd_arg(arg)[1])
            if rel is None and arg.startswith('"'):
                rel = self._rel(self._absolute(call.tid, None, unescape(arg)))
            if rel is not None:
                return self._name_of(rel)
        rel = self._rel(call.ret_path)
        return None if rel is None else self._name_of(rel)

    # ---- paths

    def _bases(self) -> tuple[str, str]:
        """The audited directory's real path and its spelling."""
        return self.root_real, self.root_alias

    def _rel(self, path: str | None) -> str | None:
        if path is None:
            return None
        path = os.path.normpath(path)
        for base in (self.root_real, self.root_alias):
            if path == base:
                return ""
            if path.startswith(base + os.sep):
                return path[len(base) + 1 :]
        return None

    def _absolute(self, tid: int, dirfd: str | None, path: str) -> str:
        if os.path.isabs(path):
            return path
        base: str | None = None
        if dirfd is not None:
            fd, decoration = fd_arg(dirfd)
            if fd == AT_FDCWD and decoration is not None:
                self._cwd(tid)[0] = decoration
            base = decoration
            if base is None and fd >= 0:
                base = self._bare(tid, fd)
        if base is None:
            base = self._cwd(tid)[0]
        if base.startswith(UNPLACED):
            self.unplaced = base[len(UNPLACED) :]
        return os.path.join(base, path)

    def _bare(self, tid: int, fd: int) -> str:
        """Where descriptor ``fd`` points when strace printed it bare (it gives no path
        longer than PATH_MAX): the directory its table entry opened, by its name now (it
        may have been renamed since); outside the tree if the entry is outside; else a
        base under :data:`UNPLACED`, whose changes the replay refuses (round 15)."""
        opened = self._table(tid).get(fd)
        if opened is not None and opened.inode is None:
            return f"{UNPLACED}descriptor {fd}, outside the tree but with no path"
        rel = None if opened is None else self._path_of(opened.inode)
        if rel is None:
            return f"{UNPLACED}descriptor {fd}, which the trace never saw opened"
        return os.path.join(self.root_real, rel) if rel else self.root_real

    def _path_of(self, inode: int | None) -> str | None:
        """The path below the root a directory ``inode`` has now (a directory has one
        name); None when no name leads to it."""
        if inode == _UNIVERSE:
            return ""
        todo = [(_UNIVERSE, "")]
        while todo:
            at, rel = todo.pop()
            for name, child in self.inodes[at].entries.items():
                if self.inodes[child].kind != "dir":
                    continue
                path = f"{rel}{name}"
                if child == inode:
                    return path
                todo.append((child, path + "/"))
        return None

    def _walk(
        self, rel: str, *, follow: bool, depth: int = 0
    ) -> tuple[int, str, int | None] | None:
        """(parent inode, name, inode or None) for a path below the root, following the
        model's symlinks (and the last one if ``follow``); None when it leaves the model."""
        if depth > 40:
            return None
        parts = [p for p in rel.split("/") if p and p != "."]
        if not parts:
            return None
        ino = _UNIVERSE
        done: list[str] = []
        for i, part in enumerate(parts):
            node = self.inodes[ino]
            if node.kind != "dir":
                return None
            last = i == len(parts) - 1
            child = node.entries.get(part)
            if last and not follow:
                return ino, part, child
            if child is not None and self.inodes[child].kind == "symlink":
                target = text(self.inodes[child].data)
                joined = (
                    target if os.path.isabs(target) else os.path.join(self.root_real, *done, target)
                )
                rest = "/".join(parts[i + 1 :])
                new = self._rel(os.path.join(joined, rest) if rest else joined)
                if new is None:
                    return None
                if new == "":
                    return (ino, part, _UNIVERSE) if last else self._walk(rest, follow=follow)
                return self._walk(new, follow=follow, depth=depth + 1)
            if last:
                return ino, part, child
            if child is None:
                return None
            ino = child
            done.append(part)
        return None

    def _where(
        self, call: Call, dirfd: str | None, path_arg: str, *, follow: bool = False
    ) -> tuple[int, str, int | None, str] | None:
        absolute = os.path.normpath(self._absolute(call.tid, dirfd, unescape(path_arg)))
        rel = self._rel(absolute)
        if rel is None:
            self._alias(call, absolute)
        if rel is None or rel == "":
            return None
        found = self._walk(rel, follow=follow)
        return None if found is None else (*found, rel)

    def _alias(self, call: Call, path: str) -> None:
        """A change to a path outside the tree by its spelling that may lead into it is
        refused: one through /proc/PID/cwd, root or fd/N (the kernel resolves those
        against the process, the recorder cannot), or one whose directory resolves (now,
        after the run, through symlinks outside the tree) to a directory in the tree."""
        proc = _PROC_ALIAS.match(path)
        parent = os.path.dirname(path)
        if proc is None and self._rel(os.path.realpath(parent)) is None:
            return
        through = proc[0] if proc is not None else f"{parent} -> {os.path.realpath(parent)}"
        self._refuse(
            call, f"{path} is spelled through an alias of the audited tree ({through})", path
        )

    def _name_of(self, rel: str) -> str:
        return rel or "."

    # ---- operations

    def _flush(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        data = freeze(self.content[run.inode])
        writes = coalesce(run.events)
        name = self._inode_names.get(run.inode, "?")
        what = f"{run.calls} write call{'s' if run.calls != 1 else ''}, {run.written} bytes"
        self.line, line, self.start, start = run.line, self.line, run.start, self.start
        self.emit(
            "data",
            run.inode,
            f"write {name} ({what}; now {len(data)} bytes)",
            data=data,
            by="traced",
            torn=replay(run.before, writes, data, "torn") if run.written else data,
            writes=writes,
        )
        self.line, self.start = line, start

    def _op(
        self,
        kind: str,
        inode: int,
        description: str,
        effects: tuple[tuple[str, int | None], ...] = (),
        datasync: bool = False,
    ) -> None:
        self._flush()
        if kind == "entry":
            self.emit("entry", inode, description, effects=effects, by="traced")
        else:
            self.emit("sync", inode, description, by="traced", datasync=datasync)
            if inode < 0:
                self.dirty.clear()
            else:
                self.dirty.discard(inode)

    def _change(
        self, inode: int, kind: str, offset: int, payload: bytes = b"", length: int = 0
    ) -> None:
        """A write of ``payload``, a truncate to ``offset`` or zeros over ``length`` bytes
        (a punched hole: held as a hole, :mod:`.._sparse`) joins the file's run."""
        if self._run is None or self._run.inode != inode:
            self._flush()
            self._run = _Run(inode, freeze(self.content[inode]), start=self.start)
        run = self._run
        buf = self.content[inode]
        if kind == "truncate":
            self.content[inode] = cut(buf, offset)
        elif kind == "zero":
            self.content[inode] = zero(buf, offset, length)
            run.calls += 1
            run.written += length
        else:
            self.content[inode] = put(buf, offset, payload)
            run.calls += 1
            run.written += len(payload)
        run.events.append((kind, offset, payload, length))
        run.line = self.line
        run.lines.append(self.line)

    def _name_tree(self, ino: int, rel: str) -> None:
        for name, child in self.inodes[ino].entries.items():
            path = f"{rel}{name}"
            self._inode_names[child] = path
            if self.inodes[child].kind == "dir":
                self._name_tree(child, path + "/")

    def _table(self, tid: int) -> _Table:
        return self.tables.setdefault(tid, _Table())

    def _file(self, call: Call, arg: int = 0) -> _Open | None:
        fd, decoration = fd_arg(call.args[arg]) if len(call.args) > arg else (-1, None)
        opened = self._table(call.tid).get(fd)
        rel = self._rel(decoration)
        if opened is not None and opened.outside is None and decoration and rel is None:
            # strace's path for the descriptor is outside the tree, the table's entry a
            # file in it: the entry is stale (its number reused by a call the trace does
            # not show, such as pipe or socket), so the call touches nothing here
            self._table(call.tid).drop(fd)
            return None
        if opened is not None:
            return opened
        if rel is None:
            if decoration is None and fd >= 0:  # bare: its path is longer than PATH_MAX
                self.unplaced = f"descriptor {fd}, which the trace never saw opened"
            return None
        # a descriptor opened before the trace knew this thread's table: find it by path
        found = self._walk(rel, follow=False) if rel else (0, "", _UNIVERSE)
        inode = None if found is None else found[2]
        opened = _Open(inode, rel, pos=-1)
        self._table(call.tid).put(fd, opened, cloexec=False)
        return opened

    def _flush_named(self, inode: int, description: str) -> None:
        """A truncate on open is an operation of its own (it happens before any write)."""
        run = self._run
        if run is None:
            return
        self._run = None
        data = freeze(self.content[inode])
        self.emit("data", inode, description, data=data, by="traced", writes=coalesce(run.events))

    def _truncated(self, inode: int | None, rel: str, length: int, name: str) -> None:
        if inode is None or self.inodes[inode].kind != "file":
            return
        if len(self.content[inode]) == length:
            return
        self._flush()
        self._change(inode, "truncate", length)
        self._flush_named(inode, f"{name} {rel} to {length} bytes")
