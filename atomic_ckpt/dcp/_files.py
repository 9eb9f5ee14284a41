"""The file side of :class:`atomic_ckpt.dcp.AtomicWriter`: the files DCP writes.

``_CreatedFiles`` is the filesystem handed to ``FileSystemWriter``: it notes every
file this rank creates (so exactly those are fsynced and hashed) and every error
raised while one was written; ``_Writeback`` starts the disk's writeback of such a
file every ``WRITEBACK_CHUNK`` bytes while DCP is still writing it.
(Private: imported by :mod:`atomic_ckpt.dcp` after its torch version check.)
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Iterator
from typing import Any, cast

from torch.distributed.checkpoint.filesystem import FileSystem

from atomic_ckpt._core.l2_syscalls import fs as _fs

WRITEBACK_CHUNK = 32 << 20
"""Bytes a DCP file stream is written between two writeback starts (see _Writeback)."""


class _Writeback:
    """A DCP file stream that starts the kernel's writeback every ``WRITEBACK_CHUNK`` bytes.

    The disk then writes while DCP is still serializing, instead of only during the
    fsync that follows the file (what ``FileSystemWriter(sync_files=True)`` does):
    that fsync waits for the tail alone. Only a hint (``_fs.start_writeback``): the
    durability still comes from the fsync. DCP uses write, tell, flush and close.
    """

    def __init__(self, stream: io.IOBase) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._end = self._started = stream.tell()

    def write(self, data: Any) -> int:
        written: int = self._stream.write(data)  # DCP only appends
        self._end += written
        if self._end - self._started >= WRITEBACK_CHUNK:
            self._stream.flush()  # what is still in Python's buffer is not dirty yet
            _fs.start_writeback(self._fd, self._started, self._end - self._started)
            self._started = self._end
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _CreatedFiles(FileSystem):
    """FileSystemWriter's filesystem, noting every file it creates (for this rank's fsyncs)
    and every error raised while one was written: FileSystemWriter's extra writer threads
    (``thread_count > 1``) drop their exceptions, so ``write_data`` must ask here.
    With ``writeback`` (a durable root), the files it writes start their writeback early.
    """

    def __init__(self, *, writeback: bool) -> None:
        super().__init__()
        self.created: set[str] = set()
        self.errors: list[BaseException] = []
        self.writeback = writeback
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        writing = "w" in mode or "a" in mode or "x" in mode
        if writing:
            with self._lock:
                self.created.add(os.fspath(path))
        try:
            with super().create_stream(path, mode) as stream:
                if writing and self.writeback:
                    yield cast(io.IOBase, _Writeback(stream))  # a stand-in, see there
                else:
                    yield stream
        except BaseException as exc:
            with self._lock:
                self.errors.append(exc)
            raise
