"""Replay of the process calls: fork, vfork, clone, clone3 (descriptor tables), chdir, fchdir."""

from __future__ import annotations

import os

from atomic_ckpt.testing.audit._strace import Call, fd_arg, int_arg, unescape
from atomic_ckpt.testing.audit._trace._model import _Replay

_CLONE_FILES = 0x400
_CLONE_THREAD = 0x10000


class _Processes(_Replay):
    """fork, vfork, clone, clone3 (descriptor tables shared or copied); chdir, fchdir."""

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

    def _sys_chdir(self, call: Call) -> None:
        self.cwd[call.tid] = os.path.normpath(
            self._absolute(call.tid, None, unescape(call.args[0]))
        )

    def _sys_fchdir(self, call: Call) -> None:
        decoration = fd_arg(call.args[0])[1]
        if decoration is not None:
            self.cwd[call.tid] = decoration
