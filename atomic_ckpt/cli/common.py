"""What the ``atomic-ckpt`` commands share: the exit statuses, the one-line failure,
opening ROOT (a directory or a URL) and byte sizes for people.

(Private: used by :mod:`atomic_ckpt.cli` and its ``_cli_*`` modules; like them it
uses only atomic_ckpt's public API.)
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from atomic_ckpt import CheckpointDir, VerificationError

if TYPE_CHECKING:
    from atomic_ckpt.remote import RemoteCheckpointDir

EXIT_OK = 0
EXIT_NONE = 1
EXIT_ERROR = 2


class Failure(Exception):
    """A problem to report on one line with an exit status."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


_MORE = re.compile(r" \(and \d+ more: see \.problems\)$")
"""How a VerificationError's message points a Python caller at its ``problems``."""


def error_lines(exc: BaseException) -> list[str]:
    """What the command line prints for an error: one line, and for a failed verification
    with several problems, one more line for each problem after the first (the message
    names the first; its pointer to the ``problems`` attribute means nothing here)."""
    message = str(exc)
    if isinstance(exc, VerificationError) and len(exc.problems) > 1:
        message = _MORE.sub("", message)
        return [f"atomic-ckpt: error: {message}", *(f"  {p}" for p in exc.problems[1:])]
    return [f"atomic-ckpt: error: {message}"]


_COLLAPSED_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
"""A URL whose ``//`` a wrapper's pathlib.Path collapsed (``gs:/b/run``): never a local
root, the remote layer says what happened (a drive letter, ``C:/x``, is no scheme)."""


def is_url(root: str) -> bool:
    return "://" in root or _COLLAPSED_URL.match(root) is not None


def open_remote(args: argparse.Namespace) -> RemoteCheckpointDir:
    from atomic_ckpt.remote import (  # ImportError names the extra
        RemoteCheckpointDir,
        UnsupportedStoreError,
    )

    try:
        return RemoteCheckpointDir(
            args.root, storage_options=args.storage_options, prefix=args.prefix
        )
    except UnsupportedStoreError:
        raise Failure(
            f"{args.root}: not a store atomic_ckpt commits to (it needs create-only and "
            "compare-and-swap writes): ROOT is a local directory (a mounted filesystem "
            "too), s3://bucket/prefix, gs://bucket/prefix, az://container/prefix or memory://name"
        ) from None


def open_local(args: argparse.Namespace) -> CheckpointDir:
    if args.storage_options is not None:
        raise Failure("--storage-options applies to a URL root only")
    ckpts = CheckpointDir(args.root, prefix=args.prefix)
    if not ckpts.root.is_dir():
        raise Failure(f"no checkpoints: {ckpts.root} does not exist", EXIT_NONE)
    return ckpts


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
