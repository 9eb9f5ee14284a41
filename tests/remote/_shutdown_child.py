"""A training script that ends while its Mirror (or AsyncRemoteCommitter) upload of step 1
to a gs:// or az:// root is in flight, held at the manifest write until the parent says
go: the main thread raises (a crash in the training loop), raises inside the worker's
``with`` block, or is interrupted (SIGINT) in ``close()``. With ``--fail`` the manifest
write is answered 503 until the retry deadline (the upload fails).

Usage: python _shutdown_child.py URL OPTIONS_JSON LOCAL_DIR {mirror,async}
{crash,with-block,interrupt-close} HOLDING GO [--fail]. Touches HOLDING when the
manifest write is held; prints "fault fired N" to stderr at exit with --fail."""

from __future__ import annotations

import argparse
import atexit
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _emulators import Hook, names_manifest
from _remote_support import write_tree

from atomic_ckpt import CheckpointDir
from atomic_ckpt.remote import AsyncRemoteCommitter, Mirror, RemoteCheckpointDir


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("options")
    p.add_argument("local", type=Path)
    p.add_argument("kind", choices=["mirror", "async"])
    p.add_argument("how", choices=["crash", "with-block", "interrupt-close"])
    p.add_argument("holding", type=Path)
    p.add_argument("go", type=Path)
    p.add_argument("--fail", action="store_true")
    args = p.parse_args()
    options = json.loads(args.options)
    if args.fail:
        options["retry_deadline"] = 2.0
    if args.url.startswith("az://"):
        from azure.storage.blob import LinearRetry

        options["client_kwargs"] = {
            "retry_policy": LinearRetry(backoff=0.2, random_jitter_range=0, retry_total=30)
        }
    remote = RemoteCheckpointDir(
        args.url, storage_options=options, staging_dir=args.local.parent / "staging"
    )
    remote.check_conditional_writes()  # the probe's writes are not held
    fired = [0]
    lock = threading.Lock()

    def around(send: Any, request: Any, *a: Any, **kw: Any) -> Any:
        if request.method in ("PUT", "POST") and names_manifest(request):
            with lock:
                if not args.holding.exists():
                    args.holding.touch()
                    while not args.go.exists():
                        time.sleep(0.01)
            if args.fail:
                fired[0] += 1
                import requests

                out = requests.Response()
                out.status_code = 503
                out.reason = "Service Unavailable"
                out.url = str(request.url)
                out.request = request
                import io

                import urllib3

                out.raw = urllib3.response.HTTPResponse(
                    body=io.BytesIO(b"{}"), status=503, preload_content=False
                )
                return out
        return send(request, *a, **kw)

    Hook(around).install(remote._store)
    atexit.register(lambda: print("fault fired", fired[0], file=sys.stderr, flush=True))

    def writer(state: Any, directory: Path) -> None:
        write_tree(directory, state)

    worker: Any
    if args.kind == "mirror":
        worker = Mirror(CheckpointDir(args.local), remote)
    else:
        worker = AsyncRemoteCommitter(remote, writer=writer)

    def start(w: Any) -> None:
        if args.kind == "mirror":
            with w.commit(1) as path:
                write_tree(path, 1)
        else:
            w.save(1, 1)

    if args.how == "with-block":
        with worker:
            start(worker)
            while not args.holding.exists():
                time.sleep(0.01)
            raise RuntimeError("the training loop crashed")
    start(worker)
    while not args.holding.exists():
        time.sleep(0.01)
    if args.how == "crash":
        raise RuntimeError("the training loop crashed")
    worker.close()  # the parent interrupts this (SIGINT)


if __name__ == "__main__":
    main()
