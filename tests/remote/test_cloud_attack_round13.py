"""Issue 33, attack round 13: gs:// and az:// against their emulators, from outside, as a
user training on GCS or Azure would. Each defect found is a test here (see the report of
branch atk33)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from _emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator, fast_root
from _remote_support import read_tree

from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir


class SlowLink:
    """A TCP proxy to ``upstream`` whose client-to-server direction carries ``rate``
    bytes a second (a slow uplink: every byte arrives, slowly); answers come back at
    once. ``peak`` is the most bytes it has forwarded over one connection."""

    def __init__(self, upstream: str, rate: int) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rate = rate
        self.peak = 0
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._up, args=(client,), daemon=True).start()

    def _up(self, client: socket.socket) -> None:
        server = socket.create_connection(self.upstream)
        threading.Thread(target=self._down, args=(server, client), daemon=True).start()
        sent = 0
        with contextlib.suppress(OSError):
            while data := client.recv(16384):
                time.sleep(len(data) / self.rate)
                server.sendall(data)
                sent += len(data)
                self.peak = max(self.peak, sent)
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.close()

    @staticmethod
    def _down(server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(1 << 16):
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(OSError):
            self.listener.close()


def _through(
    emulator: Emulator, url: str, tmp: Path, endpoint: str, part: int = 5 << 20, **extra: Any
) -> Any:
    if emulator.scheme == "gs":
        options = {"endpoint_url": endpoint, **extra}
    else:
        options = {
            "connection_string": (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
            ),
            **extra,
        }
    return RemoteCheckpointDir(
        url,
        storage_options=options,
        staging_dir=tmp / "staging",
        part_size=part,
        multipart_threshold=part,
    )


def test_a_slow_but_alive_large_upload_is_not_cut_off(
    emulator: Emulator, cloud_url: str, tmp_path: Path
) -> None:
    """A 12 MiB part over a link of 2 MiB/s takes ~6 s to send, every byte moving: with
    retry_deadline=3 nothing has failed, so nothing may be cut off (the docs: "Any
    answer below 500 stops the clock, so a large upload that keeps answering is never
    cut off"). It was: urllib3 sends a bytes body with one sendall() under the request's
    timeout, which bounds the whole sendall (Python >= 3.5), and that timeout is cut to
    retry_deadline; every try of the part timed out, then a TimeoutError. (The deadline
    stays above the ~1.5 s the kernel's buffers take to drain after the last send: the
    answer's wait, which the deadline does bound.)"""
    link = SlowLink(emulator.endpoint, 2 << 20)
    try:
        rdir = _through(
            emulator, cloud_url, tmp_path, link.endpoint, part=12 << 20, retry_deadline=3
        )
        assert rdir.steps() == []
        data = bytes(range(256)) * ((12 << 20) // 256)
        with rdir.commit(1) as path:
            (path / "model.bin").write_bytes(data)
        assert link.peak >= 12 << 20
        assert read_tree(rdir.fetch(1, tmp_path / "got").path) == {"model.bin": data}
    finally:
        link.stop()


@pytest.mark.parametrize("prefix", ["a/../run", "./run", "run/./x", "run/.."])
def test_a_dot_segment_in_the_prefix_is_a_clear_error(
    emulator: Emulator, tmp_path: Path, prefix: str, capsys: Any
) -> None:
    """``az://container/a/../run``: the request URL's path is normalized on its way
    (Azurite, like Azure, resolves dot segments) while the request was signed for the
    name as given, so every request was refused 403 and reported as "access denied:
    check the credentials" (GCS stored the name literally, another root than a user of
    a path expects). A '.' or '..' segment is now refused up front on every store, as
    an empty one is: a ValueError naming the prefix, exit 2 from the CLI."""
    url = f"{emulator.scheme}://{emulator.new_bucket()}/{prefix}"
    with pytest.raises(ValueError, match=r"'\.' or '\.\.'"):
        fast_root(emulator, url, tmp_path)
    assert main(["ls", url]) == 2
    assert "'.' or '..'" in capsys.readouterr().err
