"""Helpers shared by the remote tests and their child processes (no pytest here). botocore
is imported only by the S3 hooks that use it, so the gs:// and az:// tests run where only
the [gcs] and [azure] extras are installed (.ci/oldest_cloud.sh)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SMALL_PART = 5 << 20
"""The smallest part S3 (and moto) accept: the tests' multipart uploads use it."""

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # No reading of a developer's ~/.aws, no instance metadata lookups.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass(frozen=True)
class S3:
    """The running server: its endpoint and the environment a child process needs."""

    endpoint: str
    env: dict[str, str]

    def options(self, **extra: Any) -> dict[str, Any]:
        """storage_options for s3fs: this endpoint, a fresh client (no instance cache)."""
        return {"endpoint_url": self.endpoint, "skip_instance_cache": True, **extra}


def write_tree(path: Path, seed: int, *, big: int = 0) -> dict[str, bytes]:
    """Write a small checkpoint (a few files, a subdirectory, optionally one ``big`` file of
    that many bytes) whose bytes depend on ``seed``; return {relative path: bytes}."""
    rng = random.Random(seed)
    files = {
        "model.bin": rng.randbytes(3000 + seed),
        "optim/state.bin": rng.randbytes(1000),
        "meta.json": f'{{"seed": {seed}}}'.encode(),
        "empty": b"",
    }
    if big:
        files["big.bin"] = rng.randbytes(big)
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    return files


def read_tree(path: Path) -> dict[str, bytes]:
    """{relative path: bytes} of every regular file under ``path`` but the marker."""
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "checkpoint_complete"
    }


# ---------------------------------------------------------------- request hooks

_ERROR_500 = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
    b"<Message>injected</Message></Error>"
)


