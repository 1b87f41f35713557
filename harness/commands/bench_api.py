"""`harness bench api`: how close the `openai` backend gets to the throughput a server allows.

A loopback OpenAI-compatible server (`harness.loopback`, in its own process so it does not compete for the
client's core) answers every chat completion after a fixed latency. With `concurrency` requests in flight the
best possible schedule finishes `requests` in `ceil(requests / concurrency)` latencies; the ratio of achieved
to that ideal throughput measures the client's own overhead (SDK, HTTP stack, JSON, event loop). Requests go
straight to `OpenAIBackend` (no call cache), one attempt each, so a failure shows up in the count instead of
being retried away.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from harness.backends.base import BackendOptions, GenerateRequest, SamplingParams, user_chat
from harness.errors import ConfigError

_WARM_UP_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class BenchApiResult:
    """One measurement of the `openai` backend against the loopback server."""

    requests: int
    """Chat completions measured (after the warm-up)."""
    concurrency: int
    """Requests in flight at most."""
    latency_ms: float
    """The server's delay before each answer."""
    wall_s: float
    """Seconds from the first request to the last answer."""
    achieved_rps: float
    """requests / wall_s."""
    ideal_rps: float
    """requests / (ceil(requests / concurrency) * latency): concurrency / latency when it divides evenly."""
    ratio: float
    """achieved_rps / ideal_rps (1.0 would be a client with zero overhead)."""
    failures: int
    """Requests that returned a Failure."""


def run_bench_api(*, latency_ms: float = 100.0, concurrency: int = 32, requests: int = 256) -> BenchApiResult:
    """Start the loopback server in its own process, warm up the connection pool, then time `requests` calls.

    Raises:
        ConfigError: for non-positive arguments.
    """
    from harness.loopback import start_loopback_server

    if latency_ms <= 0 or concurrency < 1 or requests < 1:
        raise ConfigError(
            "bench api needs latency_ms > 0, concurrency >= 1 and requests >= 1; got "
            f"latency_ms={latency_ms}, concurrency={concurrency}, requests={requests}"
        )
    with start_loopback_server(latency_ms=latency_ms) as base_url:
        wall_s, failures = asyncio.run(_measure(base_url, concurrency=concurrency, requests=requests))
    ideal_rps = requests / (math.ceil(requests / concurrency) * latency_ms / 1000)
    achieved_rps = requests / wall_s
    return BenchApiResult(
        requests=requests,
        concurrency=concurrency,
        latency_ms=latency_ms,
        wall_s=wall_s,
        achieved_rps=achieved_rps,
        ideal_rps=ideal_rps,
        ratio=achieved_rps / ideal_rps,
        failures=failures,
    )


async def _measure(base_url: str, *, concurrency: int, requests: int) -> tuple[float, int]:
    """(wall seconds, failures) for `requests` generate calls after one warm-up round."""
    from harness.backends.openai_backend import OpenAIBackend

    options = BackendOptions(base_url=base_url, concurrency=concurrency, timeout=60.0, max_attempts=1)
    backend = OpenAIBackend("loopback", options)
    params = SamplingParams(max_tokens=16)
    try:
        # The first round opens every pooled connection and runs the SDK's lazy first-call set-up; the next
        # ones let the backend measure its CPU time per request, which it paces request starts by.
        for _ in range(_WARM_UP_ROUNDS):
            await backend.generate(
                [GenerateRequest(user_chat(f"warm-up {i}"), params) for i in range(concurrency)]
            )
        batch = [GenerateRequest(user_chat(f"bench request {i}"), params) for i in range(requests)]
        start = time.perf_counter()
        completions = await backend.generate(batch)
        wall_s = time.perf_counter() - start
    finally:
        await backend.close()
    return wall_s, sum(not c.ok for c in completions)


def format_bench_api(result: BenchApiResult) -> str:
    """A few human-readable lines; the last one is `achieved/ideal throughput: R`."""
    return "\n".join(
        [
            (
                f"api bench: {result.requests} chat completions, concurrency {result.concurrency}, "
                f"server latency {result.latency_ms:g} ms (loopback server in its own process)"
            ),
            f"wall time: {result.wall_s:.3f} s, failures: {result.failures}",
            f"throughput: achieved {result.achieved_rps:.1f} req/s, ideal {result.ideal_rps:.1f} req/s",
            f"achieved/ideal throughput: {result.ratio:.2f}",
        ]
    )
