"""The second recorder of the crash model: a system-call trace of any process tree.

:class:`TraceRecorder` replays the calls of :func:`._strace.read_calls` on the model of
the audited directory (the same inodes and operations the library's own hooks produce,
:mod:`atomic_ckpt.testing._mirror`), so :class:`~atomic_ckpt.testing._states._CrashModel`
rebuilds the crash states of either. Descriptors are tracked per descriptor table (one
per process, shared by its threads), file offsets per open file. A file's consecutive
writes collapse into one operation (before, torn half-way, after): nothing can tell the
boundaries between them apart but a crash in the middle, which the torn state stands for.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from atomic_ckpt.testing._mirror import _UNIVERSE, _Mirror
from atomic_ckpt.testing._results import ALL_INODES
from atomic_ckpt.testing.audit._strace import AT_FDCWD, Call, fd_arg, int_arg, unescape

_CLONE_FILES = 0x400
_CLONE_THREAD = 0x10000
_AT_REMOVEDIR = 0x200
_AT_SYMLINK_FOLLOW = 0x400
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _RENAME_WHITEOUT = 1, 2, 4
_FALLOC_KEEP_SIZE, _FALLOC_PUNCH_HOLE, _FALLOC_ZERO_RANGE = 0x1, 0x2, 0x10
_F_DUPFD, _F_DUPFD_CLOEXEC = 0, 1030
_PROT_WRITE, _MAP_SHARED = 0x2, 0x1
_MS_SYNC = 0x4


@dataclass
class _Open:
    """An open file description: what it points at and where it writes next."""

    inode: int | None
    path: str
    pos: int = 0
    append: bool = False
    sync: bool = False


@dataclass
class _Run:
    """Consecutive writes to one file, logged as one data operation when they end."""

    inode: int
    before: bytes
    events: list[tuple[str, int, bytes]] = field(default_factory=list)
    calls: int = 0
    written: int = 0


class TraceRecorder(_Mirror):
    """Builds the crash model's operations from the system calls of an audited workload.

    ``root`` is the audited directory (durable by assumption, like the simulator's
    universe); calls outside it are ignored. :attr:`unseen` collects the files whose
    contents the trace cannot tell (a shared writable mapping, a copy from outside):
    the replay check names them if the final tree disagrees.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.root_real = os.path.realpath(root)
        self.root_alias = os.path.abspath(root)
        self.content: dict[int, bytearray] = {
            i: bytearray(n.data) for i, n in enumerate(self.inodes) if n.kind == "file"
        }
        self.tables: dict[int, dict[int, _Open]] = {}
        self.cwd: dict[int, str] = {}
        self.unseen: dict[str, str] = {}
        self.calls = 0
        self._run: _Run | None = None
        self.mappings: dict[int, list[tuple[int, int, int, str]]] = {}
        """Shared writable mappings of files under the root, per address space."""
        self._mapped: list[tuple[int, int, str]] = []
        self._start_cwd = os.getcwd()

    def ignores(self, name: str) -> bool:
        """Nothing is left out: the audit sees the tree as the workload's checker does."""
        return False

    # ---- paths

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
                self.cwd[tid] = decoration
            base = decoration
        if base is None:
            base = self.cwd.get(tid, self._start_cwd)
        return os.path.join(base, path)

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
                target = os.fsdecode(self.inodes[child].data)
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
        self, tid: int, dirfd: str | None, path_arg: str, *, follow: bool = False
    ) -> tuple[int, str, int | None, str] | None:
        rel = self._rel(self._absolute(tid, dirfd, unescape(path_arg)))
        if rel is None or rel == "":
            return None
        found = self._walk(rel, follow=follow)
        return None if found is None else (*found, rel)

    def _name_of(self, rel: str) -> str:
        return rel or "."

    # ---- operations

    def _flush(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        data = bytes(self.content[run.inode])
        torn = bytearray(run.before)
        half, done = run.written // 2, 0
        for kind, offset, payload in run.events:
            if kind == "truncate":
                del torn[offset:]
                torn.extend(bytes(max(0, offset - len(torn))))
                continue
            take = payload[: max(0, half - done)] if done + len(payload) > half else payload
            _put(torn, offset, take)
            done += len(take)
            if done >= half:
                break
        name = self._inode_names.get(run.inode, "?")
        what = f"{run.calls} write call{'s' if run.calls != 1 else ''}, {run.written} bytes"
        self.emit(
            "data",
            run.inode,
            f"write {name} ({what}; now {len(data)} bytes)",
            data=data,
            by="traced",
            torn=bytes(torn) if run.written else data,
        )

    def _op(
        self,
        kind: str,
        inode: int,
        description: str,
        effects: tuple[tuple[str, int | None], ...] = (),
    ) -> None:
        self._flush()
        if kind == "entry":
            self.emit("entry", inode, description, effects=effects, by="traced")
        else:
            self.emit("sync", inode, description, by="traced")

    def _change(self, inode: int, kind: str, offset: int, payload: bytes = b"") -> None:
        if self._run is None or self._run.inode != inode:
            self._flush()
            self._run = _Run(inode, bytes(self.content[inode]))
        run = self._run
        buf = self.content[inode]
        if kind == "truncate":
            del buf[offset:]
            buf.extend(bytes(max(0, offset - len(buf))))
        else:
            _put(buf, offset, payload)
            run.calls += 1
            run.written += len(payload)
        run.events.append((kind, offset, payload))

    # ---- the calls

    def feed(self, calls: Iterable[Call]) -> None:
        """Replay ``calls`` (completed system calls, in completion order) on the model."""
        self._inode_names: dict[int, str] = {}
        self._name_tree(_UNIVERSE, "")
        for call in calls:
            if call.ret is None:
                continue
            handler = getattr(self, "_sys_" + call.name, None)
            if handler is not None:
                self.calls += 1
                handler(call)
        self._flush()

    def _name_tree(self, ino: int, rel: str) -> None:
        for name, child in self.inodes[ino].entries.items():
            path = f"{rel}{name}"
            self._inode_names[child] = path
            if self.inodes[child].kind == "dir":
                self._name_tree(child, path + "/")

    def _table(self, tid: int) -> dict[int, _Open]:
        return self.tables.setdefault(tid, {})

    def _file(self, call: Call, arg: int = 0) -> _Open | None:
        fd, decoration = fd_arg(call.args[arg]) if len(call.args) > arg else (-1, None)
        opened = self._table(call.tid).get(fd)
        if opened is not None:
            return opened
        rel = self._rel(decoration)
        if rel is None:
            return None
        # a descriptor opened before the trace knew this thread's table: find it by path
        found = self._walk(rel, follow=False) if rel else (0, "", _UNIVERSE)
        inode = None if found is None else found[2]
        opened = _Open(inode, rel, pos=-1)
        self._table(call.tid)[fd] = opened
        return opened

    def _clone(self, call: Call, flags: int) -> None:
        child = call.ret
        assert child is not None
        parent = self._table(call.tid)
        own = self.tables.get(child, {})
        # The child may have run before its parent's clone returned (strace prints the two
        # in completion order): what it opened meanwhile joins the table, but a descriptor
        # it could only place by path never replaces the parent's own entry.
        table = parent if flags & (_CLONE_FILES | _CLONE_THREAD) else dict(parent)
        for fd, opened in own.items():
            if opened.pos >= 0 or fd not in table:  # pos -1: placed by path only
                table[fd] = opened
        self.tables[child] = table
        self.cwd.setdefault(child, self.cwd.get(call.tid, self._start_cwd))

    def _sys_clone(self, call: Call) -> None:
        flags = next((int_arg(a[6:]) for a in call.args if a.startswith("flags=")), 0)
        self._clone(call, flags)

    def _sys_clone3(self, call: Call) -> None:
        text = call.args[0] if call.args else ""
        at = text.find("flags=")
        flags = int_arg(text[at + 6 :].split(",", 1)[0]) if at >= 0 else 0
        self._clone(call, flags)

    def _sys_fork(self, call: Call) -> None:
        self._clone(call, 0)

    _sys_vfork = _sys_fork

    def _open(self, call: Call, dirfd: str | None, path_arg: str, flags: int) -> None:
        fd = call.ret
        assert fd is not None
        rel = self._rel(call.ret_path)
        if rel is None:  # outside the root (or a decoration strace could not give)
            rel = self._rel(self._absolute(call.tid, dirfd, unescape(path_arg)))
        if rel is None:
            self._table(call.tid)[fd] = _Open(None, "")
            return
        inode: int | None = _UNIVERSE if rel == "" else None
        if rel:
            found = self._walk(rel, follow=True)
            if found is not None:
                parent, name, inode = found
                if inode is None and flags & os.O_CREAT:
                    inode = self._new("file", None)
                    self.content[inode] = bytearray()
                    self._inode_names[inode] = rel
                    self._op("entry", parent, f"{call.name} O_CREAT {rel}", ((name, inode),))
                elif inode is None:
                    self.unseen.setdefault(rel, "opened, but the trace never saw it created")
        if inode is not None and flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            self._truncated(inode, rel, 0, f"{call.name} O_TRUNC")
        self._table(call.tid)[fd] = _Open(
            inode,
            rel,
            append=bool(flags & os.O_APPEND),
            sync=bool(flags & (os.O_SYNC | os.O_DSYNC)),
        )

    def _flush_named(self, inode: int, description: str) -> None:
        """A truncate on open is an operation of its own (it happens before any write)."""
        run = self._run
        if run is None:
            return
        self._run = None
        self.emit("data", inode, description, data=bytes(self.content[inode]), by="traced")
        del run

    def _sys_openat(self, call: Call) -> None:
        self._open(call, call.args[0], call.args[1], int_arg(call.args[2]))

    def _sys_open(self, call: Call) -> None:
        self._open(call, None, call.args[0], int_arg(call.args[1]))

    def _sys_creat(self, call: Call) -> None:
        self._open(call, None, call.args[0], os.O_CREAT | os.O_WRONLY | os.O_TRUNC)

    def _sys_openat2(self, call: Call) -> None:
        how = call.args[2]
        at = how.find("flags=")
        flags = int_arg(how[at + 6 :].split(",", 1)[0].rstrip("}")) if at >= 0 else 0
        self._open(call, call.args[0], call.args[1], flags)

    def _sys_close(self, call: Call) -> None:
        self._table(call.tid).pop(fd_arg(call.args[0])[0], None)

    def _dup(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and call.ret is not None:
            self._table(call.tid)[call.ret] = opened

    _sys_dup = _sys_dup2 = _sys_dup3 = _dup

    def _sys_fcntl(self, call: Call) -> None:
        if len(call.args) > 1 and int_arg(call.args[1]) in (_F_DUPFD, _F_DUPFD_CLOEXEC):
            self._dup(call)

    # data

    def _written(self, call: Call, opened: _Open | None, offset: int | None) -> None:
        if opened is None or opened.inode is None:
            if opened is not None and opened.path:
                self.unseen.setdefault(
                    opened.path, "written through a descriptor the trace cannot place"
                )
            return
        inode = opened.inode
        if self.inodes[inode].kind != "file":
            return
        data = bytes(call.data)
        if call.ret is not None and 0 <= call.ret < len(data):
            # A short write (a full disk, a file size limit): the kernel wrote the first
            # ``ret`` bytes of the buffers, while strace dumps the buffers whole.
            data = data[: call.ret]
        if len(data) != call.ret:
            self.unseen.setdefault(
                opened.path, f"{call.name} wrote {call.ret} bytes, the trace shows {len(data)}"
            )
        if opened.append:  # Linux appends even a pwrite to an O_APPEND file
            offset = None
            opened.pos = len(self.content[inode])
        if offset is None:
            if opened.pos < 0:
                self.unseen.setdefault(opened.path, "written at an offset the trace cannot tell")
                opened.pos = len(self.content[inode])
            offset = opened.pos
            opened.pos += len(data)
        self._change(inode, "write", offset, data)
        if opened.sync:
            self._op("sync", inode, f"{call.name} on an O_SYNC file {opened.path} (durable)")

    def _sys_write(self, call: Call) -> None:
        self._written(call, self._file(call), None)

    _sys_writev = _sys_write

    def _sys_pwrite64(self, call: Call) -> None:
        self._written(call, self._file(call), int_arg(call.args[3]))

    _sys_pwritev = _sys_pwrite64

    def _sys_pwritev2(self, call: Call) -> None:
        offset = int_arg(call.args[3])
        self._written(call, self._file(call), None if offset == -1 else offset)

    def _sys_read(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and opened.pos >= 0 and call.ret is not None:
            opened.pos += call.ret

    _sys_readv = _sys_read

    def _sys_lseek(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and call.ret is not None:
            opened.pos = call.ret

    def _truncated(self, inode: int | None, rel: str, length: int, name: str) -> None:
        if inode is None or self.inodes[inode].kind != "file":
            return
        if len(self.content[inode]) == length:
            return
        self._flush()
        self._change(inode, "truncate", length)
        self._flush_named(inode, f"{name} {rel} to {length} bytes")

    def _sys_ftruncate(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None:
            self._truncated(opened.inode, opened.path, int_arg(call.args[1]), "ftruncate")

    def _sys_truncate(self, call: Call) -> None:
        where = self._where(call.tid, None, call.args[0], follow=True)
        if where is not None:
            self._truncated(where[2], where[3], int_arg(call.args[1]), "truncate")

    def _sys_fallocate(self, call: Call) -> None:
        opened = self._file(call)
        if opened is None or opened.inode is None or self.inodes[opened.inode].kind != "file":
            return
        mode, offset, length = (int_arg(a) for a in call.args[1:4])
        size = len(self.content[opened.inode])
        if mode & (_FALLOC_PUNCH_HOLE | _FALLOC_ZERO_RANGE):
            end = offset + length if mode & _FALLOC_KEEP_SIZE == 0 else min(size, offset + length)
            if end > offset:
                self._change(opened.inode, "write", offset, bytes(end - offset))
        elif mode & ~_FALLOC_KEEP_SIZE:
            self.unseen.setdefault(opened.path, f"fallocate mode {mode:#x}")
        elif not mode & _FALLOC_KEEP_SIZE and offset + length > size:
            self._truncated(opened.inode, opened.path, offset + length, "fallocate")

    def _copied(self, call: Call, source: _Open | None, target: _Open | None, offset: str) -> None:
        if target is None or target.inode is None:
            return
        if source is None or source.inode is None or self.inodes[source.inode].kind != "file":
            self.unseen.setdefault(target.path, f"{call.name} from a file outside the audited tree")
            return
        start = source.pos
        given = re.match(r"\[(\d+)\]", offset)
        if given is not None:  # "[5] => [10]": an explicit offset, the file's own unmoved
            start = int(given[1])
        elif source.pos >= 0:
            source.pos += call.ret or 0
        if start < 0:
            self.unseen.setdefault(target.path, f"{call.name} from an unknown offset")
            return
        call.data = bytearray(self.content[source.inode][start : start + (call.ret or 0)])
        self._written(call, target, None)

    def _sys_sendfile(self, call: Call) -> None:
        self._copied(call, self._file(call, 1), self._file(call, 0), call.args[2])

    def _sys_copy_file_range(self, call: Call) -> None:
        if call.args[3] not in ("NULL",):
            target = self._file(call, 2)
            if target is not None and target.path:
                self.unseen.setdefault(target.path, "copy_file_range to an explicit offset")
            return
        self._copied(call, self._file(call, 0), self._file(call, 2), call.args[1])

    def _sys_splice(self, call: Call) -> None:
        target = self._file(call, 2)
        if target is not None and target.inode is not None:
            self.unseen.setdefault(target.path, "splice into the file")

    def _sys_mmap(self, call: Call) -> None:
        if len(call.args) < 5 or call.ret is None:
            return
        prot, flags = int_arg(call.args[2]), int_arg(call.args[3])
        if prot & _PROT_WRITE and flags & _MAP_SHARED and fd_arg(call.args[4])[0] >= 0:
            opened = self._file(call, 4)
            if opened is not None and opened.inode is not None:
                self.unseen.setdefault(
                    opened.path,
                    "mapped shared and writable: the trace sees the bytes only at msync",
                )
                maps = self.mappings.setdefault(id(self._table(call.tid)), [])
                maps.append((call.ret, int_arg(call.args[1]), opened.inode, opened.path))

    def _sys_msync(self, call: Call) -> None:
        """Writes through a mapping become visible here; their bytes are read from the
        final tree afterwards (:meth:`fill_mapped`), which is right only if nothing
        changes the file later: otherwise the audit refuses."""
        start, length = int_arg(call.args[0]), int_arg(call.args[1])
        for base, size, inode, path in self.mappings.get(id(self._table(call.tid)), []):
            if base < start + length and start < base + size:
                self._flush()
                self._mapped.append((len(self.ops), inode, path))
                self.emit(
                    "data",
                    inode,
                    f"msync {path} (bytes written through a mapping)",
                    data=bytes(self.content[inode]),
                    by="traced",
                )
                if int_arg(call.args[2]) & _MS_SYNC:
                    self._op("sync", inode, f"msync MS_SYNC {path} (durable)")

    def fill_mapped(self, root: Path) -> list[tuple[str, str]]:
        """Give each msync its bytes: the file as the workload left it, when no later
        operation changed it; what cannot be known this way is returned (path, why)."""
        refused: list[tuple[str, str]] = []
        for index, inode, path in self._mapped:
            later = [op for op in self.ops[index + 1 :] if op.kind == "data" and op.inode == inode]
            final = self._final_path(inode)
            if later or final is None:
                refused.append(
                    (
                        path,
                        "written through a mapping and changed (or removed) later: "
                        "the bytes at msync are unknown",
                    )
                )
                continue
            data = (root / final).read_bytes()
            self.ops[index] = dataclasses.replace(self.ops[index], data=data)
            self.content[inode] = bytearray(data)
            self.unseen.pop(path, None)
        return refused

    def _final_path(self, inode: int) -> str | None:
        def walk(ino: int, rel: str) -> str | None:
            for name, child in self.inodes[ino].entries.items():
                if child == inode:
                    return rel + name
                if self.inodes[child].kind == "dir":
                    found = walk(child, f"{rel}{name}/")
                    if found is not None:
                        return found
            return None

        return walk(_UNIVERSE, "")

    # names

    def _sys_mkdir(self, call: Call) -> None:
        self._mkdir(call, None, call.args[0])

    def _sys_mkdirat(self, call: Call) -> None:
        self._mkdir(call, call.args[0], call.args[1])

    def _mkdir(self, call: Call, dirfd: str | None, path: str) -> None:
        where = self._where(call.tid, dirfd, path)
        if where is None:
            return
        parent, name, _, rel = where
        inode = self._new("dir", None)
        self._inode_names[inode] = rel
        self._op("entry", parent, f"{call.name} {rel}", ((name, inode),))

    def _removed(self, call: Call, dirfd: str | None, path: str) -> None:
        where = self._where(call.tid, dirfd, path)
        if where is None or where[2] is None:
            return
        parent, name, _, rel = where
        self._op("entry", parent, f"{call.name} {rel}", ((name, None),))

    def _sys_unlink(self, call: Call) -> None:
        self._removed(call, None, call.args[0])

    _sys_rmdir = _sys_unlink

    def _sys_unlinkat(self, call: Call) -> None:
        self._removed(call, call.args[0], call.args[1])

    def _renamed(
        self, call: Call, old: tuple[str | None, str], new: tuple[str | None, str], flags: int
    ) -> None:
        self._flush()  # pending writes are described under the name they were made at
        src = self._where(call.tid, *old)
        dst = self._where(call.tid, *new)
        if src is None and dst is None:
            return
        verb = (
            call.name
            + (" RENAME_EXCHANGE" if flags & _RENAME_EXCHANGE else "")
            + (" RENAME_NOREPLACE" if flags & _RENAME_NOREPLACE else "")
        )
        if dst is None:  # moved out of the audited tree: gone from it
            assert src is not None
            if src[2] is not None:
                self._op("entry", src[0], f"{verb} {src[3]} -> (outside)", ((src[1], None),))
            return
        if src is None or src[2] is None:  # moved in from outside: contents never seen
            self.unseen.setdefault(dst[3], "moved in from outside the audited tree")
            return
        (sp, sn, _, srel), (dp, dn, other, drel) = src, dst
        moved = src[2]
        desc = f"{verb} {srel} {'<->' if flags & _RENAME_EXCHANGE else '->'} {drel}"
        self._inode_names[moved] = drel
        if flags & _RENAME_EXCHANGE:
            assert other is not None
            self._inode_names[other] = srel
            if sp == dp:
                self._op("entry", sp, desc, ((sn, other), (dn, moved)))
            else:
                self._op("entry", dp, desc + " (new side)", ((dn, moved),))
                self._op("entry", sp, desc + " (old side)", ((sn, other),))
        elif sp == dp:
            self._op("entry", sp, desc, ((sn, None), (dn, moved)))
        else:  # two directories: two entry operations, as the simulator models them
            self._op("entry", dp, desc + " (new name)", ((dn, moved),))
            self._op("entry", sp, desc + " (old name gone)", ((sn, None),))
        if self.inodes[moved].kind == "dir":
            self._name_tree(moved, drel + "/")

    def _sys_rename(self, call: Call) -> None:
        self._renamed(call, (None, call.args[0]), (None, call.args[1]), 0)

    def _sys_renameat(self, call: Call) -> None:
        self._renamed(call, (call.args[0], call.args[1]), (call.args[2], call.args[3]), 0)

    def _sys_renameat2(self, call: Call) -> None:
        flags = int_arg(call.args[4])
        self._renamed(call, (call.args[0], call.args[1]), (call.args[2], call.args[3]), flags)

    def _hard_linked(
        self,
        call: Call,
        old: tuple[str | None, str],
        new: tuple[str | None, str],
        *,
        follow: bool,
    ) -> None:
        src = self._where(call.tid, *old, follow=follow)
        dst = self._where(call.tid, *new)
        if dst is None:
            return
        if src is None or src[2] is None:
            self.unseen.setdefault(dst[3], "hard link to a file outside the audited tree")
            return
        self._op("entry", dst[0], f"{call.name} {src[3]} -> {dst[3]}", ((dst[1], src[2]),))

    def _sys_link(self, call: Call) -> None:
        self._hard_linked(call, (None, call.args[0]), (None, call.args[1]), follow=False)

    def _sys_linkat(self, call: Call) -> None:
        follow = bool(int_arg(call.args[4]) & _AT_SYMLINK_FOLLOW)
        self._hard_linked(
            call, (call.args[0], call.args[1]), (call.args[2], call.args[3]), follow=follow
        )

    def _symlinked(self, call: Call, target: str, nd: str | None, new: str) -> None:
        dst = self._where(call.tid, nd, new)
        if dst is None:
            return
        inode = self._new("symlink", None)
        text = os.fsencode(unescape(target))
        self.inodes[inode].base_data = self.inodes[inode].data = text
        self._inode_names[inode] = dst[3]
        self._op("entry", dst[0], f"{call.name} {dst[3]} -> {unescape(target)}", ((dst[1], inode),))

    def _sys_symlink(self, call: Call) -> None:
        self._symlinked(call, call.args[0], None, call.args[1])

    def _sys_symlinkat(self, call: Call) -> None:
        self._symlinked(call, call.args[0], call.args[1], call.args[2])

    def _sys_chdir(self, call: Call) -> None:
        self.cwd[call.tid] = os.path.normpath(
            self._absolute(call.tid, None, unescape(call.args[0]))
        )

    def _sys_fchdir(self, call: Call) -> None:
        decoration = fd_arg(call.args[0])[1]
        if decoration is not None:
            self.cwd[call.tid] = decoration

    # durability

    def _sys_fsync(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and opened.inode is not None:
            self._op("sync", opened.inode, f"{call.name} {self._name_of(opened.path)}")

    _sys_fdatasync = _sys_fsync

    def _sys_sync(self, call: Call) -> None:
        self._op("sync", ALL_INODES, call.name + " (everything durable)")

    _sys_syncfs = _sys_sync


def _put(buf: bytearray, offset: int, payload: bytes) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(payload)] = payload
