"""The `openai` backend's transport: every HTTP request to an OpenAI-compatible server, retried and rate-limited.

Requests go through the official SDK with its own retries switched off (`max_retries=0`); `Transport` retries
instead, so that every request ends as an answer or a categorised `Failure`, and concurrency adapts:

- At most `options.concurrency` requests are in flight. A 429 halves an effective limit (at most once per
  round trip) and each success raises it by 1/limit (AIMD, `_AdaptiveLimit`), so a rate-limited server sees
  fewer requests; request starts are spaced by the event loop's CPU time per request (`_Pacer`).
- Retried, with exponential backoff and full jitter or the server's `Retry-After` (capped at 60 s): 429,
  408, 5xx, timeouts, refused/reset/dropped connections, 200 answers whose body is not JSON.
- Not retried: 401/403 (AUTH), 400/404/422 and other 4xx (BAD_REQUEST). What an answer must hold beyond a JSON
  object is the reader's to check (`harness.backends.openai_parse`).
- `options.timeout` bounds each attempt as a whole (connect, send, wait, read); response bodies are bounded by
  what the request asked for (`harness.backends.http_bounds`).
- The server's URL may carry a query (`?api_key=...`, `?api-version=...`): its parameters go with every
  request, and the URL is shown and stored only masked (`url`, `harness.redact.mask_url`).
- `http_requests` counts every HTTP request (attempts and probes), the calls as the server sees them.

Requests go through the SDK's generic `client.post(path, body=..., cast_to=<httpx Response>)`, its documented
way to make raw calls, and the few fields used are parsed and checked by the caller. The typed `create()`
transforms every parameter and parses the answer into pydantic models, which took about a third of the client's
CPU per request against a local server; CPU per request is what limits throughput there (see `harness bench api`).

The API key comes from the environment variable `options.api_key_env`, or else from `$OPENAI_API_KEY` where set
(a placeholder when not, since local servers need none). It is scrubbed from every message recorded here and
never enters the backend's `identity()`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from harness.backends.base import BackendOptions
from harness.backends.http_bounds import BODY_LIMIT, ResponseTooLarge, bounded_transport, response_limit
from harness.errors import BackendUnavailableError, Failure, FailureCategory
from harness.redact import holds_secret, mask_url, redact_text, register_secret, register_url_secrets, scrub_tree

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
_KEY_PLACEHOLDER = "EMPTY"
_RETRY_AFTER_CAP_S = 60.0
_PROBE_TIMEOUT_S = 10.0
_SNIPPET_CHARS = 200
_CONNECTIONS_PER_CLIENT = 8
_PACER_WINDOW = 16
_PACER_MAX_INTERVAL_S = 0.01

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Fault:
    """Why one attempt failed, and whether another attempt may help."""

    category: FailureCategory
    message: str
    retryable: bool
    retry_after: float | None = None


class Transport:
    """Retried, rate-limited HTTP requests to one OpenAI-compatible server (mixed into `OpenAIBackend`).

    Reads `options` at each request (a replica router lowers `max_attempts` after construction) and sets up its
    clients in `_open_transport`, which the backend's constructor calls.
    """

    model: str
    options: BackendOptions

    def _open_transport(self, *, backoff_base_s: float, backoff_cap_s: float) -> None:
        """Resolve the URL and key, and open the SDK clients (see the module docstring).

        Args:
            backoff_base_s: First backoff ceiling; attempt k waits uniform(0, min(cap, base * 2**(k-1))).
            backoff_cap_s: Largest backoff ceiling.
        """
        import openai  # ~0.7 s to import: keep it off the CLI's start-up path

        options = self.options
        given = options.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        register_url_secrets(given)
        self.base_url = normalise_base_url(given)
        """Where requests go: scheme, host, port and path (no credentials, no query)."""
        self._query = dict(parse_qsl(urlsplit(given.strip()).query, keep_blank_values=True))
        """The URL's query parameters (a key some servers take there), sent with every request."""
        self.url = mask_url(self.base_url + (f"?{urlsplit(given.strip()).query}" if self._query else ""))
        """The server's URL as it is shown and stored (identity, messages, replica counts): its query values
        masked (`harness.redact.mask_url`)."""
        self._key_env = options.api_key_env or DEFAULT_KEY_ENV
        self._key = os.environ.get(self._key_env, "")
        register_secret(self._key)
        self.http_requests = 0
        """HTTP requests sent (every attempt, probes included): the calls as the server counts them."""
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._limit = _AdaptiveLimit(options.concurrency)
        self._pacer = _Pacer()
        self._openai = openai
        # The HTTP package the installed SDK is built on (httpx for 1.x, httpx2 for 3.x), found through an SDK
        # constant rather than imported by name.
        http = sys.modules[type(openai.DEFAULT_CONNECTION_LIMITS).__module__.partition(".")[0]]
        self._response_type = http.Response
        # Several SDK clients with small keep-alive pools instead of one with a wide pool: the HTTP pool
        # checks every connection it holds on every request, and at 32 connections pools of 8 cut 10-20% of
        # the client's CPU per request (measured). A request runs on the client its concurrency slot belongs
        # to, so no pool ever waits.
        timeout = openai.Timeout(options.timeout)
        shards = math.ceil(options.concurrency / _CONNECTIONS_PER_CLIENT)
        pool = math.ceil(options.concurrency / shards)
        limits = http.Limits(max_connections=pool, max_keepalive_connections=pool)
        self._clients = [
            openai.AsyncOpenAI(
                api_key=self._key or _KEY_PLACEHOLDER,
                base_url=self.base_url,
                default_query=self._query or None,
                max_retries=0,
                timeout=timeout,
                http_client=openai.DefaultAsyncHttpxClient(
                    transport=bounded_transport(http, limits), timeout=timeout
                ),
            )
            for _ in range(shards)
        ]

    async def probe(self) -> None:
        """One quick `GET /models` (one attempt, at most 10 s).

        Raises:
            BackendUnavailableError: when the server cannot be reached or refuses the API key. Other answers
                (200, 404 from servers without `/models`, ...) pass.
        """
        openai = self._openai
        timeout = min(self.options.timeout, _PROBE_TIMEOUT_S)
        where = f"OpenAI-compatible server at {self.url}"
        try:
            await deadline(self._clients[0].models.with_raw_response.list(timeout=timeout), timeout)
        except openai.APIStatusError as err:
            if err.status_code in (401, 403):
                unset = "" if self._key else f" (${self._key_env} is not set)"
                raise BackendUnavailableError(
                    f"the {where} refused the API key from ${self._key_env}{unset} "
                    f"(HTTP {err.status_code})"
                ) from None
        except (openai.APITimeoutError, TimeoutError, asyncio.TimeoutError):
            raise BackendUnavailableError(f"cannot reach {where}: no answer within {timeout:g} s") from None
        except openai.APIConnectionError as err:
            reason = self._scrub(str(err.__cause__ or err) or type(err.__cause__ or err).__name__)
            raise BackendUnavailableError(f"cannot reach {where}: {reason}") from None

    async def close(self) -> None:
        """Close the HTTP connections."""
        for client in self._clients:
            await client.close()

    # -- one request, retried --------------------------------------------------------------------------------

    async def _post_chat(self, body: dict[str, Any]) -> tuple[dict[str, Any] | Failure, int]:
        """POST a chat completion with retries: the JSON body (or a Failure) and the attempts it took."""
        return await self._post("/chat/completions", body)

    async def _post(
        self, path: str, body: dict[str, Any] | None, *, limit: int | None = None, first: Fault | None = None
    ) -> tuple[dict[str, Any] | Failure, int]:
        """POST `body` to `path` (GET when `body` is None) with retries: the JSON answer (or a Failure) and the
        attempts it took. `path` is relative to the base URL, or absolute (`_root_url`: endpoints outside `/v1`);
        `limit`: the most bytes the answer may take (default: `response_limit(body)`); `first`: the fault of an
        attempt already made (a probe's), which counts as the first of `options.max_attempts`."""
        fault = first
        attempt = 1 if first is not None else 0
        while attempt < self.options.max_attempts and (fault is None or fault.retryable):
            attempt += 1
            if fault is not None:
                await asyncio.sleep(self._backoff(attempt - 1, fault.retry_after))
            outcome = await self._attempt(body, path=path, limit=limit)
            if not isinstance(outcome, Fault):
                return outcome, attempt
            fault = outcome
        assert fault is not None
        return self._failure(fault.category, fault.message, attempt), attempt

    async def _attempt(
        self, body: dict[str, Any] | None, *, path: str = "/chat/completions", limit: int | None = None
    ) -> dict[str, Any] | Fault:
        openai = self._openai
        slot = await self._limit.acquire()
        client = self._clients[slot % len(self._clients)]
        started = time.monotonic()
        self.http_requests += 1
        limit = BODY_LIMIT.set(response_limit(body or {}) if limit is None else limit)
        try:
            await self._pacer.wait()
            call = (client.get(path, cast_to=self._response_type) if body is None
                    else client.post(path, body=body, cast_to=self._response_type))
            response = await deadline(call, self.options.timeout)
            content = response.content
        except ResponseTooLarge as err:
            return Fault(FailureCategory.MALFORMED_RESPONSE, str(err), True)
        except openai.APIStatusError as err:
            fault = _status_fault(err.status_code, err.response)
            if err.status_code == 429:
                self._limit.on_rate_limit(started)
            return fault
        except (openai.APITimeoutError, TimeoutError, asyncio.TimeoutError):
            return Fault(FailureCategory.TIMEOUT, f"no answer within {self.options.timeout:g} s", True)
        except openai.APIConnectionError as err:
            cause = err.__cause__ or err
            if isinstance(cause, ResponseTooLarge):  # SDKs that wrap every transport error
                return Fault(FailureCategory.MALFORMED_RESPONSE, str(cause), True)
            return Fault(
                FailureCategory.CONNECTION, f"connection failed: {str(cause) or type(cause).__name__}", True
            )
        finally:
            BODY_LIMIT.reset(limit)
            self._limit.release(slot)
            self._pacer.finished()
        self._limit.on_success()
        try:
            payload = json.loads(content)
            if holds_secret(content):  # a server that echoes the key: mask it before anyone reads the answer
                payload = scrub_tree(payload)
        except ValueError:
            snippet = content[:_SNIPPET_CHARS].decode("utf-8", "replace")
            return Fault(FailureCategory.MALFORMED_RESPONSE, f"response body is not JSON: {snippet!r}", True)
        if not isinstance(payload, dict):
            return Fault(FailureCategory.MALFORMED_RESPONSE, "response body is not a JSON object", False)
        return payload

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `retry` (1-based): the server's wish, else full jitter."""
        if retry_after is not None:
            return retry_after
        return random.uniform(0.0, min(self._backoff_cap_s, self._backoff_base_s * 2 ** (retry - 1)))

    def _failure(self, category: FailureCategory, message: str, attempts: int) -> Failure:
        return Failure(category, self._scrub(message), attempts)

    def _scrub(self, text: str) -> str:
        """`text` on one line without the API key (servers sometimes echo it in error bodies) and with every URL
        in it masked (`harness.redact.redact_text`)."""
        text = " ".join(text.split())
        return redact_text(text.replace(self._key, "***") if self._key else text)


