"""A hostile OpenAI-compatible server, as a user meets it through the CLI: answers far larger than asked for, an
API key echoed back in answers, probes and errors, and a key variable the user named but did not set."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.loopback import HttpResponse, chat_completion, json_response, serve_in_thread

KEY = "sk-test-DISTINCTIVE-secret-5150"


def harness(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=3600, env={**os.environ, **env})


def prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


class Hostile:
    """Answers every chat request with `answer(request)`; counts the chat requests."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests = 0
        self._lock = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        with self._lock:
            self.requests += 1
        return self.answer(request)


def test_an_answer_larger_than_asked_for_is_a_recorded_malformed_response(tmp_path: Path):
    """30 MB for `max_tokens: 8`: refused from its declared length, recorded, and nothing stores it."""
    huge = "x" * (30 * 1024 * 1024)
    server = Hostile(lambda request: json_response(chat_completion([huge])))
    out = tmp_path / "out.jsonl"
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    with serve_in_thread(server) as url:
        done = harness("generate", "--model", "openai:m", "--base-url", url, "--prompts",
                       str(prompts(tmp_path / "p.jsonl", 3)), "--out", str(out), "--max-tokens", "8",
                       "--max-attempts", "2", env=env)
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and server.requests == 6  # every attempt refused, none kept
    assert {r["error"]["category"] for r in records} == {"malformed_response"}
    assert "more than the request" in records[0]["error"]["message"] or "over the" in records[0]["error"]["message"]
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 1024 * 1024


def test_a_body_that_grows_past_its_limit_is_cut_off_while_read():
    """No declared length (a streamed body): reading stops at the request's limit."""
    import openai

    from harness.backends import http_bounds as hb

    http = sys.modules[type(openai.DEFAULT_CONNECTION_LIMITS).__module__.partition(".")[0]]
    sent: list[int] = []

    async def chunks():
        for _ in range(1000):  # 64 MB if read to the end
            sent.append(1)
            yield b"x" * 65536

    inner = http.MockTransport(lambda request: http.Response(200, content=chunks()))
    body = {"max_tokens": 8, "messages": []}
    limit = hb.response_limit(body)
    assert limit == hb.BODY_BASE_BYTES + 8 * hb.BODY_BYTES_PER_TOKEN

    async def fetch():
        async with http.AsyncClient(transport=hb.bounded_transport(http, None, inner=inner)) as client:
            token = hb.BODY_LIMIT.set(limit)
            try:
                await client.post("http://test/v1/chat/completions", json=body)
            finally:
                hb.BODY_LIMIT.reset(token)

    with pytest.raises(hb.ResponseTooLarge, match="more than the request asked for"):
        asyncio.run(fetch())
    assert len(sent) <= limit // 65536 + 2
    logprobs = hb.response_limit({"max_tokens": 1, "logprobs": True, "top_logprobs": 20, "n": 2})
    assert logprobs == hb.BODY_BASE_BYTES + 2 * (hb.BODY_BYTES_PER_TOKEN + 21 * hb.BODY_BYTES_PER_ALTERNATIVE)
    assert hb.response_limit({"max_tokens": 10**9}) == hb.BODY_CAP_BYTES


def _echo_key(request) -> HttpResponse:
    """Every answer, probe answer and error carries the request's Authorization header; a field it does not take
    is refused with a 400 that names it."""
    key = request.headers.get("authorization", "").removeprefix("Bearer ")
    body = request.json()
    for field in ("n", "min_tokens", "response_format"):
        if body.get(field, 1) != 1:
            message = f"unsupported field {field} for key {key}"
            return HttpResponse(400, json.dumps({"error": {"message": message}}).encode())
    raw = json.dumps(chat_completion([f"[[A]] Your key is {key}; again: KEY_ESCAPED"]))
    # The second copy behind a JSON escape, as a server may write it: no byte match finds it in the body.
    return HttpResponse(200, raw.replace("KEY_ESCAPED", f"\\u{ord(key[0]):04x}{key[1:]}").encode())


def test_an_api_key_a_server_echoes_reaches_no_file_no_cache_and_no_output(tmp_path: Path, shared_data: Path):
    server = Hostile(_echo_key)
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite"), "HARNESS_TEST_KEY": KEY}
    with serve_in_thread(server) as url:
        runs = [
            harness("generate", "--model", "openai:m", "--base-url", url, "--api-key-env", "HARNESS_TEST_KEY",
                    "--prompts", str(prompts(tmp_path / "p.jsonl", 2)), "--out", str(tmp_path / "g.jsonl"), env=env),
            harness("eval", "-e", "dynamic-rubric:generator=openai:m,mode=batched", "-b", "ultrafeedback",
                    "--limit", "1", "--seeds", "1", "--data-dir", str(shared_data), "--base-url", url,
                    "--api-key-env", "HARNESS_TEST_KEY", "--max-attempts", "1", "--out", str(tmp_path / "ev"),
                    env=env),
        ]
    assert server.requests > 3
    for done in runs:
        assert done.returncode in (0, 1), done.stderr
        assert KEY not in done.stdout + done.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "calls.sqlite" for p in written) and any(p.name == "records.jsonl" for p in written)
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    answers = (tmp_path / "g.jsonl").read_text()
    assert "Your key is ***" in answers  # the answer is kept, the key masked


def test_a_named_key_variable_that_is_unset_stops_before_any_call(tmp_path: Path, shared_data: Path):
    server = Hostile(lambda request: json_response(chat_completion(["hello"])))
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    os.environ.pop("NOPE_KEY", None)
    with serve_in_thread(server) as url:
        done = harness("generate", "--model", "openai:m", "--base-url", url, "--api-key-env", "NOPE_KEY",
                       "--prompts", str(prompts(tmp_path / "p.jsonl", 2)), "--out", str(tmp_path / "g.jsonl"),
                       env=env)
        assert done.returncode == 2
        assert done.stderr.strip() == ("error: openai:m: the API key variable $NOPE_KEY is not set (named by "
                                       "api_key_env or --api-key-env); export it, or leave the option out for a "
                                       "server that needs no key")
        config = tmp_path / "t2.yaml"
        config.write_text("only_rows: ['Native Qwen3-8B']\nrows: {'Native Qwen3-8B': 'openai:policy'}\n"
                          f"benchmarks: [alpaca_eval2]\nbackend: {{base_url: '{url}'}}\n")
        table = harness("run", "table2", "--config", str(config), "--judge", "openai:judge", "--judge-base-url",
                        url, "--judge-api-key-env", "NOPE_KEY", "--limit", "1", "--data-dir", str(shared_data), "--out",
                        str(tmp_path / "t2"),
                        env=env)
        assert table.returncode == 2 and "the API key variable $NOPE_KEY is not set" in table.stderr, table.stderr
    assert server.requests == 0


def test_a_full_disk_under_a_figure_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A write error of an open file carries no path (`OSError(28)` from write or flush): the figure says which."""
    pytest.importorskip("matplotlib")
    import errno

    from matplotlib.figure import Figure

    from harness.errors import HarnessError
    from reports.figure import render_figure
    from reports.tables import FIG3_SPEC

    def full(self, path, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full)
    with pytest.raises(HarnessError, match=f"cannot write {tmp_path / 'figure.png'}: No space left on device"):
        render_figure(FIG3_SPEC, {}, tmp_path)
