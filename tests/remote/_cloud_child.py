"""A child process that commits one step to a gs:// or az:// root (an emulator) and can
SIGKILL itself before its Nth request (or right after the manifest write), pause before its
Nth request until told to go on, or wait at the commit point for racing siblings: the
GCS/Azure counterpart of ``_remote_child.py``.

Usage: python _cloud_child.py URL OPTIONS_JSON STEP SEED [options]. Prints one JSON line:
{"outcome": "committed"|"conflict", "requests": N}; writes each request to ``--log``
and the kill before it happens (so the parent can assert it fired).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _emulators import Hook, names_manifest
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
    p.add_argument("url")
    p.add_argument("options")
    p.add_argument("step", type=int)
    p.add_argument("seed", type=int)
    p.add_argument("--big", type=int, default=0, help="size of one multipart file")
    p.add_argument("--kill-before", type=int, default=0, help="SIGKILL before request N")
    p.add_argument("--kill-after-manifest", action="store_true")
    p.add_argument("--log", type=Path)
    p.add_argument("--ready", type=Path, help="touch this once staged")
    p.add_argument("--go", type=Path, help="then wait for this file before publishing")
    p.add_argument("--staging", type=Path, required=True)
    p.add_argument("--linear-retry", action="store_true", help="az: retry 50 ms apart")
    p.add_argument("--pause-before", type=int, default=0, help="before request N: touch")
    p.add_argument("--paused", type=Path, help="this file, then wait for --resume")
    p.add_argument("--resume", type=Path)
    args = p.parse_args()

    options = json.loads(args.options)
    if args.linear_retry and args.url.startswith("az://"):
        from azure.storage.blob import LinearRetry

        options["client_kwargs"] = {
            "retry_policy": LinearRetry(backoff=0.05, random_jitter_range=0, retry_total=3)
        }
    rdir = RemoteCheckpointDir(
        args.url,
        storage_options=options,
        staging_dir=args.staging,
        part_size=SMALL_PART,
        multipart_threshold=SMALL_PART,
        workers=1,  # one request at a time: the Nth request is the same in every run
    )
    count = 0
    lock = threading.Lock()  # the client makes some requests of its own from other threads

    def around(send: Any, request: Any, *a: Any, **kw: Any) -> Any:
        nonlocal count
        with lock:
            count += 1
            _say(args.log, f"request {count} {request.method} {request.url}")
            if count == args.kill_before:
                _say(args.log, f"KILL before request {count}")
                os.kill(os.getpid(), signal.SIGKILL)
            if count == args.pause_before:
                _say(args.log, f"PAUSE before request {count}")
                args.paused.touch()
                while not args.resume.exists():
                    time.sleep(0.01)
        response = send(request, *a, **kw)
        if (
            args.kill_after_manifest
            and request.method in ("PUT", "POST")
            and names_manifest(request)
        ):
            _say(args.log, f"KILL after the manifest write, status {response.status_code}")
            os.kill(os.getpid(), signal.SIGKILL)
        return response

    Hook(around).install(rdir._store)
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
