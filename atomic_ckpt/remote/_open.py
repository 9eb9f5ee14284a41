"""Which stores atomic_ckpt.remote commits to, decided here once: :func:`open_store`.

Only stores with a create-only and a compare-and-swap write can carry the commit
point: ``s3://`` (through s3fs), ``gs://`` (google-cloud-storage), ``az://`` and
``abfs://`` (azure-storage-blob) and ``memory://``. Any other protocol is refused
with :class:`~._store.UnsupportedStoreError`.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from atomic_ckpt.remote._azure import open_azure
from atomic_ckpt.remote._gcs import open_gcs
from atomic_ckpt.remote._memory import MemoryStore
from atomic_ckpt.remote._s3 import S3Store, load_s3fs
from atomic_ckpt.remote._store import Store, UnsupportedStoreError

# fsspec ships no type information: imported as a module of type Any, so that
# mypy --strict needs no override for it.
fsspec: Any = importlib.import_module("fsspec")


_BUCKETS = {
    # GCS: 3-63 characters, lowercase letters, digits, - _ and .; with dots up to 222,
    # each dot-separated part 1-63 characters.
    "gs": (
        "BUCKET",
        "GCS bucket",
        re.compile(
            r"(?!.*\.\.)"  # no empty part
            r"(?=.{3,63}$|(?=.{3,222}$)[^.]{1,63}(?:\.[^.]{1,63})+$)"  # the lengths
            r"[a-z0-9][a-z0-9._-]*[a-z0-9]"
        ),
    ),
    # Azure: 3-63 lowercase letters, digits and single hyphens, or a system container.
    "az": (
        "CONTAINER",
        "Azure container",
        re.compile(r"\$root|\$web|\$logs|(?=.{3,63}$)[a-z0-9](?:-?[a-z0-9])+"),
    ),
    # S3: what an S3-compatible server may allow (legacy buckets have capitals and _).
    "s3": ("BUCKET", "bucket", re.compile(r"[^/?#\s]+")),
}
_FAMILY = {"gs": "gs", "gcs": "gs", "az": "az", "abfs": "az", "s3": "s3", "s3a": "s3"}


_COLLAPSED = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
"""A URL whose ``//`` became ``/``: ``pathlib.Path("gs://b/run")`` is ``gs:/b/run``. A
scheme has two characters at least, so a Windows drive (``C:/x``) is no such URL."""


def check_not_collapsed(name: str) -> None:
    """Refuse (ValueError) a root like ``gs:/b/run``: a URL that went through
    ``pathlib.Path``, which collapses its ``//``. Opened as a path it would be a local
    directory named ``gs:`` that checkpoints meant for the bucket land in, silently."""
    match = _COLLAPSED.match(name)
    if match is None or "://" in name:
        return
    scheme = match.group(1)
    raise ValueError(
        f"{name}: a URL whose '//' was collapsed to '/' (pathlib.Path does that: "
        f"Path('{scheme}://b/run') is '{scheme}:/b/run'): pass the URL as a str, "
        f"{scheme}://{name[len(scheme) + 2 :]}; for a local directory of that name write "
        f"./{name}"
    )


def check_root(url: str, protocol: str) -> None:
    """Refuse (ValueError naming the form a root takes) a root with no bucket right after
    ``://`` (``gs:///run`` is not the bucket "run"), a bucket the store's naming rules
    forbid, a ``.`` or ``..`` segment in the prefix, or an empty one (``run//x``: the
    store keeps it apart from ``run/x``). A trailing ``/`` is no segment."""
    family = _FAMILY.get(protocol)
    if family is None:
        return
    kind, what, rule = _BUCKETS[family]
    form = f"{protocol}://{kind}/PREFIX (PREFIX may be empty)"
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    if family == "az" and "@" in bucket:  # adlfs's container@account-host
        bucket, _, host = bucket.partition("@")
        form = f"{protocol}://{kind}/PREFIX or {protocol}://{kind}@HOST/PREFIX"
        if not host:
            raise ValueError(f"{url}: no account host after '@': a root is {form}")
    if not bucket:
        why = f"no {kind.lower()} right after '{protocol}://'"
    elif not rule.fullmatch(bucket):
        why = f"{bucket!r} is no valid {what} name"
    elif prefix.rstrip("/") and "" in prefix.rstrip("/").split("/"):
        why = "the prefix has an empty segment ('//')"
    elif {".", ".."} & set(prefix.split("/")):
        # Request URLs have their dot segments resolved on the way (Azure answered 403,
        # as if the credentials were wrong); GCS and S3 keep them as literal names.
        why = f"the prefix {prefix!r} has a '.' or '..' segment: name the folder plainly"
    else:
        return
    raise ValueError(f"{url}: {why}: a root is {form}")


def open_store(url: str, storage_options: dict[str, Any] | None) -> Store:
    """The store of ``url``; ``storage_options`` go to fsspec unchanged for ``s3://``, and
    are read as gcsfs's (``gs://``) or adlfs's (``az://``) otherwise."""
    if isinstance(url, str):
        check_not_collapsed(url)
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            f"{url!r} is not a URL (s3://bucket/prefix, gs://bucket/prefix, "
            "az://container/prefix, memory://name)"
        )
    protocol = url.split("://", 1)[0].lower()
    check_root(url, protocol)
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
