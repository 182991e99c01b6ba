"""The GenRM clients: ``AsyncGenRMClient`` for rollouts, ``SyncGenRMClient`` for scripts.

Both twins share ``_BaseClient`` (configuration, request building, the retry decisions and the
mapping of answers to typed errors, all I/O-free) and differ only in how they send and sleep.

An ``httpx.AsyncClient`` is bound to the event loop that first used it; reusing it from a second
``asyncio.run`` fails with a closed transport. ``AsyncGenRMClient`` therefore keeps one httpx
client per running event loop, created on first use in that loop, so one process-wide client (see
``get_genrm_client``) stays valid across loops and threads; each pool is closed inside its own
loop when that loop shuts down (see ``_close_with_loop``).
"""

# Every call takes a ``timeout=`` override (the openai/httpx convention users expect); it is the
# call's total deadline and is enforced with ``asyncio.timeout`` inside, which ASYNC109 asks for.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeAlias, overload

import httpx
from pydantic import ValidationError

from genrm_client import _retry
from genrm_client._compat import mark_absent_sniffio
from genrm_client._constants import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT_S,
    KEEPALIVE_EXPIRY_S,
    OVERLOAD_STATUSES,
    REQUEST_ID_HEADER,
)
from genrm_client._exceptions import (
    GenRMConnectionError,
    GenRMError,
    GenRMHTTPError,
    GenRMOverloadedError,
    GenRMTimeoutError,
    UnknownRouteKeyError,
)
from genrm_client._settings import ClientSettings, load_settings
from genrm_client.types import (
    DEFAULT_ROUTE_KEY,
    ERROR_TYPE_STATUS,
    ErrorBody,
    GenerateBatchRequest,
    GenerateBatchResponse,
    GenerateRequest,
    GenerateResponse,
    HealthReport,
    Message,
    SamplingParams,
)

mark_absent_sniffio()

__all__ = [
    "NOT_GIVEN",
    "AsyncGenRMClient",
    "MessageLike",
    "NotGiven",
    "RequestLike",
    "SamplingParamsLike",
    "SyncGenRMClient",
    "close_genrm_clients",
    "get_genrm_client",
]


class NotGiven:
    """Sentinel of an omitted argument: "use the client's default" (``None`` may mean something)."""

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven()

MessageLike: TypeAlias = Message | Mapping[str, Any]
SamplingParamsLike: TypeAlias = SamplingParams | Mapping[str, Any]
RequestLike: TypeAlias = GenerateRequest | Mapping[str, Any]


# ----------------------------------------------------------------------------------------------
# Input coercion: every check happens here, before any network.


def _to_messages(messages: Sequence[MessageLike]) -> list[Message]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages must be a list of {{'role', 'content'}} dicts or Message objects, "
            f"got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages must not be empty")
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]


def _to_sampling_params(params: SamplingParamsLike | None) -> SamplingParams | None:
    if params is None or isinstance(params, SamplingParams):
        return params
    if not isinstance(params, Mapping):
        raise TypeError(
            f"sampling_params must be a dict or SamplingParams, got {type(params).__name__}"
        )
    unknown = sorted(str(k) for k in params if k not in SamplingParams.model_fields)
    if unknown:
        allowed = ", ".join(SamplingParams.model_fields)
        raise ValueError(
            f"unknown sampling_params key(s): {', '.join(unknown)} (allowed: {allowed})"
        )
    return SamplingParams.model_validate(dict(params))


