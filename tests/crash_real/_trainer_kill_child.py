"""The process the trainer-API kill tests kill: one amend, promotion or alias operation.

Usage::

    python _trainer_kill_child.py ROOT --op OP [--record | --kill-at N --kill-when before|after]

The test prepares ROOT with :func:`prepare` first. The child runs ``OPS[OP]``
and writes one line per fact to stdout (one ``write`` per line, so a line is
whole or absent when the process is killed):

* ``event N NAME PATH``: (``--record``) the Nth hooked call;
* ``returned N``: (``--record``) the Nth hooked call returned (did not raise);
* ``hook N NAME WHEN``: the kill hook fired at the Nth hooked call; it dies next;
* ``ok PHASE``: phase PHASE of the operation returned;
* ``done``: every phase returned.

The hooked calls are every function of ``atomic_ckpt._core.l2_syscalls.fs``, ``os.replace`` (the
rename inside the marker's durable rewrite) and each file write of the body.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from _real_support import FsHook, kill_hook, say

from atomic_ckpt import CheckpointDir, RetentionPolicy

# What the test prepares (step -> files, metadata, aliases) and what each operation writes.
OLD = {
    "model.bin": b"old model " * 300,
    "drop.bin": b"dropped by the amend",
    "sub/a.bin": b"a file in a removed directory",
    "keep.bin": b"carried over unchanged " * 200,
}
NEW = {
    "model.bin": b"new model, after fine-tuning " * 250,
    "val.json": b'{"val_loss": 0.25}',
    "keep.bin": OLD["keep.bin"],
}
STEP2 = {"model.bin": b"step two " * 100, "optim.bin": b"step two optimizer"}
STEP3 = {"model.bin": b"step three " * 100}
NAMED = {"model.bin": b"interrupted mid-epoch " * 200, "optim.bin": b"its optimizer"}
NEXT = {"model.bin": b"the next interrupted save"}


def new_dir(root: Path) -> CheckpointDir:
    # One worker: the library's calls come in a fixed order, so a recorded call
    # number names the same call in every run (the kill lands where it was aimed).
    return CheckpointDir(root, checksum="crc32", lock_timeout=60, workers=1)


def write_files(directory: Path, files: dict[str, bytes], hook: FsHook | None) -> None:
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if hook is None:
            path.write_bytes(data)
        else:
            hook.call("save_write", Path.write_bytes, path, data)


def prepare(root: Path) -> None:
    """The state every operation starts from (made by the test, never killed)."""
    ckpts = new_dir(root)
    for step, files, meta, aliases in (
        (1, OLD, {"version": "old"}, ["e1"]),
        (2, STEP2, {"version": "two"}, ["e2", "last"]),
    ):
        with ckpts.commit(step, metadata=meta, aliases=aliases) as path:
            write_files(path, files, None)
    with ckpts.commit_named("interrupted", metadata={"version": "named"}) as path:
        write_files(path, NAMED, None)


Op = Callable[[CheckpointDir, FsHook | None, Callable[[str], None]], None]


def amend(ckpts: CheckpointDir, hook: FsHook | None, ok: Callable[[str], None]) -> None:
    """Replace model.bin, add val.json, remove drop.bin and sub/, merge the metadata."""
    with ckpts.amend(1, metadata={"version": "new"}, remove=["drop.bin", "sub"]) as path:
        write_files(path, {k: v for k, v in NEW.items() if k not in OLD or OLD[k] != v}, hook)
    ok("amend")


def amend_metadata(ckpts: CheckpointDir, hook: FsHook | None, ok: Callable[[str], None]) -> None:
    """A metadata-only amend: the marker is rewritten in place."""
    with ckpts.amend(1, metadata={"version": "new"}):
        pass
    ok("amend")


def promote_new(ckpts: CheckpointDir, hook: FsHook | None, ok: Callable[[str], None]) -> None:
    """The named checkpoint becomes a new step, 3."""
    ckpts.promote_named("interrupted", 3)
    ok("promote")


def promote_replace(ckpts: CheckpointDir, hook: FsHook | None, ok: Callable[[str], None]) -> None:
    """The named checkpoint replaces step 2 (which has aliases)."""
    ckpts.promote_named("interrupted", 2)
    ok("promote")


def aliases(ckpts: CheckpointDir, hook: FsHook | None, ok: Callable[[str], None]) -> None:
    """Aliases through a trainer's life: moved by a commit, removed by delete and retention,
    made with a named checkpoint and carried through its promotion."""
    with ckpts.commit(3, metadata={"version": "three"}, aliases=["e3", "last"]) as path:
        write_files(path, STEP3, hook)
    ok("commit")
    ckpts.delete(1)
    ok("delete")
    ckpts.retain(RetentionPolicy(keep_last=1))
    ok("retain")
    with ckpts.commit_named("next", metadata={"version": "next"}, aliases=["resume_here"]) as p:
        write_files(p, NEXT, hook)
    ok("named")
    ckpts.promote_named("next", 4)
    ok("promote")


OPS: dict[str, Op] = {
    "amend": amend,
    "amend-metadata": amend_metadata,
    "promote-new": promote_new,
    "promote-replace": promote_replace,
    "aliases": aliases,
}


@contextlib.contextmanager
def hooked_replace(hook: FsHook):  # type: ignore[no-untyped-def]
    """``os.replace`` as an event too: the marker's in-place rewrite renames through it."""
    real = os.replace
    os.replace = lambda *a, **k: hook.call("os.replace", real, *a, **k)  # type: ignore[assignment]
    try:
        yield
    finally:
        os.replace = real


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--op", choices=sorted(OPS), required=True)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--kill-when", choices=("before", "after"), default="before")
    args = parser.parse_args()

    hook = kill_hook(record=args.record, kill_at=args.kill_at, kill_when=args.kill_when)
    ckpts = new_dir(args.root)
    with hook.installed(), hooked_replace(hook):
        OPS[args.op](ckpts, hook, lambda phase: say(f"ok {phase}"))
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
