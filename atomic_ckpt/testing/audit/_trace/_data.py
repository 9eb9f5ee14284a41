"""Replay of the data calls: writes, reads, seeks, truncates, fallocate, copies, mappings."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from atomic_ckpt.testing._mirror import _UNIVERSE
from atomic_ckpt.testing.audit._strace import Call, fd_arg, int_arg
from atomic_ckpt.testing.audit._trace._model import _Open, _Replay

_FALLOC_KEEP_SIZE, _FALLOC_PUNCH_HOLE, _FALLOC_ZERO_RANGE = 0x1, 0x2, 0x10
_PROT_WRITE, _MAP_SHARED = 0x2, 0x1
_MS_SYNC = 0x4


class _Data(_Replay):
    """write, writev, pwrite64, pwritev, pwritev2, read, readv, lseek, ftruncate, truncate,
    fallocate, sendfile, copy_file_range, splice, mmap, msync."""

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