def _to_request(request: RequestLike, index: int) -> GenerateRequest:
    """Coerce ``requests[index]``; errors name the index so a bad item is easy to find."""
    if isinstance(request, GenerateRequest):
        return request
    where = f"requests[{index}]"
    if not isinstance(request, Mapping):
        raise TypeError(
            f"{where}: expected a dict or GenerateRequest, got {type(request).__name__}"
        )
    unknown = sorted(str(k) for k in request if k not in GenerateRequest.model_fields)
    if unknown:
        raise ValueError(
            f"{where}: unknown request key(s): {', '.join(unknown)} "
            f"(allowed: {', '.join(GenerateRequest.model_fields)})"
        )
    if "messages" not in request:
        raise ValueError(f"{where}: missing required key 'messages'")
    try:
        return _make_request(
            request["messages"],
            request.get("sampling_params"),
            request.get("route_key"),
            request.get("prefix_key"),
        )
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _to_requests(requests: Sequence[RequestLike]) -> list[GenerateRequest]:
    return [_to_request(r, i) for i, r in enumerate(requests)]


def _make_request(
    messages: Sequence[MessageLike],
    sampling_params: SamplingParamsLike | None,
    route_key: str | None,
    prefix_key: str | None = None,
) -> GenerateRequest:
    return GenerateRequest(
        messages=_to_messages(messages),
        sampling_params=_to_sampling_params(sampling_params),
        route_key=route_key,
        prefix_key=prefix_key,
    )


def _check_concurrency(concurrency: int) -> None:
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")


# ----------------------------------------------------------------------------------------------
# Answers → results or typed errors.


def _body_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _route_prefix_hint(url: str) -> str:
    """What to set when a request found no GenRM service: the base URL must end in the route
    prefix, ``/genrm`` by default (``GENRM_URL=http://127.0.0.1:8000/genrm``)."""
    parts = httpx.URL(url)
    base = parts.path.rsplit("/", 1)[0] if "/" in parts.path else ""
    if base.rstrip("/") == "":
        root = str(parts.copy_with(path="/genrm", query=None, fragment=None))
        return (
            f"The base URL has no route prefix: set GENRM_URL (or base_url) to {root}, "
            "the service's address with its route prefix (/genrm by default)."
        )
    return (
        "Check GENRM_URL (or base_url): it is the service's address with its route prefix, "
        "e.g. http://127.0.0.1:8000/genrm."
    )


def _error_detail(body: Any) -> ErrorBody | None:
    try:
        return ErrorBody.model_validate(body)
    except ValidationError:
        return None


def _item_error(
    item: ErrorBody, request: GenerateRequest, request_id: str | None = None
) -> GenRMError:
    """Map one per-request error of ``generate_batch`` to its typed exception (not raised)."""
    detail = item.error
    body = item.model_dump(exclude_none=True)
    if detail.type == "unknown_route_key":
        return UnknownRouteKeyError(
            detail.route_key or request.route_key or DEFAULT_ROUTE_KEY,
            detail.registered_route_keys,
            body=body,
            request_id=request_id,
        )
    if detail.type == "timeout":
        return GenRMTimeoutError(f"the service timed out this request: {detail.message}")
    status = ERROR_TYPE_STATUS.get(detail.type, 500)
    message = f"{detail.type}: {detail.message}"
    if detail.type == "overloaded":
        return GenRMOverloadedError(message, status=status, body=body, request_id=request_id)
    return GenRMHTTPError(message, status=status, body=body, request_id=request_id)


def _decode_generate(response: httpx.Response) -> GenerateResponse:
    try:
        return GenerateResponse.model_validate_json(response.content)
    except ValidationError as exc:
        raise GenRMError(
            f"the service answered {response.request.url} with a body that is not a "
            f"GenerateResponse: {response.text[:200]!r}"
        ) from exc


def _decode_batch(
    response: httpx.Response, requests: Sequence[GenerateRequest]
) -> list[GenerateResponse | GenRMError]:
    try:
        batch = GenerateBatchResponse.model_validate_json(response.content)
    except ValidationError as exc:
        raise GenRMError(
            f"the service answered {response.request.url} with a body that is not a "
            f"GenerateBatchResponse: {response.text[:200]!r}"
        ) from exc
    if len(batch.results) != len(requests):
        raise GenRMError(
            f"generate_batch sent {len(requests)} requests but got {len(batch.results)} results"
        )
    request_id = response.request.headers.get(REQUEST_ID_HEADER)
    return [
        item if isinstance(item, GenerateResponse) else _item_error(item, req, request_id)
        for item, req in zip(batch.results, requests, strict=True)
    ]


