"""The process the kill tests kill: commits a seeded plan and reports each commit that returned.

Usage::

    python _crash_child.py ROOT --seed S --steps 1,2,1,3 [--single] [--fallback]
                           [--record | --kill-at N --kill-when before|after]

It writes one line per fact to stdout (a pipe; each line is one ``write``, so a
line is either there whole or not at all when the process is killed):

* ``ready``: imports done, about to commit;
* ``event N NAME PATH``: (``--record``) the Nth hooked call;
* ``returned N``: (``--record``) the Nth hooked call returned (did not raise);
* ``hook N NAME WHEN``: the kill hook fired at the Nth hooked call; it dies next;
* ``ok I``: the commit of save I returned;
* ``done``: the whole plan was committed.

``--kill-at N`` sends itself SIGKILL just before (or after) the Nth call of a
hooked atomic_ckpt._core.l2_syscalls.fs function or of one of the save's file writes.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from _real_support import commit_save, forced_fallback, kill_hook, new_dir, plan_of, say


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--single", action="store_true", help="one file per save, no threads")
    parser.add_argument("--fallback", action="store_true", help="replace without EXCHANGE")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--kill-when", choices=("before", "after"), default="before")
    args = parser.parse_args()

    hook = kill_hook(record=args.record, kill_at=args.kill_at, kill_when=args.kill_when)
    plan = plan_of([int(s) for s in args.steps.split(",")])
    # One worker: the library's calls come in a fixed order, so a recorded call
    # number names the same call in every run (the kill lands where it was aimed).
    ckpts = new_dir(args.root, single=args.single, workers=1)
    with contextlib.ExitStack() as stack:
        if args.fallback:
            stack.enter_context(forced_fallback())
        if args.record or args.kill_at:
            stack.enter_context(hook.installed())
        say("ready")
        for save in plan:
            commit_save(
                ckpts,
                args.seed,
                save,
                single=args.single,
                hook=hook if (args.record or args.kill_at) else None,
            )
            say(f"ok {save.index}")
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