class _AdaptiveLimit:
    """Numbered concurrency slots whose number shrinks on rate limits and grows back on successes (AIMD).

    The limit is a float in [1, maximum]; `int(limit)` holders may have a slot at once, each with its own
    number in `range(maximum)`. Waiters are served in arrival order.
    """

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.limit = float(maximum)
        # A stack, so the most recently used slots (and their warm connections) are reused first.
        self._free = list(range(maximum - 1, -1, -1))
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._last_cut = -math.inf

    @property
    def in_flight(self) -> int:
        return self.maximum - len(self._free)

    async def acquire(self) -> int:
        """Wait for a free slot and return its number."""
        if self.in_flight < int(self.limit) and not self._waiters:
            return self._free.pop()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed a slot just as we were cancelled: give it back
            else:
                self._wake()  # never strand the waiters queued behind this one
            raise

    def release(self, slot: int) -> None:
        self._free.append(slot)
        self._wake()

    def on_success(self) -> None:
        if self.limit < self.maximum:
            self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)
            self._wake()

    def on_rate_limit(self, started: float) -> None:
        # Requests sent before the last cut were sent under the old limit; their 429s must not cut again.
        if started >= self._last_cut:
            self.limit = max(1.0, self.limit / 2)
            self._last_cut = time.monotonic()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < int(self.limit):
            waiter = self._waiters.popleft()
            if not waiter.done():  # cancelled waiters stay in the queue until reached
                waiter.set_result(self._free.pop())


