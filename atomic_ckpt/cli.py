"""The ``atomic-ckpt`` command line.

Exit status: 0 success; 1 "nothing there" (no checkpoint, a failed
verification) so shell scripts can branch on it; 2 an error (bad input, I/O).
Errors print one line on stderr, never a traceback.

ROOT is a directory or an object-store URL (``s3://bucket/prefix``,
``memory://``): ``ls``, ``latest``, ``verify``, ``clean``, ``prune`` and ``fetch``
take either (a URL needs the ``s3`` extra; ``--storage-options`` passes a JSON
object to fsspec, and the usual AWS environment variables work).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from . import (
    CheckpointDir,
    CheckpointError,
    CheckpointNotFoundError,
    Entry,
    VerificationError,
    __version__,
    parse_step,
)

if TYPE_CHECKING:
    from .remote import RemoteCheckpointDir, RemoteEntry

EXIT_OK = 0
EXIT_NONE = 1
EXIT_ERROR = 2


class _Failure(Exception):
    """A problem to report on one line with an exit status."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="atomic-ckpt",
        description="Inspect, verify and repair directories of atomically committed checkpoints.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def root_cmd(name: str, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help)
        c.add_argument(
            "root", metavar="ROOT", help="the checkpoint root: a directory or s3://bucket/prefix"
        )
        c.add_argument("--prefix", default="", help="step directory prefix, e.g. checkpoint-")
        c.add_argument(
            "--storage-options",
            metavar="JSON",
            type=_json_object,
            default=None,
            help='for a URL: fsspec options as a JSON object, e.g. \'{"endpoint_url": "..."}\'',
        )
        return c

    c = root_cmd("ls", "list steps: complete, unmarked (no marker) and staging")
    c.add_argument("--json", action="store_true", help="print JSON")
    c = root_cmd("latest", "print the newest complete checkpoint's path (exit 1 if none)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c = root_cmd("verify", "check files against the manifest (all complete steps, or STEP)")
    c.add_argument("step", metavar="STEP", nargs="?", type=int, help="only this step")
    c.add_argument("--json", action="store_true", help="print JSON")
    c = root_cmd("clean", "remove staging dirs left by crashed or killed saves")
    c.add_argument("--dry-run", action="store_true", help="only show what would be removed")
    c.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="for a URL: remove only uncommitted attempts older than this (default 3600)",
    )
    c.add_argument(
        "--force",
        action="store_true",
        help="also remove .tmp-NAME.<32 hex> (and 0.1's NAME.tmp-<32 hex>) entries that carry "
        "no evidence atomic_ckpt made "
        "them (e.g. a staging dir whose lock file a power loss dropped)",
    )
    c = root_cmd("prune", "delete all but the newest complete checkpoints")
    c.add_argument("--keep-last", type=int, required=True, metavar="N", help="keep N (>= 1)")
    c = root_cmd("fetch", "download a checkpoint from a URL into a new local directory")
    c.add_argument("step", metavar="STEP", type=int, help="the step (see `latest`)")
    c.add_argument("dest", metavar="DEST", help="the new directory (must not exist)")
    c = sub.add_parser(
        "mark-complete",
        help="adopt a checkpoint directory written without atomic_ckpt",
        description="fsync a checkpoint directory's files and write its manifest marker",
    )
    c.add_argument("path", metavar="PATH", help="the step directory, e.g. ckpts/1200")
    c.add_argument("--prefix", default="", help="step directory prefix, e.g. checkpoint-")
    c = sub.add_parser("demo", help="watch a training run survive a kill mid-save")
    c.add_argument("dir", metavar="DIR", nargs="?", help="work here instead of a temp dir")
    c.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    c.add_argument(
        "--trainer",
        action="store_true",
        help="the same with a Hugging Face Trainer (needs atomic_ckpt[transformers])",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``atomic-ckpt`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="atomic-ckpt: warning: %(message)s")
    try:
        status: int = _COMMANDS[args.command](args)
    except _Failure as exc:
        print(f"atomic-ckpt: {exc}", file=sys.stderr)
        return exc.status
    except (CheckpointError, OSError, ValueError, ImportError) as exc:
        print(f"atomic-ckpt: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("atomic-ckpt: interrupted", file=sys.stderr)
        return 130
    return status


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _is_url(root: str) -> bool:
    return "://" in root


def _remote(args: argparse.Namespace) -> RemoteCheckpointDir:
    from .remote import RemoteCheckpointDir  # ImportError names the extra

    return RemoteCheckpointDir(args.root, storage_options=args.storage_options, prefix=args.prefix)


def _open(args: argparse.Namespace) -> CheckpointDir:
    if args.storage_options is not None:
        raise _Failure("--storage-options applies to a URL root only")
    ckpts = CheckpointDir(args.root, prefix=args.prefix)
    if not ckpts.root.is_dir():
        raise _Failure(f"no checkpoints: {ckpts.root} does not exist", EXIT_NONE)
    return ckpts


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


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


def _ls(args: argparse.Namespace) -> int:
    if _is_url(args.root):
        remote = _remote(args)
        rows = [_remote_row(e) for e in remote.entries()]
        where = remote.url
    else:
        ckpts = _open(args)
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
            f"{step:>8}  {r['status']:<{w}} {r['files']:>5} {_human(r['size']):>10}  {when}  "
            f"{r['path']}"
        )
    return EXIT_OK


def _latest(args: argparse.Namespace) -> int:
    found: tuple[int, str] | None
    if _is_url(args.root):
        remote_ckpt = _remote(args).latest()
        found = None if remote_ckpt is None else (remote_ckpt.step, remote_ckpt.url)
    else:
        ckpt = _open(args).latest()
        found = None if ckpt is None else (ckpt.step, str(ckpt.path))
    if found is None:
        raise _Failure(f"no complete checkpoint in {args.root}", EXIT_NONE)
    if args.json:
        print(json.dumps({"step": found[0], "path": found[1]}))
    else:
        print(found[1])
    return EXIT_OK


def _verify_remote(args: argparse.Namespace) -> int:
    remote = _remote(args)
    steps = [args.step] if args.step is not None else remote.steps()
    if not steps:
        raise _Failure(f"no complete checkpoint in {remote.url}", EXIT_NONE)
    results: list[dict[str, Any]] = []
    for step in steps:
        try:
            ckpt = remote.verify(step)
            results.append({"step": step, "ok": True, "legacy": False, "path": ckpt.url})
        except (CheckpointNotFoundError, VerificationError) as exc:
            result: dict[str, Any] = {"step": step, "ok": False, "error": str(exc)}
            if isinstance(exc, VerificationError):
                result["problems"] = list(exc.problems)
            results.append(result)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(f"step {r['step']}: ok" if r["ok"] else f"step {r['step']}: FAILED: {r['error']}")
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_NONE


def _verify(args: argparse.Namespace) -> int:
    if _is_url(args.root):
        return _verify_remote(args)
    ckpts = _open(args)
    listed = args.step is None
    steps = [args.step] if args.step is not None else ckpts.steps()
    if not steps:
        raise _Failure(f"no complete checkpoint in {ckpts.root}", EXIT_NONE)
    show = not args.json and sys.stderr.isatty()
    results: list[dict[str, Any]] = []
    for step in steps:
        bar = _ProgressBar(f"step {step}", sys.stderr) if show else None
        try:
            results.append(_verify_one(ckpts, step, listed=listed, progress=bar))
        finally:
            if bar is not None:
                bar.close()
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            if r.get("gone"):
                print(f"step {r['step']}: gone (deleted during the run)")
            elif r["ok"]:
                note = " (legacy marker: presence only)" if r["legacy"] else ""
                print(f"step {r['step']}: ok{note}")
            else:
                print(f"step {r['step']}: FAILED: {r['error']}")
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_NONE


def _verify_one(
    ckpts: CheckpointDir,
    step: int,
    *,
    listed: bool,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Verify one step. A step listed a moment ago that a live run deleted (or replaced)
    meanwhile is reported as gone (or verified again), never as FAILED."""
    for attempt in (1, 2):
        try:
            ckpt = ckpts.verify(step, progress=progress)
            return {
                "step": step,
                "ok": True,
                "legacy": ckpt.manifest.legacy,
                "path": str(ckpt.path),
            }
        except (CheckpointNotFoundError, VerificationError) as exc:
            failure = exc
        if listed and not os.path.lexists(ckpts.path_of(step)):
            return {"step": step, "ok": True, "gone": True}
        if not (listed and attempt == 1 and isinstance(failure, VerificationError)):
            break
    result: dict[str, Any] = {"step": step, "ok": False, "error": str(failure)}
    if isinstance(failure, VerificationError):
        result["problems"] = list(failure.problems)
    return result


class _ProgressBar:
    """One self-overwriting line on a terminal: a bar, bytes done of total, rate and ETA.

    Called as a verify progress callback; ``close()`` erases the line, so what
    follows (the verdict, on stdout) starts on a clean one. The line fits the
    terminal's width (a wrapped line could not be overwritten).
    """

    WIDTH = 24

    def __init__(self, label: str, stream: TextIO) -> None:
        self._label = label
        self._stream = stream
        self._start = time.monotonic()
        self._shown = 0
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # not a real terminal (tests)
            columns = 0
        self._columns = columns if columns > 0 else 80  # a pty may report 0: unknown

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self._start
        fraction = done / total if total else 1.0
        rate = done / elapsed if elapsed > 0 else 0.0
        if done >= total:
            eta = "done"
        elif rate > 0:
            eta = "ETA " + _clock((total - done) / rate)
        else:
            eta = "ETA --:--"
        head = f"{self._label}: "
        tail = f" {fraction:4.0%} {_human(done)} / {_human(total)}  {_human(int(rate))}/s  {eta}"
        width = min(self.WIDTH, self._columns - 1 - len(head) - len(tail) - 2)
        filled = int(width * fraction)
        bar = f"[{'#' * filled}{'-' * (width - filled)}]" if width >= 5 else ""
        line = (head + bar + tail)[: max(self._columns - 1, 1)]
        self._stream.write("\r" + line.ljust(self._shown))
        self._stream.flush()
        self._shown = len(line)

    def close(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()
            self._shown = 0


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _clean(args: argparse.Namespace) -> int:
    removed: list[Path] | list[str]
    if _is_url(args.root):
        if args.force:
            raise _Failure("--force applies to a local root only")
        removed = _remote(args).clean(dry_run=args.dry_run, grace=args.grace)
    else:
        if args.grace is not None:
            raise _Failure("--grace applies to a URL root only")
        if args.storage_options is not None:
            raise _Failure("--storage-options applies to a URL root only")
        ckpts = CheckpointDir(args.root, prefix=args.prefix)
        removed = ckpts.clean(dry_run=args.dry_run, force=args.force)
    verb = "would remove" if args.dry_run else "removed"
    for path in removed:
        print(f"{verb} {path}")
    if not removed:
        print("nothing to clean")
    return EXIT_OK


def _prune(args: argparse.Namespace) -> int:
    deleted: list[Path] | list[str]
    if _is_url(args.root):
        deleted = _remote(args).prune(keep_last=args.keep_last)
    else:
        deleted = _open(args).prune(keep_last=args.keep_last)
    for path in deleted:
        print(f"deleted {path}")
    if not deleted:
        print("nothing to delete")
    return EXIT_OK


def _fetch(args: argparse.Namespace) -> int:
    if not _is_url(args.root):
        raise _Failure("fetch downloads from a URL root (s3://bucket/prefix); copy local ones")
    ckpt = _remote(args).fetch(args.step, args.dest)
    print(ckpt.path)
    return EXIT_OK


def _mark_complete(args: argparse.Namespace) -> int:
    path = Path(os.path.abspath(args.path))
    step = parse_step(path.name, args.prefix)
    if step is None:
        raise _Failure(
            f"error: {path.name!r} is not a step directory name"
            + (f" with prefix {args.prefix!r}" if args.prefix else " (use --prefix if it has one)")
        )
    ckpt = CheckpointDir(path.parent, prefix=args.prefix).mark_complete(step)
    print(f"marked {ckpt.path} complete ({len(ckpt.manifest.files)} entries)")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    if args.trainer:
        from ._demo_trainer import run_trainer_demo

        return run_trainer_demo(args.dir, steps=args.steps)
    from ._demo import run_demo

    return run_demo(args.dir, steps=args.steps)


_COMMANDS = {
    "ls": _ls,
    "latest": _latest,
    "verify": _verify,
    "clean": _clean,
    "prune": _prune,
    "fetch": _fetch,
    "mark-complete": _mark_complete,
    "demo": _demo,
}


if __name__ == "__main__":
    sys.exit(main())
