"""The ``atomic-ckpt ls`` command: one row per step (local or remote), as a table or JSON.

A local row takes its counts from the marker's header when there is one, else
from a walk of the directory. (Private: used by :mod:`atomic_ckpt.cli`.)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomic_ckpt import Entry
from atomic_ckpt.cli.common import EXIT_OK, human, is_url, open_local, open_remote

if TYPE_CHECKING:
    from atomic_ckpt.remote import RemoteEntry


def ls(args: argparse.Namespace) -> int:
    if is_url(args.root):
        remote = open_remote(args)
        rows = [_remote_row(e) for e in remote.entries()]
        where = remote.url
    else:
        ckpts = open_local(args)
        rows = [r for e in ckpts.entries(include_staging=True) if (r := _row(e)) is not None]
        where = str(ckpts.root)
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    if not rows:
        print(f"no checkpoints in {where}")
        return EXIT_OK
    w = max(9, *(len(r["status"]) for r in rows))  # remote: "uncommitted"
    print(f"{'STEP':>8}  {'STATUS':<{w}} {'FILES':>5} {'SIZE':>10}  {'CREATED':<19}  PATH")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"] or 0))
        step = "-" if r["step"] is None else str(r["step"])
        print(
            f"{step:>8}  {r['status']:<{w}} {r['files']:>5} {human(r['size']):>10}  {when}  "
            f"{r['path']}"
        )
    return EXIT_OK


def _on_disk(path: Path) -> tuple[int, int, float]:
    """(files, bytes, mtime) of a directory tree, walked without following links.

    Iterative (a legally deep tree is fine); entries that vanish meanwhile are skipped.
    """
    files = size = 0
    stack = [os.fspath(path)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        continue
                    size += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                files += 1
    return files, size, os.lstat(path).st_mtime


def _row(e: Entry) -> dict[str, Any] | None:
    """One line of ``ls``; None for an entry deleted since the listing."""
    if e.manifest is not None and not e.manifest.legacy:
        m = e.manifest  # counts from the marker's header: its file list is never parsed
        files, size, created = m.file_count, m.total_size, m.created
    else:
        try:
            files, size, created = _on_disk(e.path)
        except FileNotFoundError:
            return None
    return {
        "step": e.step,
        "status": e.status,
        "files": files,
        "size": size,
        "created": created,
        "path": str(e.path),
        **({"problem": e.problem} if e.problem else {}),
    }


def _remote_row(e: RemoteEntry) -> dict[str, Any]:
    m = e.manifest
    return {
        "step": e.step,
        "status": e.status,
        "files": m.file_count if m is not None else 0,
        "size": m.total_size if m is not None else 0,
        "created": m.created if m is not None else None,
        "path": e.url,
        **({"problem": e.problem} if e.problem else {}),
        **({"attempts": e.attempts} if e.status != "complete" else {}),
    }
