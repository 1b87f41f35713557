"""One model behind several servers: requests of one set meet one replica, a replica that dies mid-run loses
nothing (its requests move to the others, counted), a replica that hangs is held down longer each time while its
sets go elsewhere, and replicas share one identity, so the call cache answers whichever replica served a
request."""

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


# -- a replica that hangs: held down, longer each time, its sets elsewhere ------------------------------------------


class Clock:
    """The router's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A replica whose sets the test answers: each set waits until the test lets it end, as an answer or as the
    timeout a hanging server gives."""

    def __init__(self, url: str, *, answers: bool) -> None:
        from harness.backends.base import BackendOptions

        self.url = self.base_url = url
        self.options = BackendOptions(max_attempts=4)
        self.http_requests = 0
        self.answers = answers
        self.sets: list[str] = []
        self.waiting: list[asyncio.Event] = []
        self.arrived = asyncio.Event()

    def capabilities(self) -> dict[str, str]:
        return {}

    async def probe(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def generate(self, requests):
        from harness.backends.base import Completion
        from harness.errors import Failure, FailureCategory

        self.sets.append(requests[0].messages[-1].content)
        self.arrived.set()
        if self.answers:
            return [Completion(("Verdict: [[A]]",)) for _ in requests]
        release = asyncio.Event()
        self.waiting.append(release)
        await release.wait()
        return [Completion((), error=Failure(FailureCategory.TIMEOUT, "no answer within 120 s")) for _ in requests]

    def time_out(self) -> None:
        """Every set waiting on this replica gets its timeout now."""
        for release in self.waiting:
            release.set()
        self.waiting.clear()


def _set(name: str):
    from harness.backends.base import GenerateRequest, SamplingParams, user_chat

    return [GenerateRequest(user_chat(name), SamplingParams(max_tokens=8))]


def test_a_replica_that_times_out_is_held_down_longer_each_time_and_its_sets_go_elsewhere(caplog):
    from harness.backends.replicas import HOLD_S, ReplicaBackend

    clock = Clock()
    hung_url = "http://127.0.0.1:9/v1?api_key=sk-HIDDEN-0123456789"

    async def scenario() -> None:
        healthy, hung = Scripted("http://127.0.0.1:8/v1", answers=True), Scripted(hung_url, answers=False)
        router = ReplicaBackend("judge", [healthy, hung], clock=clock)
        masked = "http://127.0.0.1:9/v1?api_key=***"

        async def sets(*names: str):
            return await asyncio.gather(*(router.generate(_set(n)) for n in names))

        # Two sets at once: one meets each replica; the hung one's times out and moves to the healthy one.
        first = asyncio.ensure_future(sets("s1", "s2"))
        await hung.arrived.wait()
        clock.now += 120
        hung.time_out()
        assert all(c.ok for found in await first for c in found)
        assert len(hung.sets) == 1 and len(healthy.sets) == 2
        assert router.held() == {masked: HOLD_S} and router.failovers == 1

        # While it is held down, no set goes to it.
        clock.now += HOLD_S - 1
        await sets(*(f"held{i}" for i in range(6)))
        assert len(hung.sets) == 1

        # The hold is over: one set tries it; the sets sent meanwhile go elsewhere.
        clock.now += 2
        hung.arrived.clear()
        trial = asyncio.ensure_future(sets("trial"))
        await hung.arrived.wait()
        await sets(*(f"meanwhile{i}" for i in range(4)))
        assert hung.sets[1:] == ["trial"] and not any(n.startswith("meanwhile") for n in hung.sets)
        clock.now += 120
        hung.time_out()
        assert all(c.ok for found in await trial for c in found)
        assert router.held() == {masked: 2 * HOLD_S}  # the failed trial doubled the hold

        # Not before the doubled hold is over; then a trial that is answered brings it back up.
        clock.now += 2 * HOLD_S - 1
        await sets(*(f"held-again{i}" for i in range(4)))
        assert len(hung.sets) == 2
        clock.now += 2
        hung.answers = True
        await sets("back")
        assert hung.sets[-1] == "back" and router.held() == {}
        await sets("a", "b")
        assert len(hung.sets) == 4  # up again: of two sets at once, one goes to it
        lines = [r.getMessage() for r in caplog.records if r.name == "harness.backends.replicas"
                 and r.levelname == "WARNING"]
        assert lines == [
            f"judge: replica {masked} is down (timeout: no answer within 120 s); its requests go to the other "
            "replicas, and it is tried again in 30 s",
            f"judge: replica {masked} is back up; requests go to it again",
        ]

    asyncio.run(scenario())


def test_a_replica_that_never_answers_gets_no_set_and_no_capability_probe():
    """A server that accepts connections and never answers: the run's probe finds it out (its own timeout),
    and every set, capability probes included, goes to the healthy replica."""
    from harness.backends.base import BackendOptions, GenerateRequest, SamplingParams, user_chat
    from harness.backends.openai_backend import OpenAIBackend
    from harness.backends.replicas import HOLD_S, ReplicaBackend
    from judges.verify import VERDICT_CHOICE

    class Silent:
        def __init__(self) -> None:
            self.requests: list[str] = []

        async def __call__(self, request):
            self.requests.append(request.path)
            await asyncio.Event().wait()  # never answers

    healthy, silent = Judge(), Silent()
    with serve_in_thread(healthy) as url_a, serve_in_thread(silent) as url_b:
        async def run():
            router = ReplicaBackend("judge", [OpenAIBackend("judge", BackendOptions(base_url=url_a, timeout=600)),
                                              OpenAIBackend("judge", BackendOptions(base_url=url_b, timeout=1))])
            try:
                await router.probe()
                held = router.held()
                params = SamplingParams(max_tokens=8, n=2, constraint=VERDICT_CHOICE)
                found = await asyncio.gather(*(
                    router.generate([GenerateRequest(user_chat(f"set {s} response {r}"), params) for r in range(2)])
                    for s in range(10)))
                return held, found, router.stats()
            finally:
                await router.close()

        held, found, stats = asyncio.run(run())
    assert held == {url_b: HOLD_S}
    assert all(c.ok for completions in found for c in completions)
    assert silent.requests == ["/v1/models"]  # the run's probe only: no set, no capability probe
    assert stats["requests"] == {url_a: 20, url_b: 0} and stats["failovers"] == 0
