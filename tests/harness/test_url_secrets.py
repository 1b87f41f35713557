"""A key in a server URL is shown and stored nowhere: a URL's query values and `user:password@` part are masked
wherever a URL is shown or stored (replica counts, identity, messages, manifest), the query still reaches the
server as parameters, and a real `harness eval` over replicas whose URLs, key variable, answers and error bodies
all carry planted keys writes none of them to any file or output."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from harness.backends.base import BackendOptions, GenerateRequest, SamplingParams, user_chat
from harness.loopback import chat_completion, json_response, serve_in_thread

QUERY_KEY = "sk-QUERY-planted-7f3a9c1e55d0"
USER_KEY = "sk-USERINFO-planted-2b8d4e6f1177"
ENV_KEY = "sk-ENV-planted-9c0d1e2f3a4455"
PLANTED = (QUERY_KEY, USER_KEY, ENV_KEY)


def test_mask_url_masks_credentials_and_every_query_value():
    from harness.redact import mask_url, redact, redact_text

    assert mask_url(f"http://127.0.0.1:18001/v1?api_key={QUERY_KEY}") == "http://127.0.0.1:18001/v1?api_key=***"
    assert mask_url(f"http://user:{USER_KEY}@host:8000/v1") == "http://***@host:8000/v1"
    assert mask_url("https://h/v1?api-version=2024-06-01&k=abc#access_token=x") == (
        "https://h/v1?api-version=***&k=***#access_token=***")
    assert mask_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"  # a plain URL is unchanged
    text = f"got ['http://h/v1?sig={QUERY_KEY}', 'http://u:{USER_KEY}@h2/v1'], see http://h/v1?x=1."
    assert redact_text(text) == "got ['http://h/v1?sig=***', 'http://***@h2/v1'], see http://h/v1?x=***."
    # A URL as a mapping key (requests per replica) is masked like any value.
    masked = redact({"requests": {f"http://h/v1?api_key={QUERY_KEY}": 3}})
    assert masked == {"requests": {"http://h/v1?api_key=***": 3}}


def test_the_query_of_a_server_url_goes_with_every_request_and_is_masked_where_shown():
    """The SDK would glue the path onto the query (`/v1/?api_key=...chat/completions`); the backend sends the
    query as parameters of each request instead, and shows the URL masked."""
    from harness.backends.openai_backend import OpenAIBackend

    targets: list[str] = []

    async def serve_and_ask() -> tuple[list, OpenAIBackend]:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                           if line.lower().startswith("content-length:")), 0)
            await reader.readexactly(length)
            targets.append(head.split(" ", 2)[1])
            body = json.dumps(chat_completion(["ok"])).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        backend = OpenAIBackend("m", BackendOptions(base_url=f"http://127.0.0.1:{port}/v1?api_key={QUERY_KEY}",
                                                    max_attempts=1))
        try:
            return await backend.generate([GenerateRequest(user_chat("hi"), SamplingParams(max_tokens=4))]), backend
        finally:
            await backend.close()
            server.close()

    (answer,), backend = asyncio.run(serve_and_ask())
    assert answer.ok, answer.error
    assert targets == [f"/v1/chat/completions?api_key={QUERY_KEY}"]
    assert backend.url.endswith("/v1?api_key=***") and QUERY_KEY not in json.dumps(backend.identity())
    assert QUERY_KEY not in backend._server_label()


class Leaky:
    """A judge that leaks every key it might know: each answer echoes the Authorization header (the key
    variable's value) and the URL's secrets; the requests of one prompt in four, and every second request of
    the query-key replica, fail with a 500 whose body carries them all."""

    def __init__(self, *, flaky: bool) -> None:
        self.flaky = flaky
        self.requests = 0

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": [{"id": "judge", "note": f"key {QUERY_KEY}"}]})
        self.requests += 1
        text = request.json()["messages"][-1]["content"]
        leak = f"you sent {request.headers.get('authorization')} with api_key={QUERY_KEY} as user:{USER_KEY}"
        digest = hashlib.sha256(text.encode()).digest()[0]
        if digest % 4 == 0 or (self.flaky and self.requests % 2 == 0):
            return json_response({"error": {"message": leak}}, status=500)
        verdict = "[[A]]" if digest % 3 else "[[B]]"
        return json_response(chat_completion([f"({leak}) Verdict: {verdict}"]))


def test_a_run_over_replicas_with_planted_keys_writes_no_key_anywhere(tmp_path: Path, shared_data: Path):
    given, written = tmp_path / "given", tmp_path / "written"
    given.mkdir()
    with serve_in_thread(Leaky(flaky=False)) as url_a, serve_in_thread(Leaky(flaky=True)) as url_b:
        user_url = url_a.replace("http://", f"http://user:{USER_KEY}@")
        query_url = f"{url_b}?api_key={QUERY_KEY}"
        endpoints = given / "endpoints.yaml"
        endpoints.write_text(json.dumps({"models": {"vllm:judge": {
            "base_url": [user_url, query_url], "served": "judge", "api_key_env": "HARNESS_LEAK_KEY"}}}))
        done = subprocess.run(
            [sys.executable, "-m", "harness", "eval", "-e", "pairwise-judge:model=vllm:judge", "-b",
             "ultrafeedback", "--limit", "8", "--data-dir", str(shared_data), "--endpoints", str(endpoints),
             "--out", str(written / "run"), "--max-attempts", "2"],
            capture_output=True, text=True, timeout=3600,
            env={**os.environ, "HARNESS_CALL_CACHE": str(written / "cache" / "calls.sqlite"),
                 "HARNESS_LEAK_KEY": ENV_KEY})
    assert done.returncode == 1, done.stderr[-3000:]  # the prompts a server always fails are recorded failures
    files = [p for p in written.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"records.jsonl", "manifest.json", "calls.sqlite"} <= names, names
    for key in PLANTED:
        assert key not in done.stdout and key not in done.stderr, key
        for path in files:
            assert key.encode() not in path.read_bytes(), (key, path)
    # What the run shows and stores is there, masked.
    masked_b = f"{url_b}?api_key=***"
    manifest = json.loads((written / "run" / "manifest.json").read_text())
    requests = manifest["summary"]["replicas"]["vllm:judge"]["requests"]
    assert set(requests) == {url_a, masked_b} and all(n > 0 for n in requests.values())
    assert f"  vllm:judge: {url_a} " in done.stdout and f"{masked_b} " in done.stdout
    assert f"replica {masked_b} is down (server_error: HTTP 500" in done.stderr
    records = (written / "run" / "records.jsonl").read_text()
    assert "you sent Bearer ***" in records and "api_key=***" in records  # answers and error bodies, masked
