"""A minimal OpenAI-compatible HTTP/1.1 server on 127.0.0.1, for the API benchmark and backend tests.

It speaks just enough HTTP/1.1 for the OpenAI SDK: keep-alive connections, bodies framed by `Content-Length`
(chunked request bodies are refused). What it answers is up to a *handler*: an async function of the parsed
`HttpRequest` that returns an `HttpResponse` or `DROP` (close the connection without replying). A handler
that should hang simply sleeps. `openai_handler` is the stock one: a fixed chat completion after a
configurable latency on `POST /v1/chat/completions`, a one-model list on `GET /v1/models`. Tests write their
own handlers (fault injection) and reuse the HTTP machinery.

Three ways to run it:
    `serve(handler)`                      inside a running event loop (returns a `LoopbackServer`)
    `serve_in_thread(handler)`            a context manager yielding the base URL; the server has its own
                                          event loop in a daemon thread
    `start_loopback_server(latency_ms=)`  a context manager running `python -m harness.loopback` in a
                                          separate process, so client and server do not share one CPU core
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

HOST = "127.0.0.1"
_MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One parsed HTTP request."""

    method: str
    """Upper-case method, e.g. `POST`."""
    path: str
    """Request target without the query string, e.g. `/v1/chat/completions`."""
    headers: dict[str, str]
    """Header names lower-cased (a repeated header keeps its last value)."""
    body: bytes
    """The raw body (empty without `Content-Length`)."""

    def json(self) -> Any:
        """The body parsed as JSON (raises `ValueError` when it is not JSON)."""
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What to send back."""

    status: int = 200
    """HTTP status code."""
    body: bytes = b""
    """Raw body; `Content-Length` is set from it."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra headers, e.g. `(("Retry-After", "1"),)`."""
    content_type: str = "application/json"
    """The `Content-Type` header."""


class Action(enum.Enum):
    """What a handler may return instead of a response."""

    DROP = "drop"
    """Close the connection without sending anything (the client sees a disconnect)."""


DROP = Action.DROP

Handler = Callable[[HttpRequest], Awaitable["HttpResponse | Action"]]
"""An async function of the request that returns the response, or an `Action`."""


def json_response(obj: Any, *, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    """A JSON response with `obj` as its body."""
    return HttpResponse(status=status, body=json.dumps(obj).encode(), headers=headers)


def chat_completion(
    texts: list[str], *, model: str = "loopback", logprobs: list[dict[str, Any] | None] | None = None
) -> dict[str, Any]:
    """An OpenAI chat-completion body with one choice per text (and optional per-choice `logprobs`)."""
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs[i] if logprobs else None,
            "finish_reason": "stop",
        }
        for i, text in enumerate(texts)
    ]
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": 1, "completion_tokens": len(texts), "total_tokens": 1 + len(texts)},
    }


def models_list(model: str = "loopback") -> dict[str, Any]:
    """An OpenAI model-list body naming one model."""
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 0, "owned_by": "loopback"}],
    }


def openai_handler(*, latency_s: float = 0.0, text: str = "ok") -> Handler:
    """The stock handler: `text` as every choice of every chat completion, after `latency_s` seconds."""

    async def handle(request: HttpRequest) -> HttpResponse:
        if request.method == "GET" and request.path.endswith("/models"):
            return json_response(models_list())
        if request.method != "POST" or not request.path.endswith("/chat/completions"):
            return json_response({"error": {"message": f"no route {request.path}"}}, status=404)
        try:
            payload = request.json()
            n = int(payload.get("n") or 1)
            model = str(payload.get("model", "loopback"))
        except (ValueError, TypeError, AttributeError):
            return json_response({"error": {"message": "body is not a JSON object"}}, status=400)
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        return json_response(chat_completion([text] * n, model=model))

    return handle


class LoopbackServer:
    """A listening server and the connections it serves; close it to drop them all."""

    def __init__(self, server: asyncio.base_events.Server, connections: set[asyncio.Task]) -> None:
        self._server = server
        self._connections = connections
        self.port: int = server.sockets[0].getsockname()[1]
        """The TCP port it listens on."""
        self.base_url = f"http://{HOST}:{self.port}/v1"
        """What an OpenAI client takes as `base_url`."""

    async def close(self) -> None:
        """Stop listening and cancel every open connection (including handlers that hang on purpose)."""
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()


