"""Which stores atomic_ckpt.remote commits to, decided here once: :func:`open_store`.

Only stores with a create-only and a compare-and-swap write can carry the commit
point: ``s3://`` (through s3fs), ``gs://`` (google-cloud-storage), ``az://`` and
``abfs://`` (azure-storage-blob) and ``memory://``. Any other protocol is refused
with :class:`~._store.UnsupportedStoreError`.
"""

from __future__ import annotations

import importlib
from typing import Any

from atomic_ckpt.remote._azure import open_azure
from atomic_ckpt.remote._gcs import open_gcs
from atomic_ckpt.remote._memory import MemoryStore
from atomic_ckpt.remote._s3 import S3Store, load_s3fs
from atomic_ckpt.remote._store import Store, UnsupportedStoreError

# fsspec ships no type information: imported as a module of type Any, so that
# mypy --strict needs no override for it.
fsspec: Any = importlib.import_module("fsspec")


def open_store(url: str, storage_options: dict[str, Any] | None) -> Store:
    """The store of ``url``; ``storage_options`` go to fsspec unchanged for ``s3://``, and
    are read as gcsfs's (``gs://``) or adlfs's (``az://``) otherwise."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            f"{url!r} is not a URL (s3://bucket/prefix, gs://bucket/prefix, "
            "az://container/prefix, memory://name)"
        )
    protocol = url.split("://", 1)[0].lower()
    options = dict(storage_options or {})
    if protocol in ("s3", "s3a"):
        load_s3fs()
        fs, root = fsspec.core.url_to_fs(url, **options)
        return S3Store(url, fs, root)
    if protocol in ("gs", "gcs"):
        return open_gcs(url, url.split("://", 1)[1], options)
    if protocol in ("az", "abfs"):
        return open_azure(url, url.split("://", 1)[1], options)
    if protocol == "memory":
        fs, root = fsspec.core.url_to_fs(url, **options)
        return MemoryStore(url, fs, "/" + root.strip("/"))
    raise UnsupportedStoreError(
        f"{url}: atomic_ckpt.remote commits only where the store has a create-only "
        "and a compare-and-swap write: s3:// (AWS S3 and S3-compatible servers that "
        "honour If-None-Match and If-Match), gs:// (Google Cloud Storage), az:// or "
        "abfs:// (Azure Blob Storage) and memory://. For a local or mounted "
        "filesystem use atomic_ckpt.CheckpointDir",
        path=None,
    )