class _Raw:
    """The body of an injected response, read the way aiobotocore reads one."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self, n: int = -1) -> bytes:
        data, self._data = self._data, b""
        return data


@dataclass
class Fault:
    """Fail the requests of ``operation`` whose URL contains ``match``: the first
    ``times`` of them (or all, ``times=None``), doing ``what``. Counts what it did."""

    operation: str
    what: str  # "500", "drop", "timeout", "timeout-after-send"
    match: str = ""
    times: int | None = 1
    fired: int = 0
    seen: list[int] = field(default_factory=list)
    """HTTP status of every response to a matching request (what the retries met)."""

    def install(self, rdir: Any) -> None:
        events = rdir.fs.s3.meta.events
        events.register(f"before-send.s3.{self.operation}", self._before_send)
        events.register(f"after-call.s3.{self.operation}", self._after_call)

    def _before_send(self, request: Any, **_: Any) -> Any:
        from aiobotocore.awsrequest import AioAWSResponse
        from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

        if self.match not in request.url or (self.times is not None and self.fired >= self.times):
            return None
        self.fired += 1
        if self.what == "500":
            headers = {"Content-Type": "application/xml"}
            return AioAWSResponse(request.url, 500, headers, _Raw(_ERROR_500))
        if self.what == "drop":
            raise ConnectionClosedError(endpoint_url=request.url)
        if self.what == "timeout-after-send":
            # The request reaches the server and is applied; its response is lost.
            body = request.body
            if not isinstance(body, bytes):  # a stream: read it whole, then rewind it
                body.seek(0)
                body, _ = body.read(), body.seek(0)
            headers = {k: v for k, v in request.headers.items() if k.lower() != "expect"}
            # Without a type urllib sends a form, which the server's framework consumes.
            headers.setdefault("Content-Type", "application/octet-stream")
            sent = urllib.request.Request(
                request.url, data=body, method=request.method, headers=headers
            )
            with urllib.request.urlopen(sent, timeout=30) as response:
                self.seen.append(response.status)
        raise ReadTimeoutError(endpoint_url=request.url)

    def _after_call(self, http_response: Any, **_: Any) -> None:
        if self.match in str(getattr(http_response, "url", "")):
            self.seen.append(http_response.status_code)


@dataclass
class Gate:
    """Hold the requests of ``operation`` whose URL contains ``match`` until ``release()``
    (an async hook: s3fs's event loop, shared by every client, keeps running)."""

    operation: str
    match: str = ""
    held: threading.Event = field(default_factory=threading.Event)
    _open: threading.Event = field(default_factory=threading.Event)

    def install(self, rdir: Any) -> None:
        rdir.fs.s3.meta.events.register(f"before-send.s3.{self.operation}", self._before_send)

    async def _before_send(self, request: Any, **_: Any) -> None:
        if self.match not in request.url:
            return
        self.held.set()
        while not self._open.is_set():
            await asyncio.sleep(0.01)

    def release(self) -> None:
        self._open.set()


# ---------------------------------------------------------------- a proxy that loses answers

_WRITES = (b"POST ", b"PUT ")


class CuttingProxy:
    """Forwards every connection to ``upstream``; the answer to the first ``cut`` manifest
    writes (a POST or PUT whose bytes name ``checkpoint_complete``) is never forwarded:
    the client's connection is reset once the server has answered. After a cut, new
    connections are refused for ``refuse_for`` seconds (the listening socket closed)."""

    def __init__(
        self,
        upstream: str,
        cut: int = 1,
        refuse_for: float = 0.0,
        on_cut: Callable[[], None] | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.cut, self.refuse_for = cut, refuse_for
        self.on_cut = on_cut
        """Called when a cut answer has arrived, before the client's connection is reset
        (e.g. to SIGKILL the client: it dies between its write and the answer)."""
        self.cuts = 0
        self.writes = 0  # manifest writes that reached the server
        self.answers: list[bytes] = []  # the status lines of the answers cut off
        self.clients: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]
        self.stopped = False
        self.listening = threading.Event()
        """Set while connections are taken: cleared at a cut or an outage that refuses them,
        set again once ``refuse_for`` has passed (a test waits on it, not on a guessed
        sleep: under load the relisten thread can wake late)."""
        self.listening.set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        return s

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                time.sleep(0.01)  # the listener is being replaced
                continue
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.clients.append(client)
            state: dict[str, Any] = {
                "sent": b"",
                "armed": False,
                "answered": False,
                "counted": False,
            }
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, Any]) -> None:
        try:
            while data := client.recv(1 << 16):
                if state["answered"]:  # a new request on this connection
                    state.update(sent=b"", answered=False, counted=False)
                state["sent"] += data
                sent = state["sent"]
                if sent.startswith(_WRITES) and b"checkpoint_complete" in sent:
                    with self.lock:
                        if not state["counted"]:
                            state["counted"] = True
                            self.writes += 1
                            if self.cuts < self.cut:
                                self.cuts += 1
                                state["armed"] = True
                server.sendall(data)
        except OSError:
            pass
        finally:
            server.close()

    def _down(self, server: socket.socket, client: socket.socket, state: dict[str, Any]) -> None:
        try:
            while data := server.recv(1 << 16):
                state["answered"] = True
                if state["armed"]:
                    self.answers.append(data.split(b"\r\n", 1)[0])
                    if self.on_cut is not None:
                        self.on_cut()
                    if self.refuse_for:  # and every open connection is closed
                        self.listening.clear()
                        self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
                        self.listener.close()
                        threading.Thread(target=self._relisten, daemon=True).start()
                        with self.lock:
                            for other in self.clients:
                                if other is not client:
                                    with contextlib.suppress(OSError):
                                        other.shutdown(socket.SHUT_RDWR)
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.shutdown(socket.SHUT_RDWR)  # the answer is lost
                    client.close()
                    return
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()

    def outage(self) -> None:
        """Refuse connections for ``refuse_for`` seconds from now, every open one closed."""
        self.listening.clear()
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for other in self.clients:
                with contextlib.suppress(OSError):
                    other.shutdown(socket.SHUT_RDWR)
        threading.Thread(target=self._relisten, daemon=True).start()

    def _relisten(self) -> None:
        time.sleep(self.refuse_for)
        self.listener = self._listen(self.port)
        self.listening.set()

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
