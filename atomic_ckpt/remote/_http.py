"""How the gs:// and az:// clients reach their endpoint: :class:`Reach`, the connection
settings read from ``storage_options``, and :class:`FastFailAdapter`, the requests
transport both clients' requests go through.

A request that cannot even connect (refused, unresolvable host, no answer to the
connection within ``connection_timeout``, which bounds making the connection only:
sending a request and reading its answer wait the read timeout) was never sent, so
trying it again is safe; the adapter tries it ``connect_retries`` more times, 0.5 s,
1 s, 2 s... apart, then, if the endpoint has never answered (a wrong endpoint, a
stopped server), raises :class:`EndpointUnreachable`, which neither client retries
(each would keep trying for a minute or two: a wrong endpoint took 72-120 s to fail)
and which the store reports as a ``ConnectionError`` naming the endpoint and what to
check. Once it has answered, a connection that cannot be made is an outage, left to
the client's retries like a lost answer. Everything
else (a 5xx, a connection dropped mid-request, a lost answer) is left to the client's
own retries, which the conditional writes make safe, within ``retry_deadline``: once a
request of an operation (a read, a listing, an upload, a delete, a conditional write)
has failed (no answer within the read timeout, a connection dropped or refused, a 429 or
5xx), the operation's requests are retried for ``retry_deadline`` seconds from the start
of that request, then :class:`DeadlineExceeded`, which neither client retries either and
the store reports as a ``TimeoutError`` naming the endpoint. Any answer below 500 starts
the clock again, so a long upload that keeps answering is never cut off. The wait for an
answer and the clients' sleeps between tries are cut to what is left of it, so a store
that stops answering fails within ``retry_deadline`` (the clients' own policies waited
~120 s on GCS, ~130 s on Azure), and a server restart of a few seconds is ridden out.
"""

from __future__ import annotations

import importlib
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from atomic_ckpt.remote._store import DeadlineExceeded, EndpointUnreachable

# requests and urllib3 come with both clients; imported as modules of type Any, so that
# mypy --strict needs no stubs for them.
_requests: Any = importlib.import_module("requests")
_adapters: Any = importlib.import_module("requests.adapters")
_urllib3_exc: Any = importlib.import_module("urllib3.exceptions")
_Retry: Any = importlib.import_module("urllib3.util.retry").Retry
_pools: Any = importlib.import_module("urllib3.connectionpool")

OPTIONS = ("connection_timeout", "read_timeout", "connect_retries", "retry_deadline")
"""The storage_options read here (for gs:// and az:// alike)."""
_LONGEST = float(1 << 31)
"""The longest timeout taken, in seconds (68 years): a socket cannot wait past ~9e9 s
(every request would fail with an OverflowError), nor forever (inf)."""
_SLICE = 1 << 16
"""Bytes of a request body sent under one socket timeout (:func:`_fast_connecting`)."""
_state = threading.local()
"""This thread's operation: ``failing`` (monotonic time its first failed request began,
or None), ``why`` (how the last one failed)."""


@dataclass(frozen=True)
class Reach:
    """How long to wait for a connection and an answer, how often to retry a connection."""

    connection_timeout: float = 5.0
    """Seconds to wait for a connection to be made (each try)."""
    read_timeout: float | None = None
    """Seconds to wait for an answer once connected (None: the client's, 60 s)."""
    connect_retries: int = 3
    """Further tries of a connection that could not be made."""
    retry_deadline: float = 30.0
    """Seconds an operation's failing requests are retried (from the first failure's start)."""

    @classmethod
    def from_options(cls, url: str, options: dict[str, Any]) -> Reach:
        """The settings in ``options`` (ValueError naming the bad one)."""
        got: dict[str, Any] = {}
        for name in ("connection_timeout", "read_timeout", "retry_deadline"):
            value = options.get(name)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value <= _LONGEST  # nan and inf too
            ):
                raise ValueError(
                    f"{url}: storage_options {name} must be seconds > 0 (finite, at most "
                    f"{_LONGEST:.0f}), not {value!r}"
                )
            got[name] = float(value)
        retries = options.get("connect_retries")
        if retries is not None:
            if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
                raise ValueError(
                    f"{url}: storage_options connect_retries must be an int >= 0, not {retries!r}"
                )
            got["connect_retries"] = retries
        return cls(**got)


