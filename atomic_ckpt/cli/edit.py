"""The ``promote`` and ``rm`` commands: a named checkpoint made a step, and a step or a
named checkpoint deleted, each atomically and durably (built on the public API alone)."""

from __future__ import annotations

import argparse

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError, StepConflictError, parse_step
from atomic_ckpt.cli.common import EXIT_NONE, EXIT_OK, Failure, is_url, open_remote


def _local(args: argparse.Namespace, command: str) -> CheckpointDir:
    if is_url(args.root):
        raise Failure(f"{command} works on a local root only")
    if args.storage_options is not None:
        raise Failure("--storage-options applies to a URL root only")
    return CheckpointDir(args.root, prefix=args.prefix)


def promote(args: argparse.Namespace) -> int:
    """``atomic-ckpt promote ROOT NAME STEP``: exit 1 if there is no complete NAME."""
    ckpts = _local(args, "promote")
    try:
        ckpt = ckpts.promote_named(args.name, args.step, replace_unusable=args.replace_unusable)
    except CheckpointNotFoundError as exc:
        raise Failure(str(exc), EXIT_NONE) from None
    print(f"promoted {args.name} to step {ckpt.step}: {ckpt.path}")
    return EXIT_OK


def rm(args: argparse.Namespace) -> int:
    """``atomic-ckpt rm ROOT STEP|NAME [--force]``: exit 1 if there is no such checkpoint.
    On a URL root, STEP only: the manifest goes first (the step disappears at once)."""
    what = args.target
    if is_url(args.root):
        step = parse_step(what, args.prefix)
        if step is None:
            raise Failure(f"rm on a URL root takes a step, not {what!r}")
        try:
            url = open_remote(args).delete(step)
        except CheckpointNotFoundError as exc:
            raise Failure(str(exc), EXIT_NONE) from None
        print(f"removed step {step}: {url}")
        return EXIT_OK
    ckpts = _local(args, "rm")
    try:
        removed = ckpts.delete(what, force=args.force)
    except CheckpointNotFoundError as exc:
        raise Failure(str(exc), EXIT_NONE) from None
    except StepConflictError as exc:
        raise Failure(f"{exc} (--force)") from None
    step = parse_step(removed.name, args.prefix)  # as ls names it, however it was given
    print(f"removed {'named checkpoint ' + what if step is None else f'step {step}'}: {removed}")
    return EXIT_OK