def _decode_route_keys(response: httpx.Response) -> list[str]:
    """The ``route_keys`` of a ``/sleep`` or ``/wake_up`` answer."""
    body = _body_of(response)
    keys = body.get("route_keys") if isinstance(body, dict) else None
    if not isinstance(keys, list):
        raise GenRMError(
            f"the service answered {response.request.url} without a list of route_keys: "
            f"{response.text[:200]!r}"
        )
    return [str(k) for k in keys]


def _accept_health(response: httpx.Response) -> bool:
    """``/health`` answers an unhealthy service with 503 and a report: that is an answer."""
    if response.is_success:
        return True
    if response.status_code != 503:
        return False
    try:
        HealthReport.model_validate_json(response.content)
    except ValidationError:
        return False
    return True


class _Attempts:
    """The I/O-free state of one call: deadline, attempt count and every retry decision.

    The twins drive it: send, then ask ``on_response``/``on_transport_error`` for either a delay
    to sleep before the next attempt, or the typed error (raised from inside those methods).
    """

    def __init__(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        max_retries: int,
        route_key: str | None,
        accept: Callable[[httpx.Response], bool] | None,
    ) -> None:
        self.method = method
        self.url = url
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.max_retries = max_retries
        self.route_key = route_key
        self.accept = accept
        self.request_id = uuid.uuid4().hex
        self.attempt = 0

    def _where(self) -> str:
        return f"{self.method} {self.url}"

    def timeout_error(self, cause: BaseException | None = None) -> GenRMTimeoutError:
        return GenRMTimeoutError(
            f"{self._where()} did not complete within its {self.timeout_s:g} s deadline "
            f"({self.attempt + 1} attempt(s); request_id={self.request_id})"
            + (f": {type(cause).__name__}" if cause is not None else "")
        )

    def remaining(self) -> float:
        """Seconds left before the deadline; raises ``GenRMTimeoutError`` when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timeout_error()
        return left

    def httpx_timeout(self) -> httpx.Timeout:
        left = self.remaining()
        return httpx.Timeout(left, connect=min(DEFAULT_CONNECT_TIMEOUT_S, left))

    def _delay_or_none(self, retry_after: float | None) -> float | None:
        """The wait before the next attempt, or ``None`` when retries or time are used up."""
        if self.attempt >= self.max_retries:
            return None
        delay = _retry.retry_delay(self.attempt, retry_after)
        if delay >= self.deadline - time.monotonic():
            return None
        self.attempt += 1
        return delay

    def on_transport_error(self, exc: httpx.TransportError) -> float:
        """Call inside ``except``: the delay before retrying, or raises the typed error."""
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            # Read/write/pool timeouts are set to what is left of the deadline: it has passed.
            raise self.timeout_error(exc) from exc
        delay = self._delay_or_none(None)
        if delay is None:
            if time.monotonic() >= self.deadline:
                raise self.timeout_error(exc) from exc
            raise GenRMConnectionError(
                f"could not reach the GenRM service at {self.url} after "
                f"{self.attempt + 1} attempt(s): {type(exc).__name__}: {exc}"
            ) from exc
        return delay

    def on_response(self, response: httpx.Response) -> float | None:
        """``None`` to accept the answer, a delay to retry after, or raises the typed error."""
        status = response.status_code
        if response.is_success or (self.accept is not None and self.accept(response)):
            return None
        if _retry.should_retry(status, response.headers):
            delay = self._delay_or_none(_retry.parse_retry_after(response.headers))
            if delay is not None:
                return delay
        raise self.status_error(response)

    def status_error(self, response: httpx.Response) -> GenRMHTTPError:
        status = response.status_code
        body = _body_of(response)
        detail = _error_detail(body)
        if status == 404 and detail is None:
            # GenRM's own 404s (an unknown route_key) carry its error body: a bare 404 is
            # another server, or the service without its route prefix (GENRM_URL ending in
            # the port instead of /genrm), never a route_key GenRM refused.
            return GenRMHTTPError(
                f"{self._where()} answered HTTP 404 without GenRM's error body "
                f"(request_id={self.request_id}): no GenRM service at that path. "
                + _route_prefix_hint(str(response.request.url)),
                status=status,
                body=body,
                request_id=self.request_id,
            )
        if status == 404 and detail is not None and detail.error.type == "unknown_route_key":
            return UnknownRouteKeyError(
                detail.error.route_key or self.route_key or DEFAULT_ROUTE_KEY,
                detail.error.registered_route_keys,
                body=body,
                request_id=self.request_id,
            )
        reason = (
            f"{detail.error.type}: {detail.error.message}"
            if detail is not None
            else (response.text[:200] or response.reason_phrase)
        )
        message = (
            f"{self._where()} answered HTTP {status} after {self.attempt + 1} attempt(s) "
            f"(request_id={self.request_id}): {reason}"
        )
        if status == 404 and detail is not None and detail.error.type == "not_found":
            # GenRM's ingress, at a path it does not serve: the base URL has a wrong prefix
            message += ". " + _route_prefix_hint(str(response.request.url))
        cls = GenRMOverloadedError if status in OVERLOAD_STATUSES else GenRMHTTPError
        return cls(message, status=status, body=body, request_id=self.request_id)


# ----------------------------------------------------------------------------------------------
# The shared base.


class _BaseClient:
    """Configuration and request building shared by both twins."""

    def __init__(
        self,
        base_url: str | None,
        timeout: float | None,
        max_retries: int | None,
        max_connections: int | None,
        api_key: str | None,
    ) -> None:
        needs_env = None in (base_url, timeout, max_retries, max_connections, api_key)
        settings = load_settings() if needs_env else ClientSettings.model_construct()
        self.base_url = (base_url if base_url is not None else settings.url).rstrip("/")
        self.timeout = float(timeout if timeout is not None else settings.timeout_s)
        self.max_retries = max_retries if max_retries is not None else settings.max_retries
        self.max_connections = (
            max_connections if max_connections is not None else settings.max_connections
        )
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections!r}")
        key = api_key
        if key is None and settings.api_key is not None:
            key = settings.api_key.get_secret_value()
        self._headers = {"Accept": "application/json", "User-Agent": "genrm-client"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, timeout={self.timeout:g})"

    def _limits(self) -> httpx.Limits:
        return httpx.Limits(
            max_connections=self.max_connections,
            max_keepalive_connections=self.max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )

    def _attempts(
        self,
        method: str,
        path: str,
        timeout: float | NotGiven,
        *,
        route_key: str | None = None,
        accept: Callable[[httpx.Response], bool] | None = None,
    ) -> _Attempts:
        if isinstance(timeout, NotGiven):
            timeout_s = self.timeout
        else:
            timeout_s = float(timeout)
            if timeout_s <= 0:
                raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        return _Attempts(
            method,
            f"{self.base_url}{path}",
            timeout_s=timeout_s,
            max_retries=self.max_retries,
            route_key=route_key,
            accept=accept,
        )

    def _generate_call(
        self, request: GenerateRequest, timeout: float | NotGiven
    ) -> tuple[_Attempts, bytes]:
        """The attempts and body of one ``POST /generate``; the twins only send them."""
        attempts = self._attempts("POST", "/generate", timeout, route_key=request.route_key)
        return attempts, request.model_dump_json(exclude_none=True).encode()

    def _batch_call(
        self, requests: list[GenerateRequest], timeout: float | NotGiven
    ) -> tuple[_Attempts, bytes]:
        """The attempts and body of one ``POST /generate_batch`` of coerced ``requests``."""
        attempts = self._attempts("POST", "/generate_batch", timeout)
        body = GenerateBatchRequest(requests=requests).model_dump_json(exclude_none=True)
        return attempts, body.encode()

    def _health_attempts(self, timeout: float | NotGiven) -> _Attempts:
        return self._attempts("GET", "/health", timeout, accept=_accept_health)

    def _memory_call(
        self, path: str, route_key: str | None, timeout: float | NotGiven
    ) -> tuple[_Attempts, bytes]:
        """The attempts and body of ``POST /sleep`` or ``/wake_up`` (one instance, or all)."""
        attempts = self._attempts("POST", path, timeout, route_key=route_key)
        body = {} if route_key is None else {"route_key": route_key}
        return attempts, json.dumps(body).encode()

    def _request_headers(self, attempts: _Attempts, has_body: bool) -> dict[str, str]:
        headers = {REQUEST_ID_HEADER: attempts.request_id}
        if has_body:
            headers["Content-Type"] = "application/json"
        return headers


# ----------------------------------------------------------------------------------------------
# The async client.


async def _close_with_loop(pool: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    """Hold ``pool`` open for the life of its event loop, then close it inside that loop.

    Started once and left suspended: the loop tracks it as a live async generator, so the
    ``shutdown_asyncgens()`` that ``asyncio.run`` does before closing its loop (and the
    loop's finalizer, should the client be garbage-collected first) runs the ``finally`` while
    the loop still runs, and the pool's sockets are closed cleanly instead of leaking.
    """
    try:
        yield
    finally:
        await pool.aclose()


class AsyncGenRMClient(_BaseClient):
    """Async client of the GenRM judge service (also exported as ``GenRMClient``).

    Every argument left ``None`` comes from the environment (``GENRM_URL``, ``GENRM_TIMEOUT_S``,
    ``GENRM_MAX_RETRIES``, ``GENRM_MAX_CONNECTIONS``, ``GENRM_API_KEY``), then the defaults in
    ``_constants``. ``timeout`` is the total deadline of one call, retries included;
    ``max_connections`` bounds the requests in flight from one event loop.

    One instance may be used from several event loops (one after another, or at once from
    several threads): it keeps one connection pool per loop. ``transport`` replaces the network
    (e.g. ``httpx.ASGITransport(app)`` to call an app in-process); it is closed with the client.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_connections: int | None = None,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, timeout, max_retries, max_connections, api_key)
        self._transport = transport
        self._lock = threading.Lock()
        self._pools: dict[
            asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, AsyncGenerator[None, None]]
        ] = {}
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Whether ``aclose()`` was called; a closed client refuses every call."""
        return self._closed

    async def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            for lp in [lp for lp, (pool, _) in self._pools.items() if lp.is_closed()]:
                # A loop closed without shutdown_asyncgens(): nothing is left to await.
                del self._pools[lp]
            entry = self._pools.get(loop)
            if entry is not None and not entry[0].is_closed:
                return entry[0]
            pool = httpx.AsyncClient(
                headers=self._headers, limits=self._limits(), transport=self._transport
            )
            guard = _close_with_loop(pool)
            self._pools[loop] = (pool, guard)
        await anext(guard)  # runs to its ``yield`` at once; the loop now tracks it
        return pool

    async def aclose(self) -> None:
        """Close the connection pools; idempotent. Later calls raise ``RuntimeError``."""
        with self._lock:
            self._closed = True
            pools = list(self._pools.items())
            self._pools.clear()
        current = asyncio.get_running_loop()
        for loop, (pool, guard) in pools:
            if loop is current:
                await guard.aclose()
                await pool.aclose()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(guard.aclose(), loop)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- transport -----------------------------------------------------------------------------

    async def _send(self, attempts: _Attempts, content: bytes | None = None) -> httpx.Response:
        http = await self._http()
        headers = self._request_headers(attempts, content is not None)
        try:
            async with asyncio.timeout(attempts.remaining()):
                while True:
                    try:
                        response = await http.request(
                            attempts.method,
                            attempts.url,
                            content=content,
                            headers=headers,
                            timeout=attempts.httpx_timeout(),
                        )
                    except httpx.TransportError as exc:
                        await asyncio.sleep(attempts.on_transport_error(exc))
                        continue
                    delay = attempts.on_response(response)
                    if delay is None:
                        return response
                    await response.aclose()
                    await asyncio.sleep(delay)
        except TimeoutError as exc:
            raise attempts.timeout_error(exc) from exc

    # -- API -----------------------------------------------------------------------------------

    async def generate(
        self,
        messages: Sequence[MessageLike],
        sampling_params: SamplingParamsLike | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
        timeout: float | NotGiven = NOT_GIVEN,
    ) -> str:
        """Ask the judge of ``route_key`` (default instance when ``None``); return its text.

        ``prefix_key``: requests with the same key go to the same engine of the instance (see
        ``GenerateRequest.prefix_key``), so the prompt prefix they share is computed once.
        """
        full = await self.generate_full(
            messages, sampling_params, route_key, prefix_key=prefix_key, timeout=timeout
        )
        return full.response

    async def generate_full(
        self,
        messages: Sequence[MessageLike],
        sampling_params: SamplingParamsLike | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
        timeout: float | NotGiven = NOT_GIVEN,
    ) -> GenerateResponse:
        """Like ``generate`` but return the whole ``GenerateResponse`` (text and meta)."""
        request = _make_request(messages, sampling_params, route_key, prefix_key)
        return await self._generate(request, timeout)

    async def _generate(
        self, request: GenerateRequest, timeout: float | NotGiven
    ) -> GenerateResponse:
        response = await self._send(*self._generate_call(request, timeout))
        return _decode_generate(response)

    async def generate_batch(
        self, requests: Sequence[RequestLike], *, timeout: float | NotGiven = NOT_GIVEN
    ) -> list[GenerateResponse | GenRMError]:
        """Send independent requests in one ``POST /generate_batch``; answers in input order.

        A request that failed alone comes back as its typed exception *in the list* (not
        raised); an error of the whole call (unreachable, overloaded, deadline) is raised.
        """
        reqs = _to_requests(requests)
        if not reqs:
            return []
        response = await self._send(*self._batch_call(reqs, timeout))
        return _decode_batch(response, reqs)

    @overload
    async def generate_many(
        self,
        requests: Sequence[RequestLike],
        *,
        concurrency: int = ...,
        timeout: float | NotGiven = ...,
        return_exceptions: Literal[False] = ...,
    ) -> list[GenerateResponse]: ...

    @overload
    async def generate_many(
        self,
        requests: Sequence[RequestLike],
        *,
        concurrency: int = ...,
        timeout: float | NotGiven = ...,
        return_exceptions: Literal[True],
    ) -> list[GenerateResponse | GenRMError]: ...

    async def generate_many(
        self,
        requests: Sequence[RequestLike],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float | NotGiven = NOT_GIVEN,
        return_exceptions: bool = False,
    ) -> list[GenerateResponse] | list[GenerateResponse | GenRMError]:
        """Run many ``/generate`` calls, at most ``concurrency`` at once; results in input order.

        Every request is validated before the first is sent. ``timeout`` is each call's own
        deadline. With ``return_exceptions=False`` the first ``GenRMError`` cancels the rest and
        is raised; with ``True`` it takes its request's place in the list.
        """
        _check_concurrency(concurrency)
        reqs = _to_requests(requests)
        results: list[GenerateResponse | GenRMError | None] = [None] * len(reqs)
        pending = iter(enumerate(reqs))

        async def worker() -> None:
            for index, request in pending:
                try:
                    results[index] = await self._generate(request, timeout)
                except GenRMError as exc:
                    if not return_exceptions:
                        raise
                    results[index] = exc

        workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(reqs)))]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        return [r for r in results if r is not None]

    async def health(self, *, timeout: float | NotGiven = NOT_GIVEN) -> HealthReport:
        """``GET /health``: the service's report, also when it says it is unhealthy."""
        response = await self._send(self._health_attempts(timeout))
        return HealthReport.model_validate_json(response.content)

    async def metrics(self, *, timeout: float | NotGiven = NOT_GIVEN) -> str:
        """``GET /metrics``: the service's metrics as text (Prometheus exposition format)."""
        response = await self._send(self._attempts("GET", "/metrics", timeout))
        return response.text

    async def sleep(
        self, route_key: str | None = None, *, timeout: float | NotGiven = NOT_GIVEN
    ) -> list[str]:
        """``POST /sleep``: free the engines' memory (one instance, or all); the keys slept.

        A colocated trainer calls this before it takes the judges' GPUs back.
        """
        response = await self._send(*self._memory_call("/sleep", route_key, timeout))
        return _decode_route_keys(response)

    async def wake_up(
        self, route_key: str | None = None, *, timeout: float | NotGiven = NOT_GIVEN
    ) -> list[str]:
        """``POST /wake_up``: restore the engines' memory and admit requests again."""
        response = await self._send(*self._memory_call("/wake_up", route_key, timeout))
        return _decode_route_keys(response)


