"""Response bodies bounded by what their request asked for: the transport the `openai` backend reads through.

A server that sends more than a request could produce (an echo of a huge input, a runaway generation, an attack)
must cost neither memory nor disk. `response_limit` is the most a well-formed answer to a chat request can take;
`bounded_transport` wraps the SDK's HTTP transport and stops reading a body past the limit of the request in
flight (`BODY_LIMIT`, a context variable set around each request), raising `ResponseTooLarge`.
"""

from __future__ import annotations

import contextvars
from typing import Any

BODY_BASE_BYTES = 64 * 1024
"""What a response body may hold besides its completions (ids, usage, headers' worth of JSON)."""
BODY_BYTES_PER_TOKEN = 64
"""Bytes one completion token may take in a response body: generous for JSON-escaped multi-byte text."""
BODY_BYTES_PER_ALTERNATIVE = 192
"""Bytes one `top_logprobs` entry may take (its token, logprob and byte list)."""
BODY_CAP_BYTES = 32 * 1024 * 1024
"""No response body is read past this, whatever was asked."""
BODY_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("harness_body_limit", default=BODY_CAP_BYTES)
"""The limit of the request in flight (set around each request; the cap outside one)."""


class ResponseTooLarge(Exception):
    """A response body longer than its request could have asked for (`response_limit`)."""


def response_limit(body: dict[str, Any]) -> int:
    """The most bytes a well-formed answer to the chat request `body` can take: `max_tokens` per choice at
    `BODY_BYTES_PER_TOKEN` (plus its `top_logprobs` entries), over a fixed allowance, never above
    `BODY_CAP_BYTES`. A server that sends more is not answering the request (an echo, a runaway, an attack)."""
    tokens = body.get("max_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        return BODY_CAP_BYTES
    per_token = BODY_BYTES_PER_TOKEN
    if body.get("logprobs"):
        per_token += (int(body.get("top_logprobs") or 0) + 1) * BODY_BYTES_PER_ALTERNATIVE
    return min(BODY_CAP_BYTES, BODY_BASE_BYTES + max(1, int(body.get("n") or 1)) * tokens * per_token)


def bounded_transport(http: Any, limits: Any, *, inner: Any = None) -> Any:
    """An async transport of the SDK's HTTP package that stops reading a response body past the current
    request's limit (`BODY_LIMIT`, set around each request) and raises `ResponseTooLarge`: a declared
    `Content-Length` over it is refused before the body is read, a body that grows past it is cut off there, so
    an oversize answer costs at most the limit in memory. `inner`: the transport it wraps (default: the package's
    own, with `limits`)."""

    class BoundedBody(http.AsyncByteStream):
        def __init__(self, stream: Any, limit: int) -> None:
            self._stream, self._limit = stream, limit

        async def __aiter__(self) -> Any:
            seen = 0
            async for part in self._stream:
                seen += len(part)
                if seen > self._limit:
                    raise ResponseTooLarge(f"response body over {self._limit:,} bytes, more than the request "
                                           "asked for (max_tokens)")
                yield part

        async def aclose(self) -> None:
            await self._stream.aclose()

    class BoundedTransport(http.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = inner if inner is not None else http.AsyncHTTPTransport(limits=limits)

        async def handle_async_request(self, request: Any) -> Any:
            limit = BODY_LIMIT.get()
            response = await self._inner.handle_async_request(request)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                await response.aclose()
                raise ResponseTooLarge(f"response body of {int(declared):,} bytes declared, over the {limit:,} "
                                       "the request could take (max_tokens)")
            return http.Response(response.status_code, headers=response.headers,
                                 stream=BoundedBody(response.stream, limit), extensions=response.extensions)

        async def aclose(self) -> None:
            await self._inner.aclose()

    return BoundedTransport()
