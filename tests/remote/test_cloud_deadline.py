"""A gs:// or az:// store that stops answering fails within ``retry_deadline`` (issue 33,
fourth attack): through a real TCP proxy between the client and the emulator, requests
that get no answer (a blackhole), a 503 to every request, or connections refused once
the endpoint has answered were retried by the clients' own policies for ~120 s (GCS) or
~130 s (Azure); a training step blocked that long with no word. Now each fails within
the deadline with a TimeoutError naming the root, the endpoint and the option, the old
checkpoint stays visible, and a restart of a few seconds is still ridden out."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from _emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator
from _remote_support import read_tree, write_tree

from atomic_ckpt.remote import RemoteCheckpointDir

_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class StoppingProxy:
    """Forwards every connection to ``upstream`` while ``mode`` is "forward"; otherwise
    what a store that stopped answering does: "blackhole" (requests read, never
    forwarded nor answered), "503" (each answered 503 Service Unavailable), "refuse"
    (no connection accepted: the listening socket closed). ``fired`` counts the requests
    (or, for "refuse", the changes of mode) it failed."""

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.mode = "forward"
        self.fired = 0
        self.lock = threading.Lock()
        self.clients: list[socket.socket] = []
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _listen(self, port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        return s

    def set(self, mode: str, *, for_seconds: float = 0.0) -> None:
        """Behave as ``mode`` from now on (every open connection closed), and back to
        "forward" after ``for_seconds`` if given."""
        with self.lock:
            self.mode = mode
            for client in self.clients:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
            self.clients.clear()
        if mode == "refuse":
            self.fired += 1
            self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
        elif mode == "forward" and self.listener.fileno() == -1:
            self.listener = self._listen(self.port)
        if for_seconds:
            threading.Timer(for_seconds, self.set, args=("forward",)).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                time.sleep(0.01)  # refusing, or the listener is being replaced
                continue
            with self.lock:
                self.clients.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server: socket.socket | None = None
        try:
            while data := client.recv(1 << 16):
                if self.mode == "blackhole":
                    self.fired += 1
                    continue  # read, never answered
                if self.mode == "503":
                    self.fired += 1
                    client.sendall(_503)
                    return
                if server is None:
                    server = socket.create_connection(self.upstream)
                    threading.Thread(target=self._down, args=(server, client), daemon=True).start()
                server.sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            if server is not None:
                server.close()

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
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.set("blackhole")


@pytest.fixture
def proxy(emulator: Emulator) -> Any:
    p = StoppingProxy(emulator.endpoint)
    yield p
    p.stop()


def _root(emulator: Emulator, url: str, tmp: Path, proxy: Any, **extra: Any) -> Any:
    """A root through ``proxy`` with the clients' retry policies as a user gets them."""
    if emulator.scheme == "gs":
        options = {"endpoint_url": proxy.endpoint, **extra}
    else:
        options = {
            "connection_string": (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={proxy.endpoint}/{AZURITE_ACCOUNT};"
            ),
            **extra,
        }
    return RemoteCheckpointDir(url, storage_options=options, staging_dir=tmp / "staging")


@pytest.mark.parametrize("mode", ["blackhole", "503", "refuse"])
def test_a_store_that_stops_answering_fails_within_retry_deadline(
    emulator: Emulator, cloud_url: str, tmp_path: Path, proxy: StoppingProxy, mode: str
) -> None:
    """retry_deadline=2: a commit against a store that stopped answering (no answer, 503
    forever, connections refused once it had answered) is a TimeoutError within the
    deadline (and the last try's wait and connection retries), naming the root, the
    endpoint and retry_deadline; once the store answers again the old step is whole."""
    rdir = _root(emulator, cloud_url, tmp_path, proxy, retry_deadline=2)
    with rdir.commit(1) as path:
        expected = write_tree(path, 1)
    rdir.check_conditional_writes()
    proxy.set(mode)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as caught, rdir.commit(2) as path:
        write_tree(path, 2)
    took = time.monotonic() - start
    assert proxy.fired, f"the proxy never failed a request ({mode})"
    assert took < 2 + 4.5, f"{took:.1f} s"  # 3.5 s: refused connections' connect_retries
    message = str(caught.value)
    assert cloud_url in message
    assert proxy.endpoint in message
    assert "retry_deadline" in message
    proxy.set("forward")
    assert rdir.steps() == [1]
    assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected


@pytest.mark.parametrize("mode", ["refuse", "503"])
def test_a_restart_of_a_few_seconds_is_ridden_out(
    emulator: Emulator, cloud_url: str, tmp_path: Path, proxy: StoppingProxy, mode: str
) -> None:
    """With the default retry_deadline, a store that refuses connections (or answers 503)
    for 2 s once it has answered, as a server restarting does, delays the commit: it
    returns whole."""
    rdir = _root(emulator, cloud_url, tmp_path, proxy)
    rdir.check_conditional_writes()
    proxy.set(mode, for_seconds=2.0)
    start = time.monotonic()
    with rdir.commit(1) as path:
        expected = write_tree(path, 3)
    assert proxy.fired, "the proxy never failed a request"
    assert time.monotonic() - start < 20
    assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected


