"""Replay of the descriptor calls: open, openat, openat2, creat, close, close_range, dup,
dup2, dup3, fcntl, execve (close-on-exec), recvmsg (SCM_RIGHTS)."""

from __future__ import annotations

import os
import re

from atomic_ckpt.testing._mirror import _UNIVERSE
from atomic_ckpt.testing.audit._strace import Call, fd_arg, int_arg, unescape
from atomic_ckpt.testing.audit._trace._model import _Open, _Replay, _Table

_F_DUPFD, _F_DUPFD_CLOEXEC, _F_SETFD, _F_SETFL, _FD_CLOEXEC = 0, 1030, 2, 4, 1
_CLOSE_RANGE_UNSHARE, _CLOSE_RANGE_CLOEXEC = 2, 4
_O_TMPFILE = 0o20000000  # __O_TMPFILE (O_TMPFILE adds O_DIRECTORY)
_SCM_RIGHTS = re.compile(
    r"cmsg_level=(?:0x1|SOL_SOCKET), cmsg_type=(?:0x1|SCM_RIGHTS), "
    r"cmsg_data=\[((?:[^\]<]|<(?:[^>\\]|\\.)*>)*)\]"
)
_DECORATED_FD = re.compile(r"\d+<(?:[^>\\]|\\.)*>")


class _Descriptors(_Replay):
    """open, openat, openat2, creat (O_CREAT, O_TRUNC), close, dup, dup2, dup3, fcntl F_DUPFD."""

    def _open(self, call: Call, dirfd: str | None, path_arg: str, flags: int) -> None:
        fd = call.ret
        assert fd is not None
        rel = self._rel(call.ret_path)
        if rel is None:  # outside the root (or a decoration strace could not give)
            rel = self._rel(self._absolute(call.tid, dirfd, unescape(path_arg)))
        if rel is None:
            writable = flags >= 0 and flags & os.O_ACCMODE != os.O_RDONLY
            opened = _Open(None, "", outside=call.ret_path, writable=writable)
            self._table(call.tid).put(fd, opened, cloexec=bool(flags & os.O_CLOEXEC))
            return
        inode: int | None = _UNIVERSE if rel == "" else None
        if flags >= 0 and flags & _O_TMPFILE:  # an unnamed file in the directory: linkat names it
            where = self._rel(self._absolute(call.tid, dirfd, unescape(path_arg)))
            if where is None:
                self._table(call.tid).put(fd, _Open(None, "", outside=call.ret_path), False)
                return
            inode = self._new("file", None)
            self.content[inode] = bytearray()
            rel = self._inode_names[inode] = f"{where or '.'}/(O_TMPFILE)"
        elif rel:
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
        if inode is not None and flags & os.O_TRUNC:  # Linux truncates even on O_RDONLY
            self._truncated(inode, rel, 0, f"{call.name} O_TRUNC")
        opened = _Open(
            inode,
            rel,
            append=bool(flags & os.O_APPEND),
            sync=bool(flags & (os.O_SYNC | os.O_DSYNC)),
            writable=flags & os.O_ACCMODE != os.O_RDONLY,
        )
        self._table(call.tid).put(fd, opened, cloexec=bool(flags & os.O_CLOEXEC))

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
        self._table(call.tid).drop(fd_arg(call.args[0])[0])

    def _sys_close_range(self, call: Call) -> None:
        """CLOSE_RANGE_UNSHARE first gives the calling thread a table of its own (the
        other threads keep theirs whole); CLOSE_RANGE_CLOEXEC only marks the range."""
        first, last = int_arg(call.args[0]), int_arg(call.args[1])
        flags = int_arg(call.args[2]) if len(call.args) > 2 else 0
        table = self._table(call.tid)
        if flags & _CLOSE_RANGE_UNSHARE:
            table = self.tables[call.tid] = _Table(table, table.cloexec)
        for fd in [fd for fd in table if first <= fd <= (last if last >= 0 else 2**32)]:
            if flags & _CLOSE_RANGE_CLOEXEC:
                table.cloexec.add(fd)  # only marked close-on-exec
            else:
                table.drop(fd)

    def _dup(self, call: Call, cloexec: bool = False) -> None:
        opened = self._file(call)
        if opened is not None and call.ret is not None:
            self._table(call.tid).put(call.ret, opened, cloexec)

    _sys_dup = _sys_dup2 = _dup

    def _sys_dup3(self, call: Call) -> None:
        self._dup(call, len(call.args) > 2 and bool(int_arg(call.args[2]) & os.O_CLOEXEC))

    def _sys_fcntl(self, call: Call) -> None:
        command = int_arg(call.args[1]) if len(call.args) > 1 else -1
        if command in (_F_DUPFD, _F_DUPFD_CLOEXEC):
            self._dup(call, command == _F_DUPFD_CLOEXEC)
        elif command == _F_SETFL and len(call.args) > 2:  # of the flags it sets, only
            opened = self._file(call)  # O_APPEND moves a byte (audit5 attack 2)
            if opened is not None:
                opened.append = bool(int_arg(call.args[2]) & os.O_APPEND)
        elif command == _F_SETFD and len(call.args) > 2:
            fd = fd_arg(call.args[0])[0]
            table = self._table(call.tid)
            if fd in table:
                table.put(fd, table[fd], bool(int_arg(call.args[2]) & _FD_CLOEXEC))

    _sys_fcntl64 = _sys_fcntl

    def _sys_execve(self, call: Call) -> None:
        """The new program keeps the descriptors not marked close-on-exec, in a table of
        its own (execve unshares a table its threads shared). Made by a thread other than
        the leader (:attr:`Call.former`), it is that thread's table and working directory
        the program keeps, under the leader's id (issue 29, gap 3)."""
        thread = call.tid if call.former is None else call.former
        table = self._table(thread)
        kept = {fd: opened for fd, opened in table.items() if fd not in table.cloexec}
        self.tables[call.tid] = _Table(kept)
        if call.former is not None:
            self.cwd[call.tid] = self._cwd(call.former)
            self.tables.pop(call.former, None)
            self.cwd.pop(call.former, None)

    def _sys_recvmsg(self, call: Call) -> None:
        """Descriptors received with SCM_RIGHTS (shown through ``abbrev=!recvmsg``) share
        the sender's open files, whose offset and flags the receiving table cannot know:
        one that refers to the tree is refused (issue 29, gap 2)."""
        for control in _SCM_RIGHTS.findall(", ".join(call.args)):
            if control.endswith("..."):
                self._refuse(call, "descriptors received with SCM_RIGHTS the trace cuts short")
                return
            for fd in _DECORATED_FD.findall(control):
                rel = self._rel(fd_arg(fd)[1])
                if rel is not None:
                    self._refuse(
                        call,
                        f"a descriptor of {rel or '.'} received over a Unix socket "
                        "(SCM_RIGHTS): its offset and flags are the sender's, which the "
                        "receiver's table cannot place; open the file by name in the "
                        "process that writes it",
                        rel or ".",
                    )
                    return

    _sys_recvmmsg = _sys_recvmmsg_time64 = _sys_recvmsg

    _sys_execveat = _sys_execve
