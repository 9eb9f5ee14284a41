"""``memory://`` as a :class:`~._store.Store`: :class:`MemoryStore`, fsspec's in-memory
filesystem, for one process (tests and examples)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from atomic_ckpt.remote._store import ObjectInfo, PreconditionFailed, Store, Upload, read_range

_MEMORY_LOCK = threading.Lock()


class MemoryStore(Store):
    """fsspec's in-memory filesystem: one process's store, for tests and examples.

    Its conditional writes are a check and a write under one lock, which is
    atomic because every writer is in this process. ETags are MD5 digests of
    the contents, as S3's are for a plain PutObject.
    """

    def _etag(self, data: bytes) -> str:
        return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'

    def create(self, key: str, data: bytes) -> str:
        with _MEMORY_LOCK:
            if self.fs.exists(self.path(key)):
                raise PreconditionFailed(self.url_of(key))
            self.fs.pipe_file(self.path(key), data)
        return self._etag(data)

    def replace(self, key: str, data: bytes, etag: str) -> str:
        with _MEMORY_LOCK:
            try:
                current = self.fs.cat_file(self.path(key))
            except FileNotFoundError:
                raise PreconditionFailed(self.url_of(key)) from None
            if self._etag(current) != etag:
                raise PreconditionFailed(self.url_of(key))
            self.fs.pipe_file(self.path(key), data)
        return self._etag(data)

    def upload(self, files: Sequence[Upload]) -> dict[str, str]:
        out = {}
        for f in files:
            data = read_range(f.path, 0, f.size)
            self.fs.pipe_file(self.path(f.key), data)
            out[f.key] = self._etag(data)
        return out

    def get(self, key: str) -> tuple[bytes, str] | None:
        with _MEMORY_LOCK:
            try:
                data = bytes(self.fs.cat_file(self.path(key)))
            except FileNotFoundError:
                return None
        return data, self._etag(data)

    def find(self, prefix: str) -> dict[str, ObjectInfo]:
        start = len(self.root) + 1
        out = {}
        with _MEMORY_LOCK:
            found = self.fs.find(self.path(prefix), detail=True)
            for path, info in found.items():
                key = path.lstrip("/")[start:]
                if not key.startswith(prefix):
                    continue
                data = self.fs.cat_file(path)
                created = info.get("created") or time.time()
                out[key] = ObjectInfo(key, int(info["size"]), self._etag(data), float(created))
        return out

    def children(self, prefix: str) -> list[str]:
        try:
            listed = self.fs.ls(self.path(prefix), detail=False)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed)

    def download(self, pairs: Sequence[tuple[str, Path]]) -> None:
        for key, dest in pairs:
            data = self.fs.cat_file(self.path(key))
            with open(dest, "xb") as f:
                f.write(data)

    def delete(self, keys: Iterable[str]) -> None:
        with _MEMORY_LOCK:
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self.path(key))
