"""A child process that commits one step to S3 (moto) and can SIGKILL itself at a chosen
request, or wait at the commit point for a racing sibling.

Usage: python _remote_child.py ENDPOINT URL STEP SEED [options]; see ``main``. Prints
one JSON line on stdout: {"outcome": "committed"|"conflict", ...}; writes the request it
killed itself at to ``--log`` before the SIGKILL (so the parent can assert it fired).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _remote_support import SMALL_PART, write_tree

from atomic_ckpt import StepConflictError
from atomic_ckpt.remote import RemoteCheckpointDir


def _say(log: Path | None, line: str) -> None:
    if log is None:
        return
    with open(log, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("endpoint")
    p.add_argument("url")
    p.add_argument("step", type=int)
    p.add_argument("seed", type=int)
    p.add_argument("--big", type=int, default=0, help="size of one multipart file")
    p.add_argument("--kill-before", type=int, default=0, help="SIGKILL before request N")
    p.add_argument("--kill-after-manifest", action="store_true")
    p.add_argument("--log", type=Path)
    p.add_argument("--ready", type=Path, help="touch this once staged")
    p.add_argument("--go", type=Path, help="then wait for this file before publishing")
    p.add_argument("--staging", type=Path, required=True)
    args = p.parse_args()

    rdir = RemoteCheckpointDir(
        args.url,
        storage_options={"endpoint_url": args.endpoint, "skip_instance_cache": True},
        staging_dir=args.staging,
        part_size=SMALL_PART,
        multipart_threshold=SMALL_PART,
        workers=1,  # one request at a time: the Nth request is the same in every run
    )
    count = 0

    def before_send(request: Any, event_name: str, **_: Any) -> None:
        nonlocal count
        count += 1
        _say(args.log, f"request {count} {event_name.rsplit('.', 1)[-1]} {request.url}")
        if count == args.kill_before:
            _say(args.log, f"KILL before request {count}")
            os.kill(os.getpid(), signal.SIGKILL)

    def after_put(http_response: Any, parsed: Any, model: Any, **_: Any) -> None:
        url = getattr(http_response, "url", "")
        if args.kill_after_manifest and "checkpoint_complete" in str(url):
            _say(args.log, f"KILL after the manifest write, status {http_response.status_code}")
            os.kill(os.getpid(), signal.SIGKILL)

    events = rdir.fs.s3.meta.events
    events.register("before-send.s3", before_send)
    events.register("after-call.s3.PutObject", after_put)

    handle = rdir.begin(args.step)
    write_tree(handle.path, args.seed, big=args.big)
    if args.ready is not None:
        args.ready.touch()
    if args.go is not None:
        while not args.go.exists():
            time.sleep(0.01)
    try:
        ckpt = handle.publish()
    except StepConflictError as exc:
        print(json.dumps({"outcome": "conflict", "error": str(exc), "requests": count}))
        return 3
    print(json.dumps({"outcome": "committed", "attempt": ckpt.attempt, "requests": count}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
