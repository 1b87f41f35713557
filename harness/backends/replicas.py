"""One model behind several OpenAI-compatible servers (replicas), routed client-side.

- **A set to one replica, least-loaded.** Each call (a `generate` or logprob batch: an evaluator sends the
  requests of one response set together, sharing its prompt) goes whole to the replica with the fewest requests
  in flight, so the set meets one replica's prefix cache and the load spreads by sets.
- **Failover.** Each replica makes one attempt per request; a failure that another server may not have (refused
  or dropped connection, timeout, 5xx, 429, malformed body) marks the replica down for `DOWN_S` seconds and the
  request goes to the next replica, up to `max_attempts` attempts in all (with backoff once every replica has
  been tried). Nothing is lost: a request fails only when every attempt did, and then as a recorded failure the
  rerun retries. `failovers` counts the requests moved.
- **One identity.** Replicas serve the same weights, so the router has one identity (the served weights' where
  known, else the sorted server URLs): a request has one call-cache entry whichever replica served it.
- **Concurrency per replica.** Each replica keeps its own adaptive limit (`harness.backends.openai_backend`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Sequence
from typing import Any

from harness.backends.base import (
    BaseBackend,
    Completion,
    GenerateRequest,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    LogprobRequest,
    LogprobResult,
    ScoreHead,
    ScoreRequest,
    ScoreResult,
)
from harness.errors import FailureCategory

DOWN_S = 30.0
"""How long a replica that failed is passed over (then it is tried again)."""
ELSEWHERE = frozenset({FailureCategory.CONNECTION, FailureCategory.TIMEOUT, FailureCategory.SERVER_ERROR,
                       FailureCategory.RATE_LIMIT, FailureCategory.MALFORMED_RESPONSE, FailureCategory.BACKEND})
"""Failures another replica may not have: the request moves on."""


class ReplicaBackend(BaseBackend):
    """Several `openai` backends of one model, one per server, behind the `Backend` protocol.

    Args:
        model: The model name the servers know.
        replicas: One backend per server (the same model and options but the URL).
        identity: The served weights' identity (empty: the servers' URLs stand for it).
    """

    kind = "openai"

    def __init__(self, model: str, replicas: Sequence[Any], *, identity: dict[str, str] | None = None) -> None:
        self.model = model
        self.options = replicas[0].options
        self.max_attempts = self.options.max_attempts
        self.replicas = [_one_attempt(r) for r in replicas]
        urls = sorted(r.base_url for r in self.replicas)
        self._identity = {"kind": self.kind, "model": model, **(identity or {"servers": " ".join(urls)})}
        self.in_flight = [0] * len(self.replicas)
        self.requests = [0] * len(self.replicas)
        """Requests each replica answered or failed (attempts)."""
        self._down_until = [0.0] * len(self.replicas)
        self.failovers = 0
        """Requests moved to another replica after a failure."""
        self._turn = 0

    def identity(self) -> dict[str, str]:
        return dict(self._identity)

    def capabilities(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for replica in self.replicas:
            found.update(replica.capabilities())
        return found

    def stats(self) -> dict[str, Any]:
        """Per replica URL, the requests it took; the failovers."""
        return {"requests": {r.base_url: n for r, n in zip(self.replicas, self.requests)},
                "failovers": self.failovers}

    @property
    def http_requests(self) -> int:
        return sum(r.http_requests for r in self.replicas)

    def preflight(self) -> None:
        for replica in self.replicas:
            replica.preflight()

    def check_score(self, head: ScoreHead) -> None:
        self.replicas[0].check_score(head)

    async def probe(self) -> None:
        """Probe every replica; one that cannot be reached is passed over (the run goes on with the rest).

        Raises:
            BackendUnavailableError: when no replica can be reached.
        """
        found = await asyncio.gather(*(r.probe() for r in self.replicas), return_exceptions=True)
        failed = [i for i, f in enumerate(found) if isinstance(f, BaseException)]
        for i in failed:
            self._down_until[i] = time.monotonic() + DOWN_S
        if len(failed) == len(self.replicas):
            raise found[0]  # type: ignore[misc]

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.close()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        return await self._batch("generate", requests)

    async def next_token_logprobs(self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
                                  ) -> list[LogprobResult]:
        return await self._batch("next_token_logprobs", requests, candidates)

    async def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
        return await self._batch("loglikelihood", requests)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return await self._batch("score", requests)

    async def _batch(self, op: str, requests: Sequence[Any], *extra: Any) -> list[Any]:
        """One call's requests on the replica `_pick` chooses; those that fail `ELSEWHERE` move to the next."""
        results: list[Any] = [None] * len(requests)
        todo = list(range(len(requests)))
        tried: set[int] = set()
        for attempt in range(self.max_attempts):
            if not todo:
                break
            if len(tried) == len(self.replicas):  # every replica failed once: wait, then start over
                await asyncio.sleep(random.uniform(0, min(10.0, 0.5 * 2**attempt)))
                tried.clear()
            i = self._pick(tried)
            self.in_flight[i] += len(todo)
            self.requests[i] += len(todo)
            try:
                found = await getattr(self.replicas[i], op)([requests[j] for j in todo], *extra)
            finally:
                self.in_flight[i] -= len(todo)
            again = []
            for j, result in zip(todo, found):
                results[j] = result
                error = getattr(result, "error", None)
                if error is not None and error.category in ELSEWHERE:
                    again.append(j)
            if again:
                self._down_until[i] = time.monotonic() + DOWN_S
                tried.add(i)
                if attempt + 1 < self.max_attempts:
                    self.failovers += len(again)
            todo = again
        return results

    def _pick(self, tried: set[int]) -> int:
        """The replica with the fewest requests in flight among those up and not tried (ties: in turn)."""
        now = time.monotonic()
        left = [i for i in range(len(self.replicas)) if i not in tried]
        up = [i for i in left if self._down_until[i] <= now] or left
        self._turn += 1
        return min(up, key=lambda i: (self.in_flight[i], (i - self._turn) % len(self.replicas)))


def _one_attempt(backend: Any) -> Any:
    """The replica making one attempt per request: the router retries, on another replica."""
    backend.options = dataclasses.replace(backend.options, max_attempts=1)
    return backend
