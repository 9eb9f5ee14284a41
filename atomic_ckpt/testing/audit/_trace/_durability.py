"""Replay of the durability calls: fsync, fdatasync, sync, syncfs."""

from __future__ import annotations

from atomic_ckpt.testing._results import ALL_INODES
from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._trace._model import _Replay


class _Durability(_Replay):
    """fsync, fdatasync (one file durable), sync, syncfs (everything durable)."""

    def _sys_fsync(self, call: Call) -> None:
        opened = self._file(call)
        if opened is not None and opened.inode is not None:
            self._op("sync", opened.inode, f"{call.name} {self._name_of(opened.path)}")

    _sys_fdatasync = _sys_fsync

    def _sys_sync(self, call: Call) -> None:
        self._op("sync", ALL_INODES, call.name + " (everything durable)")

    _sys_syncfs = _sys_sync
