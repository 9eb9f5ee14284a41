"""Atomic checkpoints in object storage (S3 and S3-compatible stores, Google Cloud Storage,
Azure Blob), committed with a conditional write. Needs the ``s3``, ``gcs`` or ``azure``
extra: ``pip install 'atomic_ckpt[s3]'``.

::

    from atomic_ckpt.remote import RemoteCheckpointDir

    ckpts = RemoteCheckpointDir("s3://bucket/run1")
    with ckpts.commit(step) as path:      # a local staging directory
        save_everything_into(path)
    # here s3://bucket/run1/<step> is complete, or untouched on error
    last = ckpts.latest()

    ckpts = atomic_ckpt.remote.open(args.checkpoint_dir)  # a URL or a local directory

The protocol and its invariants: docs/guides/object-storage-protocol.md.
"""

from __future__ import annotations

import importlib

from atomic_ckpt._core.l1_names import public as _public

try:
    importlib.import_module("fsspec")
except ImportError as exc:  # pragma: no cover (the extra is installed in CI)
    raise ImportError(
        "atomic_ckpt.remote needs fsspec: pip install 'atomic_ckpt[s3]' (or [gcs], [azure])"
    ) from exc

from atomic_ckpt.remote._commit import RemoteCommit
from atomic_ckpt.remote._dir import DEFAULT_GRACE, RemoteCheckpointDir
from atomic_ckpt.remote._entries import RemoteEntry
from atomic_ckpt.remote._mirror import AsyncRemoteCommitter, Mirror
from atomic_ckpt.remote._protocol import ATTEMPT_KEY, RemoteCheckpoint
from atomic_ckpt.remote._root import open
from atomic_ckpt.remote._store import NoSuchBucketError, UnsupportedStoreError

__all__ = [
    "ATTEMPT_KEY",
    "DEFAULT_GRACE",
    "AsyncRemoteCommitter",
    "Mirror",
    "NoSuchBucketError",
    "RemoteCheckpoint",
    "RemoteCheckpointDir",
    "RemoteCommit",
    "RemoteEntry",
    "UnsupportedStoreError",
    "open",
]

_public.export(__name__, globals(), __all__)