def endpoint_of(url: str) -> str:
    """``scheme://host[:port]`` of a request URL."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def check_endpoint(url: str, option: str, endpoint: str) -> None:
    """Refuse an endpoint that is no http(s) URL (requests would fail on every request
    with "No connection adapters were found")."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{url}: {option} {endpoint!r} is no endpoint URL: give it as "
            "http://host:port or https://host"
        )


class FastFailAdapter(_adapters.HTTPAdapter):  # type: ignore[misc]
    """The requests adapter of a gs:// or az:// store's session: the client's requests,
    with :class:`Reach`'s connection timeout and connection retries; a connection that
    cannot be made is :class:`EndpointUnreachable` with ``hint`` (what to check)."""

    def __init__(self, reach: Reach, hint: str) -> None:
        retry = _Retry(
            total=None,
            connect=reach.connect_retries,
            read=False,  # a request that was sent: the client's retries decide
            redirect=0,
            status=0,
            other=0,
            backoff_factor=0.5,
            raise_on_status=False,
        )
        self.reach = reach
        self.hint = hint
        self.pools = {
            scheme: _fast_connecting(pool, reach.connection_timeout)
            for scheme, pool in (
                ("http", _pools.HTTPConnectionPool),
                ("https", _pools.HTTPSConnectionPool),
            )
        }
        self.answered: set[str] = set()
        """The endpoints that have answered a request (an outage of one is no wrong endpoint)."""
        super().__init__(pool_maxsize=64, max_retries=retry)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self.pools

    def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(*args, **kwargs)
        manager.pool_classes_by_scheme = self.pools
        return manager

    def send(self, request: Any, *args: Any, timeout: Any = None, **kwargs: Any) -> Any:
        start = time.monotonic()
        left = self.reach.retry_deadline - _failing_for(start)
        if left <= 0:
            raise self._gave_up(request, start)
        read = self.reach.read_timeout
        if read is None:
            read = timeout[1] if isinstance(timeout, tuple) else timeout
        # No wait for an answer past what is left of the deadline (an answer that stops
        # coming is a failure like any: the client retries it, until the deadline).
        read = left if read is None else min(read, left)
        try:
            # urllib3 sends the request under its "connect" timeout and waits for the
            # answer under the read one: both are the read timeout here, the connection
            # alone is bounded by connection_timeout (_fast_connecting).
            answer = super().send(request, *args, timeout=(read, read), **kwargs)
        except _requests.ConnectionError as exc:
            endpoint = endpoint_of(str(request.url))
            if endpoint in self.answered:  # an outage of an endpoint that answered: the
                self._failed(request, start, exc)  # client retries, within the deadline
            reason = getattr(exc.args[0] if exc.args else None, "reason", None)
            if isinstance(reason, _urllib3_exc.ProxyError):  # the proxy's connection
                reason = reason.original_error
                proxy = _proxy_of(kwargs.get("proxies"), endpoint)
                endpoint = f"the proxy {proxy} (HTTP(S)_PROXY, for {endpoint})"
            if not isinstance(reason, _urllib3_exc.ConnectTimeoutError):  # refused, DNS, timeout
                self._failed(request, start, exc)
            tries = self.reach.connect_retries + 1
            raise EndpointUnreachable(
                f"cannot connect to {endpoint} ({_why(reason)}; {tries} "
                f"{'try' if tries == 1 else 'tries'}, {self.reach.connection_timeout:g} s "
                f"each at most): {self.hint}; storage_options connection_timeout and "
                "connect_retries bound how long this takes"
            ) from exc
        except _requests.RequestException as exc:  # a timeout, a broken answer
            self._failed(request, start, exc)
        self.answered.add(endpoint_of(str(request.url)))
        if answer.status_code >= 500 or answer.status_code == 429:
            if getattr(_state, "failing", None) is None:
                _state.failing = start
            _state.why = f"answered {answer.status_code} {answer.reason}"
        else:
            _state.failing = None
        return answer

    def _failed(self, request: Any, start: float, exc: BaseException) -> Any:
        """Record a request that failed; re-raise it for the client to retry, or raise
        :class:`DeadlineExceeded` if the operation's deadline has passed meanwhile."""
        if getattr(_state, "failing", None) is None:
            _state.failing = start
        _state.why = _why(getattr(exc.args[0] if exc.args else None, "reason", exc))
        if _failing_for(time.monotonic()) >= self.reach.retry_deadline:
            raise self._gave_up(request, time.monotonic()) from exc
        raise exc

    def _gave_up(self, request: Any, now: float) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"{endpoint_of(str(request.url))} has not answered for {_failing_for(now):.1f} s "
            f"of retries (last: {getattr(_state, 'why', '?')}): {self.hint}; "
            f"storage_options retry_deadline ({self.reach.retry_deadline:g} s) bounds how "
            "long a failing request is retried"
        )