def test_retry_deadline_is_a_checked_storage_option(emulator: Emulator, cloud_url: str) -> None:
    """retry_deadline is taken by gs:// and az:// alike, and refused (ValueError naming it)
    when it is no positive, finite number of seconds."""
    for bad in (0, -1, "30", float("inf"), True):
        with pytest.raises(ValueError, match="retry_deadline"):
            RemoteCheckpointDir(cloud_url, storage_options=emulator.options(retry_deadline=bad))
    rdir = RemoteCheckpointDir(cloud_url, storage_options=emulator.options(retry_deadline=7.5))
    assert rdir.steps() == []


def test_a_manifest_write_applied_then_a_dead_store_is_never_committed_twice(
    emulator: Emulator, cloud_url: str, tmp_path: Path
) -> None:
    """The manifest write is applied and its answer lost, then no connection can be made
    for 6 s (retry_deadline=2): the client's retry ends at the deadline, the look at
    whether the manifest landed ends at its own, and the commit is a TimeoutError saying
    that is unknown (within both deadlines). Once the store answers, the step is that
    commit's, whole, written once."""
    from test_cloud_lost_answers import CuttingProxy

    proxy = CuttingProxy(emulator.endpoint, cut=0, refuse_for=6.0)
    try:
        rdir = _root(emulator, cloud_url, tmp_path, proxy, retry_deadline=2, connect_retries=0)
        rdir.check_conditional_writes()
        before = proxy.writes
        proxy.cut = proxy.cuts + 1
        start = time.monotonic()
        with (
            pytest.raises(TimeoutError, match="retry_deadline") as caught,
            rdir.commit(1) as path,
        ):
            expected = write_tree(path, 5)
        took = time.monotonic() - start
        assert proxy.cuts == proxy.cut, "the manifest write's answer was not cut"
        assert b" 20" in proxy.answers[-1], proxy.answers  # the write was applied
        assert took < 2 * 2 + 3, f"{took:.1f} s"
        assert "was written is unknown" in "\n".join(getattr(caught.value, "__notes__", []))
        assert proxy.listening.wait(60), "the proxy never took connections again"
        assert rdir.steps() == [1]
        assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected
        assert proxy.writes - before == 1, proxy.writes - before  # applied once
    finally:
        proxy.stop()


@pytest.mark.parametrize("operation", ["clean", "probe", "fetch"])
def test_every_request_path_ends_at_the_deadline(
    emulator: Emulator,
    cloud_url: str,
    tmp_path: Path,
    proxy: StoppingProxy,
    operation: str,
) -> None:
    """clean (listing, reads, deletes), the conditional-write probe and a fetch (a
    commit's reads and listings: the test above) against a store that stopped answering:
    each a TimeoutError within retry_deadline=2 (the probe does not wait out another
    deleting its object)."""
    rdir = _root(emulator, cloud_url, tmp_path, proxy, retry_deadline=2)
    with rdir.commit(1) as path:
        write_tree(path, 6)
    fresh = _root(emulator, cloud_url, tmp_path, proxy, retry_deadline=2)  # not yet probed
    proxy.set("blackhole")
    calls = {
        "clean": lambda: rdir.clean(grace=0),
        "probe": fresh.check_conditional_writes,
        "fetch": lambda: rdir.fetch(1, tmp_path / "got"),
    }
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="retry_deadline"):
        calls[operation]()
    took = time.monotonic() - start
    assert proxy.fired, "the proxy never failed a request"
    assert took < 2 + 2, f"{took:.1f} s"


def test_a_mirror_upload_to_a_store_that_stopped_answering_fails_within_the_deadline(
    emulator: Emulator, cloud_url: str, tmp_path: Path, proxy: StoppingProxy
) -> None:
    """A Mirror's background upload to a blackholed store: the local commit returns at
    once, ``wait`` raises the upload's TimeoutError within retry_deadline=2 (it blocked
    for the clients' minutes before), and the remote keeps the step it had."""
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.remote import Mirror

    remote = _root(emulator, cloud_url, tmp_path, proxy, retry_deadline=2)
    with remote.commit(1) as path:
        expected = write_tree(path, 7)
    mirror = Mirror(CheckpointDir(tmp_path / "local"), remote, snapshot_dir=tmp_path / "snap")
    proxy.set("blackhole")
    start = time.monotonic()
    with mirror.commit(2) as path:
        write_tree(path, 8)
    with pytest.raises(TimeoutError, match="retry_deadline"):
        mirror.wait()
    took = time.monotonic() - start
    assert proxy.fired, "the proxy never failed a request"
    assert took < 2 + 3, f"{took:.1f} s"
    proxy.set("forward")
    with contextlib.suppress(Exception):
        mirror.close()
    assert remote.steps() == [1]
    assert read_tree(remote.fetch(1, tmp_path / "got").path) == expected
