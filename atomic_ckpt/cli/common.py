"""What the ``atomic-ckpt`` commands share: the exit statuses, the one-line failure,
opening ROOT (a directory or a URL) and byte sizes for people.

(Private: used by :mod:`atomic_ckpt.cli` and its ``_cli_*`` modules; like them it
uses only atomic_ckpt's public API.)
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from atomic_ckpt import CheckpointDir

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


def is_url(root: str) -> bool:
    return "://" in root


def open_remote(args: argparse.Namespace) -> RemoteCheckpointDir:
    from atomic_ckpt.remote import RemoteCheckpointDir  # ImportError names the extra

    return RemoteCheckpointDir(args.root, storage_options=args.storage_options, prefix=args.prefix)


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
