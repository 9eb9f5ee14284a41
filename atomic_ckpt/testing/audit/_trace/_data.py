"""Replay of the data calls: writes, reads, seeks, truncates, fallocate, copies, mappings."""

from __future__ import annotations

import contextlib
import os
import re

from atomic_ckpt.testing._sparse import read
from atomic_ckpt.testing.audit._strace import Call, fd_arg, int_arg
from atomic_ckpt.testing.audit._trace._model import _Open, _Replay, canonical

_FALLOC_KEEP_SIZE, _FALLOC_PUNCH_HOLE, _FALLOC_ZERO_RANGE = 0x1, 0x2, 0x10
_MAP_SHARED = 0x1  # MAP_SHARED_VALIDATE (0x3) included
_RWF_DSYNC, _RWF_SYNC, _RWF_APPEND, _RWF_NOAPPEND = 0x2, 0x4, 0x10, 0x20
_RWF_KNOWN = 0x1 | 0x8 | 0x40 | 0x80 | _RWF_DSYNC | _RWF_SYNC | _RWF_APPEND | _RWF_NOAPPEND
_FIONCLEX, _FIOCLEX = 0x5450, 0x5451
_IOCTL_CHANGES_NOTHING = frozenset(
    {0x5401, 0x5413, 0x541B, 0x5421, 0x5452}  # TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIOASYNC
    | {0x1, 0x2, 0x80086601, 0x80087601}  # FIBMAP, FIGETBSZ, FS_IOC_GETFLAGS, _GETVERSION
    | {0xC020660B, 0x801C581F, 0x80081272, 0x1268}  # FIEMAP, FSGETXATTR, BLKGETSIZE64, BLKSSZGET
)
"""ioctl requests that change no file's bytes, names or durability."""
_IOCTL_NAMES = {
    0x40049409: "FICLONE (a reflink: the file's bytes become another file's)",
    0x4020940D: "FICLONERANGE (a reflink of a range: its bytes become another file's)",
    0xC0189436: "FIDEDUPERANGE (ranges shared with another file's)",
    0x40086602: "FS_IOC_SETFLAGS (chattr: +S makes writes synchronous, +a append-only...)",
}