class _Pacer:
    """Spaces request starts by the event loop's CPU time per request.

    Requests sent together come back together, and the event loop then serves the burst round-robin (the HTTP
    stack awaits many times per request), so every request of the burst waits for the CPU time of the whole
    burst, round trip after round trip. Starting requests no closer together than the loop's CPU time per
    request keeps the answers spread out. That caps the request rate at what the loop's core can process
    anyway, so it costs no throughput; on the loopback benchmark it lifted the median achieved/ideal
    throughput from 0.74 to 0.81. CPU time is measured only while requests are in flight, so work between
    batches does not count.
    """

    def __init__(self) -> None:
        self.interval = 0.0
        """Seconds between request starts; 0 until measured."""
        self._next = 0.0
        self._active = 0
        self._finished = 0
        self._mark: tuple[int, float] | None = None  # (thread id, its CPU time) at the last estimate

    async def wait(self) -> None:
        """Sleep until this request's turn to start; pair every call with `finished()`."""
        if self._active == 0:  # coming out of idle: start a fresh measurement window
            self._finished, self._mark = 0, None
        self._active += 1
        if self.interval <= 0:
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)

    def finished(self) -> None:
        """Count a finished attempt; every `_PACER_WINDOW` of them, re-estimate the interval."""
        self._active -= 1
        self._finished += 1
        if self._finished % _PACER_WINDOW:
            return
        mark = (threading.get_ident(), time.thread_time())
        if self._mark is not None and self._mark[0] == mark[0]:
            sample = min((mark[1] - self._mark[1]) / _PACER_WINDOW, _PACER_MAX_INTERVAL_S)
            self.interval = sample if self.interval == 0 else 0.75 * self.interval + 0.25 * sample
        self._mark = mark


