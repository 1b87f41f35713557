"""One model behind several servers: requests of one set meet one replica, a replica that dies mid-run loses
nothing (its requests move to the others, counted), and replicas share one identity, so the call cache answers
whichever replica served a request."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

from harness.loopback import DROP, chat_completion, json_response, serve_in_thread


class Judge:
    """A loopback pairwise judge (a verdict from a hash of the request) that counts its requests and, after
    `alive` of them, drops every connection (a server that died)."""

    def __init__(self, alive: int | None = None) -> None:
        self.alive = alive
        self.requests = 0
        self._lock = threading.Lock()

    async def __call__(self, request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        with self._lock:
            self.requests += 1
            dead = self.alive is not None and self.requests > self.alive
        if dead:
            return DROP
        text = request.json()["messages"][-1]["content"]
        verdict = "[[A]]" if hashlib.sha256(text.encode()).digest()[0] % 3 else "[[B]]"
        return json_response(chat_completion([f"Verdict: {verdict}"]))


def test_a_set_goes_to_one_replica_and_sets_spread_over_them():
    """One call (an evaluator sends a response set's requests together) meets one replica's prefix cache; calls in
    flight at once spread to the least-loaded replica."""
    from harness.backends.base import BackendOptions, GenerateRequest, SamplingParams, user_chat
    from harness.endpoints import Endpoint, served_backend

    a, b = Judge(), Judge()
    with serve_in_thread(a) as url_a, serve_in_thread(b) as url_b:
        async def sets(n: int, size: int):
            router = served_backend("vllm:judge", Endpoint((url_a, url_b), identity={"weights": "w1"}),
                                    BackendOptions(max_attempts=2))
            calls = [router.generate([GenerateRequest(user_chat(f"set {s} response {r}"), SamplingParams(max_tokens=8))
                                      for r in range(size)]) for s in range(n)]
            found = await asyncio.gather(*calls)
            await router.close()
            return router, found

        _, (one_set,) = asyncio.run(sets(1, 6))
        assert all(c.ok for c in one_set)
        assert sorted((a.requests, b.requests)) == [0, 6]  # one set, one replica
        a.requests = b.requests = 0
        router, many = asyncio.run(sets(8, 3))
    assert all(c.ok for found in many for c in found)
    assert a.requests == b.requests == 12  # eight sets in flight at once: four to each
    assert router.identity() == {"kind": "openai", "model": "judge", "weights": "w1"}
    plain = served_backend("vllm:judge", Endpoint((url_b, url_a)), BackendOptions())
    assert plain.identity() == {"kind": "openai", "model": "judge", "servers": " ".join(sorted((url_a, url_b)))}


def _eval(tmp_path: Path, endpoints: Path, out: Path, data: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "eval", "-e", "pairwise-judge:model=vllm:judge", "-b", "ultrafeedback",
         "--limit", "12", "--data-dir", str(data), "--endpoints", str(endpoints), "--out", str(out),
         "--max-attempts", "3"],
        capture_output=True, text=True, timeout=3600, env={**__import__("os").environ,
                                                           "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")})


def test_a_replica_that_dies_mid_run_loses_nothing_and_the_cache_is_shared(tmp_path: Path, shared_data: Path):
    survivor, dying = Judge(), Judge(alive=5)
    with serve_in_thread(survivor) as url_a, serve_in_thread(dying) as url_b:
        endpoints = tmp_path / "endpoints.yaml"
        endpoints.write_text(json.dumps({"models": {"vllm:judge": {
            "base_url": [url_a, url_b], "served": "judge", "identity": {"weights": "judge-w1"}}}}))
        done = _eval(tmp_path, endpoints, tmp_path / "run", shared_data)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 12 and len({r["item"] for r in records}) == 12  # every set, once
    assert all(not r["trace"].get("failures") for r in records)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    stats = manifest["summary"]["replicas"]["vllm:judge"]
    assert stats["failovers"] >= 1 and dying.requests > 5, (stats, dying.requests, survivor.requests)
    assert "moved to another replica" in done.stdout
    # The same weights served elsewhere (one other server): one identity, so the cache answers everything.
    other = Judge()
    with serve_in_thread(other) as url_c:
        endpoints.write_text(json.dumps({"models": {"vllm:judge": {
            "base_url": [url_c], "served": "judge", "identity": {"weights": "judge-w1"}}}}))
        again = _eval(tmp_path, endpoints, tmp_path / "run2", shared_data)
    assert again.returncode == 0, again.stderr[-3000:]
    assert other.requests == 0 and "backend calls: 0" in again.stdout