class _Data(_Replay):
    """write, writev, pwrite64, pwritev, pwritev2, read, readv, lseek, ftruncate, truncate,
    fallocate, sendfile, copy_file_range, mmap (a writable shared mapping refused), ioctl."""

    def _written(
        self,
        call: Call,
        opened: _Open | None,
        offset: int | None,
        *,
        append: bool | None = None,
        sync: bool | None = None,
    ) -> None:
        """A write of the call's bytes at ``offset`` (None: the file offset, which it
        moves); ``append`` and ``sync`` (pwritev2's RWF_ flags) override the descriptor's
        O_APPEND and O_SYNC/O_DSYNC."""
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
        append = opened.append if append is None else append
        sync = opened.sync if sync is None else sync
        if append:  # Linux appends even a pwrite to an O_APPEND file (its offset unmoved)
            at = len(self.content[inode])
            if offset is None:
                opened.pos = at + len(data)
            offset = at
        if offset is None:
            if opened.pos < 0:
                self.unseen.setdefault(opened.path, "written at an offset the trace cannot tell")
                opened.pos = len(self.content[inode])
            offset = opened.pos
            opened.pos += len(data)
        if sync:
            self._flush()  # the write alone, as its own operation
            if inode in self.dirty:
                self._refuse(
                    call,
                    f"an O_SYNC/O_DSYNC write to {opened.path}, which holds other unsynced "
                    "writes: only this write's range is durable, which is not modelled",
                    opened.path,
                )
        self._change(inode, "write", offset, data)
        if sync:
            self._op(  # O_DSYNC's or O_SYNC's: taken as an fdatasync (the pessimistic side)
                "sync",
                inode,
                f"{call.name} on an O_SYNC file {opened.path} (durable)",
                datasync=True,
            )

    def _sys_write(self, call: Call) -> None:
        self._written(call, self._file(call), None)

    _sys_writev = _sys_write

    def _sys_pwrite64(self, call: Call) -> None:
        self._written(call, self._file(call), int_arg(call.args[3]))

    _sys_pwritev = _sys_pwrite64

    def _sys_pwritev2(self, call: Call) -> None:
        """RWF_APPEND appends whatever the offset, RWF_NOAPPEND writes at it even on an
        O_APPEND descriptor, RWF_DSYNC/RWF_SYNC make the write's range durable as on an
        O_DSYNC descriptor (audit5 attack 3); the flags that change no byte (RWF_HIPRI,
        RWF_NOWAIT, RWF_ATOMIC, RWF_DONTCACHE) nothing; any other flag is refused."""
        offset = int_arg(call.args[3])
        flags = int_arg(call.args[4]) if len(call.args) > 4 else 0
        opened = self._file(call)
        if flags < 0 or flags & ~_RWF_KNOWN:
            self._refuse(call, f"pwritev2 flags {call.args[4]}", opened.path if opened else None)
            return
        append = True if flags & _RWF_APPEND else False if flags & _RWF_NOAPPEND else None
        sync = True if flags & (_RWF_DSYNC | _RWF_SYNC) else None
        self._written(call, opened, None if offset == -1 else offset, append=append, sync=sync)

    def _sys_read(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and opened.pos >= 0 and call.ret is not None:
            opened.pos += call.ret

    _sys_readv = _sys_read

    def _sys_preadv2(self, call: Call) -> None:
        """At offset -1 preadv2 reads at (and moves) the file offset, as readv does (s15
        attack); at any other offset it leaves it."""
        if len(call.args) > 3 and int_arg(call.args[3]) == -1:
            self._sys_read(call)

    def _sys_lseek(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and call.ret is not None:
            opened.pos = call.ret

    def _sys__llseek(self, call: Call) -> None:
        """i386's lseek: ``_llseek(fd, offset, [result], whence) = 0``."""
        opened = self._file(call)
        result = re.match(r"\[(\d+)\]", call.args[2]) if len(call.args) > 2 else None
        if opened is not None and result is not None:
            opened.pos = int(result[1])
        elif opened is not None and (opened.inode is not None or opened.path):
            self._refuse(call, f"an offset the trace does not show ({call.args})", opened.path)

    def _sys_ftruncate(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None:
            self._truncated(opened.inode, opened.path, int_arg(call.args[1]), "ftruncate")

    def _sys_truncate(self, call: Call) -> None:
        where = self._where(call, None, call.args[0], follow=True)
        if where is not None:
            self._truncated(where[2], where[3], int_arg(call.args[1]), "truncate")

    _sys_ftruncate64, _sys_truncate64 = _sys_ftruncate, _sys_truncate

    def _sys_fallocate(self, call: Call) -> None:
        opened = self._file(call)
        if opened is None or opened.inode is None or self.inodes[opened.inode].kind != "file":
            return
        mode, offset, length = (int_arg(a) for a in call.args[1:4])
        size = len(self.content[opened.inode])
        if mode & (_FALLOC_PUNCH_HOLE | _FALLOC_ZERO_RANGE):
            end = offset + length if mode & _FALLOC_KEEP_SIZE == 0 else min(size, offset + length)
            if end > offset:
                self._change(opened.inode, "zero", offset, length=end - offset)
        elif mode & ~_FALLOC_KEEP_SIZE:
            self._refuse(call, f"fallocate mode {mode:#x}", opened.path)
        elif not mode & _FALLOC_KEEP_SIZE and offset + length > size:
            self._truncated(opened.inode, opened.path, offset + length, "fallocate")

    def _copied(
        self,
        call: Call,
        source: _Open | None,
        target: _Open | None,
        offset: str,
        at: int | None = None,
    ) -> None:
        """A copy of ``call.ret`` bytes from ``source`` (at ``offset``: ``[N]`` or its
        own) to ``target`` (at ``at``, or its own offset)."""
        if target is None or target.inode is None:
            return
        if source is not None and source.inode is None and source.outside is not None:
            self._copied_in(call, source, target, offset, at)
            return
        if source is None or source.inode is None or self.inodes[source.inode].kind != "file":
            self._refuse(call, "a copy from a source the trace cannot place", target.path)
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
        call.data = bytearray(read(self.content[source.inode], start, call.ret or 0))
        self._written(call, target, at)

    def _copied_in(
        self, call: Call, source: _Open, target: _Open, offset: str, at: int | None
    ) -> None:
        """A copy from a file outside the tree (shutil.copy's sendfile): its bytes are read
        from that file now, right after the run; the final-tree check catches a change."""
        assert source.outside is not None
        mapped = self.mapped_outside.get(canonical(source.outside))
        if mapped is not None:
            self._refuse(
                call, _MAPPED.format(source.outside, f"at trace line {mapped}"), target.path
            )
            return
        given = re.match(r"\[(\d+)\]", offset)
        start = int(given[1]) if given is not None else source.pos
        if given is None and source.pos >= 0:
            source.pos += call.ret or 0
        try:
            with open(source.outside, "rb") as f:
                f.seek(max(start, 0))
                call.data = bytearray(f.read(call.ret or 0))
        except OSError as exc:
            self._refuse(call, f"the source {source.outside} cannot be read: {exc}", target.path)
            return
        if start < 0 or len(call.data) != call.ret:
            self._refuse(call, f"the source {source.outside} changed after the copy", target.path)
            return
        key = canonical(source.outside)
        self.copied_from[key] = call.line
        with contextlib.suppress(OSError):
            st = os.stat(source.outside)
            self.copied_ids[(st.st_dev, st.st_ino)] = key
        self._written(call, target, at)

    def _sys_sendfile(self, call: Call) -> None:
        self._copied(call, self._file(call, 1), self._file(call, 0), call.args[2])

    _sys_sendfile64 = _sys_sendfile

    def _sys_copy_file_range(self, call: Call) -> None:
        """As sendfile; an explicit target offset (``[N] => [M]``) writes at N, the
        target's own offset unmoved."""
        given = re.match(r"\[(\d+)\]", call.args[3])
        target = self._file(call, 2)
        if call.args[3] != "NULL" and given is None:
            if target is not None and (target.inode is not None or target.path):
                self._refuse(
                    call,
                    f"a copy to an offset the trace does not show ({call.args[3]})",
                    target.path or ".",
                )
            return
        at = None if given is None else int(given[1])
        self._copied(call, self._file(call, 0), target, call.args[1], at)

    def _sys_ioctl(self, call: Call) -> None:
        """FIOCLEX/FIONCLEX mark a descriptor close-on-exec or not; a request that changes
        no file nothing; any other on a descriptor in the tree is refused (issue 29, gap
        1: a reflink, FICLONE, makes a file's bytes another's without a write)."""
        fd, request = fd_arg(call.args[0])[0], int_arg(call.args[1]) if len(call.args) > 1 else -1
        if request in (_FIOCLEX, _FIONCLEX):
            table = self._table(call.tid)
            if fd in table:
                table.put(fd, table[fd], request == _FIOCLEX)
            return
        if request in _IOCTL_CHANGES_NOTHING:
            return
        opened = self._file(call)
        if opened is None or (opened.inode is None and not opened.path):
            return  # a descriptor outside the tree (a clone out of it changes nothing here)
        what = _IOCTL_NAMES.get(request, f"request {call.args[1]}")
        self._refuse(
            call,
            f"ioctl {what} on {opened.path or '.'}: its effect on the file is not modelled; "
            "write the bytes (write, copy_file_range) to audit this save",
            opened.path or ".",
        )

    def _sys_mmap(self, call: Call) -> None:
        """A shared mapping of a file under the tree through a descriptor open for writing
        is refused (issue 29.4): stores through it are no system call, so the trace sees
        neither their bytes nor when they happen (before or after an msync, the munmap or
        a fsync), and an msync flushes only what was stored before it. The descriptor's
        access mode, not the mapping's PROT_WRITE, decides: mprotect (not traced) can
        make a read-only shared mapping writable when the descriptor allows it."""
        if len(call.args) < 5 or call.ret is None:
            return
        flags, fd = int_arg(call.args[3]), fd_arg(call.args[4])[0]
        if not flags & _MAP_SHARED or fd < 0:
            return  # private or anonymous: stores never reach a file
        opened = self._file(call, 4)
        if opened is not None and opened.outside is not None and opened.writable:
            self._mapped_outside(call, opened.outside)
        if opened is None or opened.inode is None or not opened.writable:
            return
        if self.inodes[opened.inode].kind != "file":
            return
        self._refuse(
            call,
            f"{opened.path} mapped shared through a descriptor open for writing: stores "
            "through a mapping are invisible to the trace (their bytes, and whether they "
            "came before or after an msync)",
            opened.path,
        )

    _sys_mmap2 = _sys_mmap

    def _mapped_outside(self, call: Call, path: str) -> None:
        """A file outside the tree mapped shared and writable: a copy from it into the tree
        (its bytes read after the run) is refused, before or after the mapping (round 15:
        stores through it change those bytes with no system call to see)."""
        path = canonical(path)
        self.mapped_outside.setdefault(path, call.line)
        copied = self.copied_from.get(path)
        if copied is not None:
            self._refuse(
                call, _MAPPED.format(path, f"after a copy from it (trace line {copied})"), path
            )


_MAPPED = (
    "{} is mapped shared through a descriptor open for writing ({}), and copied into the "
    "tree: its bytes are read after the run, and stores through the mapping (no system "
    "call) may have changed them since the copy; copy from a file that is not mapped "
    "writable (or write the bytes with write())"
)
