"""Replay of the durability calls: fsync, fdatasync, sync, syncfs."""

from __future__ import annotations

import os

from atomic_ckpt.testing._results import ALL_INODES
from atomic_ckpt.testing.audit._strace import Call, fd_arg
from atomic_ckpt.testing.audit._trace._model import _Replay


class _Durability(_Replay):
    """fsync, fdatasync (one file durable), sync (everything durable), syncfs (everything
    durable if its descriptor is on the audited tree's filesystem)."""

    def _sys_fsync(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and opened.inode is not None:
            self._op("sync", opened.inode, f"{call.name} {self._name_of(opened.path)}")

    _sys_fdatasync = _sys_fsync

    def _sys_sync(self, call: Call) -> None:
        self._op("sync", ALL_INODES, call.name + " (everything durable)")

    def _sys_syncfs(self, call: Call) -> None:
        where = fd_arg(call.args[0])[1] if call.args else None
        try:
            same = where is not None and os.stat(where).st_dev == os.stat(self.root_real).st_dev
        except OSError:  # gone since: it cannot be told, so it syncs nothing (pessimistic)
            same = False
        if same or self._rel(where) is not None:
            self._op("sync", ALL_INODES, f"syncfs {where} (the tree's filesystem durable)")