async def serve(handler: Handler, *, port: int = 0) -> LoopbackServer:
    """Start serving `handler` on 127.0.0.1 in the running event loop (`port=0` picks a free port)."""
    connections: set[asyncio.Task] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await _serve_connection(handler, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away mid-request or sent garbage: nothing sensible to answer
        except asyncio.CancelledError:
            # The server is closing. Ending normally instead of as "cancelled" keeps asyncio's stream callback
            # from logging a traceback per open connection.
            pass
        finally:
            connections.discard(task)
            writer.close()

    server = await asyncio.start_server(on_connect, HOST, port, limit=_MAX_HEADER_BYTES, backlog=1024)
    return LoopbackServer(server, connections)


async def _serve_connection(
    handler: Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answer requests on one keep-alive connection until the client closes it."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return  # clean close between requests
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _version = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            writer.write(
                _encode(HttpResponse(status=411, body=b'{"error": "send Content-Length"}'), close=True)
            )
            await writer.drain()
            return
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        request = HttpRequest(method.upper(), target.split("?", 1)[0], headers, body)
        try:
            result = await handler(request)
        except Exception as exc:  # a broken handler must show up as a 500, not a hung client
            result = json_response({"error": {"message": f"handler failed: {exc!r}"}}, status=500)
        if result is Action.DROP:
            writer.transport.abort()  # no FIN handshake, no reply: what a crashed upstream looks like
            return
        close = headers.get("connection", "").lower() == "close"
        writer.write(_encode(result, close=close))
        await writer.drain()
        if close:
            return


def _encode(response: HttpResponse, *, close: bool) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Status"
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        f"Connection: {'close' if close else 'keep-alive'}",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


@contextlib.contextmanager
def serve_in_thread(handler: Handler) -> Iterator[str]:
    """Run a server for `handler` on its own event loop in a daemon thread; yields its base URL.

    The handler runs on the server's loop, not the caller's, so it may keep state across requests (guard it
    with a lock if the caller reads it while requests are in flight).
    """
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def run() -> None:
        server = await serve(handler)
        stop = asyncio.Event()
        state.update(server=server, loop=asyncio.get_running_loop(), stop=stop)
        ready.set()
        await stop.wait()
        await server.close()

    def target() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # surface start-up failures to the caller instead of hanging it
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=target, name="loopback-server", daemon=True)
    thread.start()
    ready.wait()
    if "error" in state:
        raise RuntimeError(f"loopback server failed to start: {state['error']!r}")
    try:
        yield state["server"].base_url
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(timeout=10)


@contextlib.contextmanager
def start_loopback_server(*, latency_ms: float, text: str = "ok") -> Iterator[str]:
    """Run the stock server in a separate Python process; yields its base URL.

    A separate process keeps the server's CPU work off the client's core, which is what a benchmark of the
    client needs.
    """
    command = [sys.executable, "-m", "harness.loopback", "--port", "0", "--latency-ms", str(latency_ms)]
    command += ["--text", text]
    # stderr goes to a file, not a pipe: a pipe nobody reads would block a chatty server once it fills up.
    with tempfile.TemporaryFile(mode="w+") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if not line.startswith("http://"):
                process.kill()
                process.wait(timeout=10)
                errors.seek(0)
                raise RuntimeError(
                    f"loopback server did not start: {(line + ' ' + errors.read()).strip()[-500:]}"
                )
            yield line
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.loopback`: serve the stock handler; prints the base URL as the first stdout line."""
    parser = argparse.ArgumentParser(prog="python -m harness.loopback", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before each chat completion")
    parser.add_argument("--text", default="ok", help="the text of every completion")
    args = parser.parse_args(argv)

    async def run() -> None:
        server = await serve(openai_handler(latency_s=args.latency_ms / 1000, text=args.text), port=args.port)
        print(server.base_url, flush=True)
        await asyncio.Event().wait()  # serve until terminated

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
