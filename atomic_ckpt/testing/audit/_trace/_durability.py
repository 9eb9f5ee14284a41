"""Replay of the durability calls: fsync, fdatasync, sync, syncfs."""

from __future__ import annotations

import bisect
import os

from atomic_ckpt.testing._results import ALL_INODES
from atomic_ckpt.testing._sparse import cut, freeze, put, thaw, zero
from atomic_ckpt.testing.audit._strace import Call, fd_arg
from atomic_ckpt.testing.audit._trace._model import _Replay, _Run


class _Durability(_Replay):
    """fsync, fdatasync (one file durable), sync (everything durable), syncfs (everything
    durable if its descriptor is on the audited tree's filesystem); each covers only what
    completed before it began (:meth:`_synced`)."""

    def _sys_fsync(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and opened.inode is not None:
            self._synced(call, opened.inode, f"{call.name} {self._name_of(opened.path)}")

    _sys_fdatasync = _sys_fsync

    def _sys_sync(self, call: Call) -> None:
        self._synced(call, ALL_INODES, call.name + " (everything durable)")

    def _sys_syncfs(self, call: Call) -> None:
        where = fd_arg(call.args[0])[1] if call.args else None
        try:
            same = where is not None and os.stat(where).st_dev == os.stat(self.root_real).st_dev
        except OSError:  # gone since: it cannot be told, so it syncs nothing (pessimistic)
            same = False
        if same or self._rel(where) is not None:
            self._synced(call, ALL_INODES, f"syncfs {where} (the tree's filesystem durable)")

    def _synced(self, call: Call, inode: int, description: str) -> None:
        """An fsync of ``inode`` (or a sync of everything, :data:`ALL_INODES`) makes
        durable only what completed before it began (audit5 attack 1): an operation whose
        call completed while it ran (another thread's write or rename) may have missed it
        (an fsync writes back what is dirty when it looks), so it stays unsynced. The
        trace orders the calls: strace prints a call's start apart from its end when
        another traced call comes between them (:attr:`.._strace.Call.start`)."""
        self._split_run(call.start)
        self._flush()
        covers = bisect.bisect_left(self.op_lines, call.start)
        missed = [
            i for i in range(covers, len(self.ops)) if inode < 0 or self.ops[i].inode == inode
        ]
        if not missed:
            self._op("sync", inode, description, datasync=call.name == "fdatasync")
            return
        said = ", ".join(f"#{i + 1}" for i in missed[:5]) + (", ..." if missed[5:] else "")
        self.emit(
            "sync", inode, f"{description} (not covering {said}: done while it ran)",
            by="traced", covers=covers, datasync=call.name == "fdatasync",
        )  # fmt: skip
        later = {self.ops[i].inode for i in missed if self.ops[i].kind == "data"}
        if inode < 0:
            self.dirty &= later
        elif inode not in later:
            self.dirty.discard(inode)

    def _split_run(self, start: int) -> None:
        """The pending run of writes, if some of them completed before trace line
        ``start`` and some after, as two operations: the first one an fsync that began at
        ``start`` covers, the rest one it does not."""
        run = self._run
        if run is None:
            return
        j = next((n for n, line in enumerate(run.lines) if line >= start), 0)
        if j == 0:
            return
        buf = thaw(run.before)
        for kind, offset, payload, length in run.events[:j]:
            if kind == "truncate":
                buf = cut(buf, offset)
            elif kind == "zero":
                buf = zero(buf, offset, length)
            else:
                buf = put(buf, offset, payload)
        final, self.content[run.inode] = self.content[run.inode], buf
        self._run = _part(run, 0, j, run.before)
        self._flush()
        self.content[run.inode] = final
        self._run = _part(run, j, len(run.events), freeze(buf))


def _part(run: _Run, first: int, end: int, before: object) -> _Run:
    events = run.events[first:end]
    part = _Run(run.inode, before, events, lines=run.lines[first:end], start=run.start)  # type: ignore[arg-type]
    part.line = part.lines[-1]
    part.calls = sum(1 for e in events if e[0] != "truncate")
    part.written = sum(len(e[2]) if e[0] == "write" else e[3] for e in events if e[0] != "truncate")
    return part
