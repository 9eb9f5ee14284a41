"""gs:// and az:// with the network lost at each request of a replace in turn, and with a
part's bytes changed on the way: the old checkpoint stays visible and whole, nothing
half-uploaded is committed, and ``clean`` collects what the failed attempts left. The
GCS/Azure counterpart of test_faults.py; every injected fault is asserted to have fired."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from _emulators import Emulator, Hook, Send, fast_root
from _remote_support import SMALL_PART, read_tree, write_tree

from atomic_ckpt.remote import RemoteCheckpointDir

BIG = SMALL_PART + 4321
"""One file of two parts (chunks, blocks)."""
LARGE = 2 * SMALL_PART + 7
"""A file of three parts, over 8 MiB: google-cloud-storage 2.x uploads anything smaller in
one multipart request whatever the chunk size, 3.x in chunks."""


class Partition:
    """Count the requests; from the ``start``-th on (0: never), every one fails as a lost
    connection before it is sent, retries included."""

    def __init__(self) -> None:
        self.count = 0
        self.start = 0
        self.failed = 0
        self.lock = threading.Lock()

    def around(self, send: Send, request: Any, *a: Any, **kw: Any) -> Any:
        with self.lock:
            self.count += 1
            cut = self.start and self.count >= self.start
            if cut:
                self.failed += 1
        if cut:
            raise requests.ConnectionError(f"injected: network lost: {request.url}")
        return send(request, *a, **kw)

    def reset(self, start: int = 0) -> None:
        with self.lock:
            self.count, self.start, self.failed = 0, start, 0


def _replace(rdir: RemoteCheckpointDir, seed: int, big: int = BIG) -> dict[str, bytes]:
    with rdir.commit(1) as path:
        return write_tree(path, seed, big=big)


def test_a_network_lost_at_each_request_leaves_the_old_checkpoint(
    emulator: Emulator, cloud_url: str, tmp_path: Path
) -> None:
    """Replacing step 1 (small files, a large one in two parts) with the network lost from
    its Nth request on, for every N: up to the manifest write the commit raises an
    OSError and step 1 is still the previous commit's, bit-exact; after it, the commit
    returns (the old attempt's deletion is best effort) and step 1 is the new one.
    Then clean(grace=0) leaves only the referenced attempt and no staged blocks."""
    rdir = fast_root(emulator, cloud_url, tmp_path, workers=1, retry_deadline=0.5)
    net = Partition()
    Hook(net.around).install(rdir._store)
    current = _replace(rdir, 1)  # the probe runs here, not in the counted replaces
    net.reset()
    current = _replace(rdir, 2)
    total = net.count
    assert total >= 12, total
    raised = []
    for start in range(1, total + 1):
        before = rdir.get(1).attempt
        net.reset(start)
        try:
            new = _replace(rdir, 100 + start)
        except OSError:
            raised.append(start)
            assert net.failed >= 1, start
            net.reset()
            assert rdir.steps() == [1], start
            assert rdir.get(1).attempt == before, f"request {start}: the step changed"
        else:
            net.reset()
            assert rdir.get(1).attempt != before, start
            current = new
    # Every request up to and including the manifest write is a failed commit; the ones
    # after it (deleting the replaced attempt) are not.
    assert raised == list(range(1, raised[-1] + 1)), raised
    assert 5 < raised[-1] < total, (raised, total)
    assert read_tree(rdir.fetch(1, tmp_path / "got").path) == current
    rdir.clean(grace=0)
    attempt = rdir.get(1).attempt
    for key in rdir._store.find(""):
        assert key == "1/checkpoint_complete" or key.startswith(f"1/{attempt}/"), key
    assert rdir._store.live_uploads("") == {}


def _corrupt(what: str, seen: list[str]) -> Any:
    """A hook changing one byte in the body of the first request whose URL has ``what``:
    a large file's first chunk (GCS) or block (Azure)."""

    def around(send: Send, request: Any, *a: Any, **kw: Any) -> Any:
        body = request.body
        if not seen and isinstance(body, bytes) and len(body) > 1000 and what in request.url:
            i = len(body) // 2
            request.body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :]
            seen.append(str(request.url))
        return send(request, *a, **kw)

    return around


def test_a_part_changed_on_the_way_is_refused(
    emulator: Emulator, cloud_url: str, tmp_path: Path
) -> None:
    """One byte of a large file's first part flipped in flight: on GCS the stored object's
    CRC32C (sent with the last chunk, reported back by the server) differs from the bytes
    sent, on Azure the block's Content-MD5 does; the commit fails with an OSError, step 1
    is the old one, bit-exact, and the attempt is gone."""
    rdir = fast_root(emulator, cloud_url, tmp_path, workers=1)
    old = _replace(rdir, 1, LARGE)
    before = rdir.get(1).attempt
    seen: list[str] = []
    match = "upload_id=" if emulator.scheme == "gs" else "blockid="
    Hook(_corrupt(match, seen)).install(rdir._store)
    with pytest.raises(OSError, match=r"(?i)crc32c|md5|checksum|corrupt|400"):
        _replace(rdir, 2, LARGE)
    assert len(seen) == 1, "one part was changed"
    assert rdir.get(1).attempt == before
    assert read_tree(rdir.fetch(1, tmp_path / "got").path) == old
    leftover = [k for k in rdir._store.find("") if not k.startswith(f"1/{before}/")]
    assert leftover == ["1/checkpoint_complete"], leftover


def test_every_upload_says_its_checksum(emulator: Emulator, cloud_url: str, tmp_path: Path) -> None:
    """What each upload request carries for the store to check: on GCS each multipart
    upload its object's CRC32C in the metadata (and the commit point too); on Azure each
    Put Blob and each Put Block its Content-MD5."""
    rdir = fast_root(emulator, cloud_url, tmp_path, workers=1)
    rdir.check_conditional_writes()
    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def record(send: Send, request: Any, *a: Any, **kw: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else b""
        seen.append((request.method, str(request.url), dict(request.headers), body))
        return send(request, *a, **kw)

    Hook(record).install(rdir._store)
    _replace(rdir, 1, LARGE)
    if emulator.scheme == "gs":
        multipart = [b for m, u, _, b in seen if m == "POST" and "uploadType=multipart" in u]
        assert len(multipart) == 5, "four small files and the manifest"
        assert all(b'"crc32c"' in b[:4096] for b in multipart)
    else:
        puts = [h for m, u, h, _ in seen if m == "PUT" and "comp=" not in u]
        blocks = [h for m, u, h, _ in seen if m == "PUT" and "comp=block&" in u + "&"]
        assert len(puts) == 5, "four small files and the manifest"
        assert len(blocks) == 3
        assert all("Content-MD5" in h for h in puts + blocks)