#: The name the spec and the issue use for the async client.
GenRMClient = AsyncGenRMClient


# ----------------------------------------------------------------------------------------------
# The sync twin.


class SyncGenRMClient(_BaseClient):
    """Blocking twin of ``AsyncGenRMClient`` for scripts and notebooks; safe across threads.

    Same arguments, methods and errors; ``generate_many`` runs its calls on a thread pool. The
    deadline is checked between attempts and bounds every phase of an attempt.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_connections: int | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, timeout, max_retries, max_connections, api_key)
        self._http = httpx.Client(headers=self._headers, limits=self._limits(), transport=transport)

    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._http.is_closed

    def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, attempts: _Attempts, content: bytes | None = None) -> httpx.Response:
        if self._http.is_closed:
            raise RuntimeError(f"{self!r} is closed")
        headers = self._request_headers(attempts, content is not None)
        while True:
            try:
                response = self._http.request(
                    attempts.method,
                    attempts.url,
                    content=content,
                    headers=headers,
                    timeout=attempts.httpx_timeout(),
                )
            except httpx.TransportError as exc:
                time.sleep(attempts.on_transport_error(exc))
                continue
            delay = attempts.on_response(response)
            if delay is None:
                return response
            response.close()
            time.sleep(delay)

    def generate(
        self,
        messages: Sequence[MessageLike],
        sampling_params: SamplingParamsLike | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
        timeout: float | NotGiven = NOT_GIVEN,
    ) -> str:
        """Ask the judge of ``route_key`` (default instance when ``None``); return its text."""
        full = self.generate_full(
            messages, sampling_params, route_key, prefix_key=prefix_key, timeout=timeout
        )
        return full.response

    def generate_full(
        self,
        messages: Sequence[MessageLike],
        sampling_params: SamplingParamsLike | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
        timeout: float | NotGiven = NOT_GIVEN,
    ) -> GenerateResponse:
        """Like ``generate`` but return the whole ``GenerateResponse`` (text and meta)."""
        request = _make_request(messages, sampling_params, route_key, prefix_key)
        return self._generate(request, timeout)

    def _generate(self, request: GenerateRequest, timeout: float | NotGiven) -> GenerateResponse:
        return _decode_generate(self._send(*self._generate_call(request, timeout)))

    def generate_batch(
        self, requests: Sequence[RequestLike], *, timeout: float | NotGiven = NOT_GIVEN
    ) -> list[GenerateResponse | GenRMError]:
        """See ``AsyncGenRMClient.generate_batch``."""
        reqs = _to_requests(requests)
        if not reqs:
            return []
        return _decode_batch(self._send(*self._batch_call(reqs, timeout)), reqs)

    @overload
    def generate_many(
        self,
        requests: Sequence[RequestLike],
        *,
        concurrency: int = ...,
        timeout: float | NotGiven = ...,
        return_exceptions: Literal[False] = ...,
    ) -> list[GenerateResponse]: ...

    @overload
    def generate_many(
        self,
        requests: Sequence[RequestLike],
        *,
        concurrency: int = ...,
        timeout: float | NotGiven = ...,
        return_exceptions: Literal[True],
    ) -> list[GenerateResponse | GenRMError]: ...

    def generate_many(
        self,
        requests: Sequence[RequestLike],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float | NotGiven = NOT_GIVEN,
        return_exceptions: bool = False,
    ) -> list[GenerateResponse] | list[GenerateResponse | GenRMError]:
        """See ``AsyncGenRMClient.generate_many``; runs on ``concurrency`` threads."""
        _check_concurrency(concurrency)
        reqs = _to_requests(requests)
        if not reqs:
            return []

        def one(request: GenerateRequest) -> GenerateResponse | GenRMError:
            try:
                return self._generate(request, timeout)
            except GenRMError as exc:
                if not return_exceptions:
                    raise
                return exc

        with ThreadPoolExecutor(max_workers=min(concurrency, len(reqs))) as pool:
            futures = [pool.submit(one, r) for r in reqs]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def health(self, *, timeout: float | NotGiven = NOT_GIVEN) -> HealthReport:
        """``GET /health``: the service's report, also when it says it is unhealthy."""
        response = self._send(self._health_attempts(timeout))
        return HealthReport.model_validate_json(response.content)

    def metrics(self, *, timeout: float | NotGiven = NOT_GIVEN) -> str:
        """``GET /metrics``: the service's metrics as text (Prometheus exposition format)."""
        return self._send(self._attempts("GET", "/metrics", timeout)).text

    def sleep(
        self, route_key: str | None = None, *, timeout: float | NotGiven = NOT_GIVEN
    ) -> list[str]:
        """``POST /sleep``: free the engines' memory (one instance, or all); the keys slept."""
        response = self._send(*self._memory_call("/sleep", route_key, timeout))
        return _decode_route_keys(response)

    def wake_up(
        self, route_key: str | None = None, *, timeout: float | NotGiven = NOT_GIVEN
    ) -> list[str]:
        """``POST /wake_up``: restore the engines' memory and admit requests again."""
        response = self._send(*self._memory_call("/wake_up", route_key, timeout))
        return _decode_route_keys(response)


# ----------------------------------------------------------------------------------------------
# The process-wide client.

_singletons: dict[str | None, AsyncGenRMClient] = {}
_singletons_lock = threading.Lock()


def get_genrm_client(base_url: str | None = None) -> AsyncGenRMClient:
    """The process-wide ``AsyncGenRMClient`` for ``base_url`` (``GENRM_URL`` when ``None``).

    Cheap to call anywhere (module level, inside a reward function, in any thread). The client
    keeps one connection pool per running event loop, so the same object keeps working across
    ``asyncio.run`` calls. Settings are read from the environment on first use.
    """
    with _singletons_lock:
        client = _singletons.get(base_url)
        if client is None or client.is_closed:
            client = AsyncGenRMClient(base_url)
            _singletons[base_url] = client
        return client


async def close_genrm_clients() -> None:
    """Close every client ``get_genrm_client`` handed out; the next call makes fresh ones."""
    with _singletons_lock:
        clients = list(_singletons.values())
        _singletons.clear()
    for client in clients:
        await client.aclose()