async def deadline(awaitable: Awaitable[T], seconds: float) -> T:
    """`awaitable`'s result, or `TimeoutError` after `seconds` (httpx's timeouts are per phase, not total)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def _status_fault(status: int, response: Any) -> Fault:
    """Categorise an HTTP error status (`response` is the SDK's httpx response)."""
    try:
        detail = response.text[:_SNIPPET_CHARS]
    except Exception:  # an unread streamed body: the status says enough
        detail = ""
    message = f"HTTP {status}: {detail}".strip()
    if status in (401, 403):
        return Fault(FailureCategory.AUTH, message, False)
    if status == 429:
        return Fault(FailureCategory.RATE_LIMIT, message, True, retry_after_seconds(response.headers))
    if status == 408:
        return Fault(FailureCategory.TIMEOUT, message, True, retry_after_seconds(response.headers))
    if status >= 500:
        return Fault(FailureCategory.SERVER_ERROR, message, True, retry_after_seconds(response.headers))
    return Fault(FailureCategory.BAD_REQUEST, message, False)


def retry_after_seconds(headers: Any) -> float | None:
    """The wait a response asks for (`retry-after-ms`, or `Retry-After` in seconds or as an HTTP date).

    Capped at 60 s; None when the response names none.
    """
    value = headers.get("retry-after-ms")
    try:
        if value is not None:
            return min(max(float(value) / 1000, 0.0), _RETRY_AFTER_CAP_S)
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _RETRY_AFTER_CAP_S)


def normalise_base_url(url: str) -> str:
    """`url` with lower-case scheme and host, no user:password part, no query (the backend sends its parameters
    with each request) and no trailing slash."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    netloc = f"{host}:{parts.port}" if parts.port else host
    if ":" in host:  # IPv6 literal
        netloc = f"[{host}]:{parts.port}" if parts.port else f"[{host}]"
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), "", ""))
