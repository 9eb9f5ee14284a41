"""The ``atomic-ckpt`` command line.

Exit status: 0 success; 1 "nothing there" (no checkpoint, a failed
verification) so shell scripts can branch on it; 2 an error (bad input, I/O,
a bucket that does not exist). Errors print one line on stderr (a failed
verification: then one line per further problem), never a traceback.

ROOT is a directory or an object-store URL (``s3://bucket/prefix``,
``gs://bucket/prefix``, ``az://container/prefix``, ``memory://``): ``ls``, ``latest``,
``verify``, ``clean``, ``prune`` and ``fetch`` take either (a URL needs the ``s3``,
``gcs`` or ``azure`` extra; ``--storage-options`` passes a JSON object of the store's
options: s3fs's, gcsfs's or adlfs's names, and the usual environment variables work).

This module owns the parser, the command table and the small commands; ``ls``
and ``verify`` live in ``cli/ls.py`` and ``cli/verify.py``, what they share in
``cli/common.py`` (all built on atomic_ckpt's public API alone).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir, CheckpointError, VerificationError, __version__, parse_step
from atomic_ckpt.cli import audit as _audit_command
from atomic_ckpt.cli.common import (
    EXIT_ERROR,
    EXIT_NONE,
    EXIT_OK,
    Failure,
    error_lines,
    is_url,
    open_local,
    open_remote,
)
from atomic_ckpt.cli.edit import promote, rm
from atomic_ckpt.cli.ls import ls
from atomic_ckpt.cli.verify import verify


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
            "root",
            metavar="ROOT",
            help="the checkpoint root: a directory, s3://, gs:// or az://bucket/prefix",
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
    c = root_cmd(
        "verify",
        "check files against the manifest (every complete step and named checkpoint, or one)",
    )
    c.add_argument(
        "target", metavar="STEP|NAME", nargs="?", help="only this step or named checkpoint"
    )
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
        help="also remove NAME.tmp-<32 hex> and .tmp-NAME.<32 hex> entries that carry no "
        "evidence atomic_ckpt made them (e.g. a staging dir whose lock file a power loss "
        "dropped)",
    )
    c = root_cmd("prune", "delete all but the newest complete checkpoints")
    c.add_argument("--keep-last", type=int, required=True, metavar="N", help="keep N (>= 1)")
    c = root_cmd("fetch", "download a checkpoint from a URL into a new local directory")
    c.add_argument("step", metavar="STEP", type=int, help="the step (see `latest`)")
    c.add_argument("dest", metavar="DEST", help="the new directory (must not exist)")
    c = root_cmd("promote", "make the named checkpoint NAME step STEP, atomically and durably")
    c.add_argument("name", metavar="NAME", help="a named checkpoint, e.g. interrupted")
    c.add_argument("step", metavar="STEP", type=int, help="the step it becomes (replaced if there)")
    c.add_argument(
        "--replace-unusable",
        action="store_true",
        help="also replace a STEP a newer atomic_ckpt wrote, or one moved there by hand",
    )
    c = root_cmd("rm", "delete a complete checkpoint (a step or a named one) durably")
    c.add_argument("target", metavar="STEP|NAME", help="a step number or a checkpoint name")
    c.add_argument(
        "--force", action="store_true", help="also when checkpoint_best names it (the pointer goes)"
    )
    c = sub.add_parser(
        "mark-complete",
        help="adopt a checkpoint directory written without atomic_ckpt",
        description="fsync a checkpoint directory's files and write its manifest marker",
    )
    c.add_argument("path", metavar="PATH", help="the step directory, e.g. ckpts/1200")
    c.add_argument("--prefix", default="", help="step directory prefix, e.g. checkpoint-")
    c.add_argument(
        "--require",
        nargs="+",
        default=[],
        metavar="FILE",
        help="files (paths inside PATH) a complete save holds: refuse the directory if one "
        "is missing",
    )
    c.add_argument(
        "--no-check",
        action="store_true",
        help="adopt without checking safetensors headers, zip archives and JSON first",
    )
    c = sub.add_parser("demo", help="watch a training run survive a kill mid-save")
    c.add_argument("dir", metavar="DIR", nargs="?", help="work here instead of a temp dir")
    c.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    c.add_argument(
        "--trainer",
        action="store_true",
        help="the same with a Hugging Face Trainer (needs atomic_ckpt[transformers])",
    )
    _audit_command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``atomic-ckpt`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="atomic-ckpt: warning: %(message)s")
    try:
        status: int = _COMMANDS[args.command](args)
    except Failure as exc:
        print(f"atomic-ckpt: {exc}", file=sys.stderr)
        return exc.status
    except (CheckpointError, OSError, ValueError, ImportError) as exc:
        for line in error_lines(exc):
            print(line, file=sys.stderr)
        return EXIT_ERROR
    except TypeError as exc:
        if getattr(args, "storage_options", None) is None:
            raise  # a bug, not bad input: the traceback is what to report
        print(f"atomic-ckpt: error: --storage-options was refused: {exc}", file=sys.stderr)
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


def _latest(args: argparse.Namespace) -> int:
    found: tuple[int, str] | None
    if is_url(args.root):
        remote_ckpt = open_remote(args).latest()
        found = None if remote_ckpt is None else (remote_ckpt.step, remote_ckpt.url)
    else:
        ckpt = open_local(args).latest()
        found = None if ckpt is None else (ckpt.step, str(ckpt.path))
    if found is None:
        raise Failure(f"no complete checkpoint in {args.root}", EXIT_NONE)
    if args.json:
        print(json.dumps({"step": found[0], "path": found[1]}))
    else:
        print(found[1])
    return EXIT_OK


def _clean(args: argparse.Namespace) -> int:
    removed: list[Path] | list[str]
    if is_url(args.root):
        if args.force:
            raise Failure("--force applies to a local root only")
        removed = open_remote(args).clean(dry_run=args.dry_run, grace=args.grace)
    else:
        if args.grace is not None:
            raise Failure("--grace applies to a URL root only")
        if args.storage_options is not None:
            raise Failure("--storage-options applies to a URL root only")
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
    if args.keep_last < 1:
        raise Failure(
            f"--keep-last must be at least 1 (the newest checkpoint is never deleted), "
            f"got {args.keep_last}"
        )
    if is_url(args.root):
        deleted = open_remote(args).prune(keep_last=args.keep_last)
    else:
        deleted = open_local(args).prune(keep_last=args.keep_last)
    for path in deleted:
        print(f"deleted {path}")
    if not deleted:
        print("nothing to delete")
    return EXIT_OK


def _fetch(args: argparse.Namespace) -> int:
    if not is_url(args.root):
        raise Failure("fetch downloads from a URL root (s3://, gs://, az://); copy local ones")
    ckpt = open_remote(args).fetch(args.step, args.dest)
    print(ckpt.path)
    return EXIT_OK


def _mark_complete(args: argparse.Namespace) -> int:
    path = Path(os.path.abspath(args.path))
    step = parse_step(path.name, args.prefix)
    if step is None:
        raise Failure(
            f"error: {path.name!r} is not a step directory name"
            + (f" with prefix {args.prefix!r}" if args.prefix else " (use --prefix if it has one)")
        )
    ckpts = CheckpointDir(path.parent, prefix=args.prefix)
    checks = [] if args.no_check or not path.is_dir() else ckpts.check_contents(step)
    broken = [c for c in checks if not c.ok]
    for c in checks:
        verdict = c.format or ("not checked (format not known)" if c.ok else "unusable")
        print(f"  {c.path}: {verdict}" + ("" if c.ok else f": DAMAGED: {c.problem}"))
    if broken:
        print(
            f"refused: {len(broken)} file(s) of {path} are damaged, as a save killed "
            "mid-write leaves them. Delete the directory (the run can redo that save), or "
            "adopt it anyway with --no-check.",
            file=sys.stderr,
        )
        return EXIT_NONE  # like a failed verification: nothing complete there
    try:
        # The API checks --require (one rule: paths normalized, regular files only).
        ckpt = ckpts.mark_complete(step, check=not args.no_check, require=args.require)
    except VerificationError as exc:
        print(f"atomic-ckpt: error: {exc}", file=sys.stderr)  # it lists every file
        return EXIT_NONE  # a required file missing: nothing complete there
    unchecked = sum(1 for c in checks if c.format is None)
    how = (
        " without checks (--no-check)"
        if args.no_check
        else (f"; {unchecked} file(s) of unknown formats adopted unchecked" if unchecked else "")
    )
    count = len(ckpt.manifest.files)
    print(f"marked {ckpt.path} complete ({count} {'entry' if count == 1 else 'entries'}){how}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    if args.trainer:
        from atomic_ckpt.cli.demo.trainer import run_trainer_demo

        return run_trainer_demo(args.dir, steps=args.steps)
    from atomic_ckpt.cli.demo.basic import run_demo

    return run_demo(args.dir, steps=args.steps)


_COMMANDS = {
    "ls": ls,
    "latest": _latest,
    "verify": verify,
    "clean": _clean,
    "prune": _prune,
    "fetch": _fetch,
    "mark-complete": _mark_complete,
    "promote": promote,
    "rm": rm,
    "demo": _demo,
    "audit": _audit_command.run,
}
