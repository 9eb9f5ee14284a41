"""Replay of the process calls: fork, vfork, clone, clone3 (descriptor tables), chdir, fchdir."""

from __future__ import annotations

import os

from atomic_ckpt.testing.audit._strace import Call, fd_arg, int_arg, unescape
from atomic_ckpt.testing.audit._trace._model import UNPLACED, _Replay, _Table

_CLONE_FS = 0x200
_CLONE_FILES = 0x400
_CLONE_THREAD = 0x10000


def clone_flags(text: str) -> int:
    """strace's ``0x1200000|17`` (raw flags, the exit signal after ``|``) as a number;
    named flags (``CLONE_VM|CLONE_FS|SIGCHLD``) too."""
    names = {"CLONE_FS": _CLONE_FS, "CLONE_FILES": _CLONE_FILES, "CLONE_THREAD": _CLONE_THREAD}
    flags = 0
    for raw in text.split("|"):
        part = raw.strip()
        value = names.get(part, 0) if part.startswith("CLONE_") else int_arg(part)
        if value < 0:
            raise ValueError(f"clone flags {text!r} cannot be read")
        flags |= value
    return flags


class _Processes(_Replay):
    """fork, vfork, clone, clone3 (descriptor tables shared or copied); chdir, fchdir."""

    def _clone(self, call: Call, flags: int) -> None:
        child = call.ret
        assert child is not None
        parent = self._table(call.tid)
        own = self.tables.get(child, _Table())
        # The child may have run before its parent's clone returned (strace prints the two
        # in completion order): what it opened meanwhile joins the table, but a descriptor
        # it could only place by path never replaces the parent's own entry.
        table = parent if flags & _CLONE_FILES else _Table(parent, parent.cloexec)
        for fd, opened in own.items():
            if opened.pos >= 0 or fd not in table:  # pos -1: placed by path only
                table.put(fd, opened, fd in own.cloexec)
        self.tables[child] = table
        cwd = self._cwd(call.tid)
        # CLONE_FS (every thread): one working directory; else the child's own copy
        self.cwd[child] = cwd if flags & _CLONE_FS else [cwd[0]]

    def _sys_clone(self, call: Call) -> None:
        flags = next((clone_flags(a[6:]) for a in call.args if a.startswith("flags=")), 0)
        self._clone(call, flags)

    def _sys_clone3(self, call: Call) -> None:
        text = call.args[0] if call.args else ""
        at = text.find("flags=")
        flags = clone_flags(text[at + 6 :].split(",", 1)[0].rstrip("}")) if at >= 0 else 0
        self._clone(call, flags)

    def _sys_fork(self, call: Call) -> None:
        self._clone(call, 0)

    _sys_vfork = _sys_fork

    def _sys_chdir(self, call: Call) -> None:
        path = unescape(call.args[0])
        if self._cwd(call.tid)[0].startswith(UNPLACED) and not os.path.isabs(path):
            return  # still somewhere the replay cannot place ("..": not "/")
        self._cwd(call.tid)[0] = os.path.normpath(self._absolute(call.tid, None, path))

    def _sys_fchdir(self, call: Call) -> None:
        fd, decoration = fd_arg(call.args[0])
        self._cwd(call.tid)[0] = decoration or self._bare(call.tid, fd)

    def _sys_unshare(self, call: Call) -> None:
        """CLONE_FILES gives the calling thread a copy of its descriptor table, CLONE_FS
        its own working directory (its threads no longer share them); the namespaces it
        makes change no path (a mount in one is refused)."""
        flags = int_arg(call.args[0]) if call.args else 0
        if flags & _CLONE_FILES:
            table = self._table(call.tid)
            self.tables[call.tid] = _Table(table, table.cloexec)
        if flags & _CLONE_FS:
            self.cwd[call.tid] = [self._cwd(call.tid)[0]]