def begin_operation() -> None:
    """Start this thread's operation: its deadline runs from its first failed request."""
    _state.failing = None


def _failing_for(now: float) -> float:
    """Seconds since this thread's operation first failed (0: it has not)."""
    failing = getattr(_state, "failing", None)
    return 0.0 if failing is None else max(0.0, now - failing)


def retry_sleep(seconds: float, reach: Reach) -> float:
    """A client's sleep before its next try, cut to what is left of the deadline (the
    next try then fails with :class:`DeadlineExceeded` at once)."""
    left = reach.retry_deadline - _failing_for(time.monotonic())
    return max(0.0, min(seconds, left))


def _fast_connecting(pool: Any, limit: float) -> Any:
    """``pool`` (a urllib3 connection pool class) whose connections wait at most ``limit``
    seconds for the connection to be made, and then the request's timeout for sending
    (urllib3 uses one timeout for both: a large body stalled past ``limit`` was cut off)."""
    base = pool.ConnectionCls

    def _new_conn(self: Any) -> Any:
        sending = self.timeout
        if sending is not None and not isinstance(sending, int | float):
            sending = socket.getdefaulttimeout()  # urllib3's "default" (1.26 and 2.x differ)
        self.timeout = limit if sending is None else min(limit, sending)
        try:
            sock = base._new_conn(self)
        finally:
            self.timeout = sending
        sock.settimeout(sending)
        return sock

    def send(self: Any, data: Any) -> None:
        # http.client sends a bytes body with one sendall(), which the socket's timeout
        # bounds as a whole: a part of 5 MiB on a slow link was cut off at the timeout
        # (retry_deadline) with every byte moving. In slices, the timeout bounds a stall.
        if isinstance(data, bytes | bytearray | memoryview) and len(data) > _SLICE:
            view = memoryview(data).cast("B")
            for offset in range(0, len(view), _SLICE):
                base.send(self, view[offset : offset + _SLICE])
            return
        base.send(self, data)

    connection = type(
        f"FastConnecting{base.__name__}", (base,), {"_new_conn": _new_conn, "send": send}
    )
    return type(f"FastConnecting{pool.__name__}", (pool,), {"ConnectionCls": connection})


def _proxy_of(proxies: Any, endpoint: str) -> str:
    """The proxy requests chose for ``endpoint`` (its URL without credentials)."""
    chosen = _requests.utils.select_proxy(endpoint, proxies or {}) or "?"
    parts = urllib.parse.urlsplit(chosen)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def _why(reason: Any) -> str:
    """The end of urllib3's message: "[Errno 111] Connection refused", "timed out"..."""
    text = str(reason)
    for marker in ("Failed to establish a new connection: ", "Failed to resolve "):
        if marker in text:
            return text.split(marker, 1)[1]
    return text.split("): ", 1)[-1]


def mount(session: Any, reach: Reach, hint: str) -> None:
    """Send every request of ``session`` through a :class:`FastFailAdapter`."""
    adapter = FastFailAdapter(reach, hint)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
