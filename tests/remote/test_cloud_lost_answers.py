"""The commit point's request through a real TCP proxy between the client and the emulator
(below the whole requests/urllib3 transport, so the errors are the transport's own): the
manifest write reaches the server and is applied, and its answer is cut off (the
connection reset); then, optionally, no connection can be made for a while. The
client's retry (a sent request: never the connection adapter's) is answered "precondition
failed", the manifest there is this attempt's, and the commit succeeds: one winner, the
write applied once. Once the endpoint has answered, connections refused past
``connect_retries`` are an outage the client's retries decide (no fast
ConnectionError), and the step that landed is still whole."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3.util.connection
from _emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator
from _remote_support import CuttingProxy, read_tree, write_tree

from atomic_ckpt.remote import RemoteCheckpointDir


class Refusals:
    """Count the connections refused (urllib3's connects, every thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = urllib3.util.connection.create_connection

        def connect(*a: Any, **kw: Any) -> Any:
            try:
                return real(*a, **kw)
            except ConnectionRefusedError:
                self.count += 1
                raise

        monkeypatch.setattr(urllib3.util.connection, "create_connection", connect)


def _wait_for_listener(port: int, limit: float = 10.0) -> None:
    """Return once 127.0.0.1:``port`` accepts connections (at most ``limit`` seconds)."""
    until = time.monotonic() + limit
    while time.monotonic() < until:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"127.0.0.1:{port} still refuses connections after {limit} s")


def _options(emulator: Emulator, endpoint: str, **extra: Any) -> dict[str, Any]:
    if emulator.scheme == "gs":
        return {"endpoint_url": endpoint, **extra}
    return {
        "connection_string": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        ),
        **extra,
    }


def _root(emulator: Emulator, url: str, tmp: Path, proxy: CuttingProxy, **extra: Any) -> Any:
    options = _options(emulator, proxy.endpoint, **{"retry_deadline": 20.0, **extra})
    if emulator.scheme == "az":
        from azure.storage.blob import LinearRetry

        options["client_kwargs"] = {
            "retry_policy": LinearRetry(backoff=0.05, random_jitter_range=0, retry_total=3)
        }
    return RemoteCheckpointDir(url, storage_options=options, staging_dir=tmp / "staging")


@pytest.mark.parametrize("refuse_for", [0.0, 1.2], ids=["answer-lost", "then-refused"])
@pytest.mark.parametrize("replace", [False, True], ids=["create", "replace"])
def test_a_manifest_write_applied_whose_answer_is_lost_commits_once(
    emulator: Emulator,
    cloud_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    replace: bool,
    refuse_for: float,
) -> None:
    """The manifest write is applied by the server and its answer reset on the way
    (then, in ``then-refused``, connections refused for 1.2 s: inside connect_retries'
    0.5+1 s): the commit returns, the step is this commit's bit-exact, the write reached
    the server twice (the client's retry of a sent request, answered 412/409), and a
    second writer of the same step from the same base loses."""
    proxy = CuttingProxy(emulator.endpoint, cut=0, refuse_for=refuse_for)
    refused = Refusals(monkeypatch)
    try:
        rdir = _root(emulator, cloud_url, tmp_path, proxy)
        if replace:
            with rdir.commit(1) as path:
                write_tree(path, 1)
        rdir.check_conditional_writes()
        before = proxy.writes
        proxy.cut = proxy.cuts + 1
        with rdir.commit(1) as path:
            expected = write_tree(path, 2)
        assert proxy.cuts == proxy.cut, "the manifest write's answer was not cut"
        assert proxy.answers, "no answer was cut"
        assert b" 20" in proxy.answers[-1], proxy.answers  # the write was applied
        assert proxy.writes - before == 2, proxy.writes - before  # the client's one retry
        assert bool(refused.count) == bool(refuse_for), refused.count
        assert rdir.steps() == [1]
        assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected
    finally:
        proxy.stop()


def test_a_connection_refused_past_connect_retries_after_the_write_landed(
    emulator: Emulator, cloud_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest write is applied, its answer lost, then no connection can be made for
    3 s, longer than connect_retries=1 waits (0.5 s): the endpoint had answered, so the
    client's retries decide. GCS's (20 s here) outlast the outage and the commit returns;
    Azure's (3 tries 50 ms apart here) do not, and the commit is an OSError saying
    whether the manifest was written is unknown. Either way the step that landed is whole
    (the data is kept)."""
    proxy = CuttingProxy(emulator.endpoint, cut=0, refuse_for=3.0)
    refused = Refusals(monkeypatch)
    try:
        rdir = _root(emulator, cloud_url, tmp_path, proxy, connect_retries=1, connection_timeout=1)
        rdir.check_conditional_writes()
        proxy.cut = proxy.cuts + 1
        if emulator.scheme == "gs":
            with rdir.commit(1) as path:
                expected = write_tree(path, 3)
        else:
            with (
                pytest.raises(OSError, match="was written is unknown") as caught,
                rdir.commit(1) as path,
            ):
                expected = write_tree(path, 3)
            assert not isinstance(caught.value, ConnectionError)  # no wrong endpoint
        assert proxy.cuts == 1
        assert refused.count >= 2, refused.count  # connect_retries=1: two tries at least
        _wait_for_listener(proxy.port)  # the outage's end (GCS's commit outlasted it)
        assert rdir.steps() == [1]
        assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected
    finally:
        proxy.stop()


def test_an_outage_after_the_endpoint_answered_is_left_to_the_clients_retries(
    emulator: Emulator, cloud_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the endpoint has answered, a connection that cannot be made is an outage, not a
    wrong endpoint: with connect_retries=0, connections refused for 1.5 s (every open one
    closed) are retried by the client, and the commit returns whole. The fast failure
    (a ConnectionError after connect_retries) is for an endpoint never reached: it
    failed a training's save over any blip longer than the connection retries (3.5 s by
    default), where the clients had retried for a minute or two."""
    proxy = CuttingProxy(emulator.endpoint, cut=0)
    refused = Refusals(monkeypatch)
    try:
        options = _options(emulator, proxy.endpoint, connect_retries=0, retry_deadline=20)
        if emulator.scheme == "az":
            from azure.storage.blob import LinearRetry

            options["client_kwargs"] = {
                "retry_policy": LinearRetry(backoff=1.0, random_jitter_range=0, retry_total=4)
            }
        rdir = RemoteCheckpointDir(
            cloud_url, storage_options=options, staging_dir=tmp_path / "staging"
        )
        assert rdir.steps() == []  # the endpoint answered
        proxy.refuse_for = 1.5
        proxy.outage()
        with rdir.commit(1) as path:
            expected = write_tree(path, 4)
        assert refused.count >= 1, "no connection was refused"
        assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected
    finally:
        proxy.stop()
