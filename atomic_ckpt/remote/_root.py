"""One checkpoint root from the string a user or a config names it by: :func:`open`, a
:class:`~._dir.RemoteCheckpointDir` for a store's URL and a ``CheckpointDir`` for a
local directory, as ``atomic-ckpt ROOT`` reads its ROOT."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

from atomic_ckpt import CheckpointDir
from atomic_ckpt.remote._dir import RemoteCheckpointDir
from atomic_ckpt.remote._open import check_not_collapsed


def open(
    root: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> RemoteCheckpointDir | CheckpointDir:
    """The checkpoint root ``root`` names: a URL (``s3://bucket/prefix``,
    ``gs://bucket/prefix``, ``az://container/prefix``, ``abfs://...``, ``memory://name``)
    opens a :class:`RemoteCheckpointDir` with ``storage_options``; a path, or a
    ``file://`` URL, a local ``CheckpointDir``. ``options`` go to that class
    (``prefix``, ``checksum``, ``workers``, ...).

    A training script can then take one ``--checkpoint-dir`` for a disk and a bucket
    alike; the two classes share ``commit``, ``latest``, ``steps``, ``get``,
    ``verify``, ``delete``, ``prune``, ``retain``, ``clean`` and ``entries``. A URL of
    any other store is refused with :class:`UnsupportedStoreError`, like
    :class:`RemoteCheckpointDir` refuses it; ``storage_options`` for a local root are a
    ``ValueError``, and so is a URL whose ``//`` ``pathlib.Path`` collapsed
    (``gs:/bucket/run``): a local directory named like that is written ``./gs:/...``.
    """
    text = os.fspath(root)
    if not isinstance(text, str):
        raise TypeError(f"root must be a str or a path, got {root!r}")
    check_not_collapsed(text)
    if "://" in text and not text.lower().startswith("file://"):
        return RemoteCheckpointDir(text, storage_options=storage_options, **options)
    if storage_options:
        raise ValueError(f"{text}: storage_options apply to an object-store URL, not a directory")
    if "://" in text:  # file:///abs/path or file://localhost/abs/path
        parts = urllib.parse.urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file:// URL names a path on this machine")
        text = urllib.parse.unquote(parts.path)
    return CheckpointDir(text, **options)
