"""One model behind several OpenAI-compatible servers (replicas), routed client-side.

- **A set to one replica, least-loaded.** Each call (a `generate` or logprob batch: an evaluator sends the
  requests of one response set together, sharing its prompt) goes whole to the replica with the fewest requests
  in flight, so the set meets one replica's prefix cache and the load spreads by sets.
- **Failover.** Each replica makes one attempt per request; a failure that another server may not have (refused
  or dropped connection, timeout, 5xx, 429, malformed body) sends the request to the next replica, up to
  `max_attempts` attempts in all (with backoff once every replica has been tried). Nothing is lost: a request
  fails only when every attempt did, and then as a recorded failure the rerun retries. `failovers` counts the
  requests moved.
- **A failing replica is held down, longer each time.** Its first such failure holds it down for `HOLD_S`
  seconds: no set goes to it while another replica is up. When the hold is over, one set goes to it as a trial
  (the others keep going elsewhere): an answer brings it back up, another failure holds it down for twice as
  long (at most `HOLD_CAP_S`). Failures of requests sent before it went down are the same outage and change
  nothing, so a replica that hangs costs each set in flight on it one timeout, then one set per hold. Each
  change (down, back up) is one warning line on stderr with the replica's masked URL and why.
- **One identity.** Replicas serve the same weights, so the router has one identity (the served weights' where
  known, else the sorted server URLs, masked): a request has one call-cache entry whichever replica served it.
  URLs are shown and stored only masked (`harness.redact.mask_url`): the counts per replica, the identity, the
  lines on stderr.
- **Concurrency per replica.** Each replica keeps its own adaptive limit (`harness.backends.openai_transport`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
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
from harness.errors import Failure, FailureCategory
from harness.redact import mask_url, redact_text

log = logging.getLogger(__name__)

HOLD_S = 30.0
"""How long a replica is held down after its first failure (then one set tries it)."""
HOLD_CAP_S = 600.0
"""The longest hold: each failed trial doubles the hold up to this."""
ELSEWHERE = frozenset({FailureCategory.CONNECTION, FailureCategory.TIMEOUT, FailureCategory.SERVER_ERROR,
                       FailureCategory.RATE_LIMIT, FailureCategory.MALFORMED_RESPONSE, FailureCategory.BACKEND})
"""Failures another replica may not have: the request moves on."""


class ReplicaBackend(BaseBackend):
    """Several `openai` backends of one model, one per server, behind one `BaseBackend`.

    Args:
        model: The model name the servers know.
        replicas: One backend per server (the same model and options but the URL).
        identity: The served weights' identity (empty: the servers' URLs stand for it).
        clock: Monotonic seconds, for the holds (tests pass their own).
    """

    kind = "openai"

    def __init__(self, model: str, replicas: Sequence[Any], *, identity: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.options = replicas[0].options
        self.max_attempts = self.options.max_attempts
        self.replicas = [_one_attempt(r) for r in replicas]
        self.urls = [mask_url(getattr(r, "url", r.base_url)) for r in self.replicas]
        """Each replica's URL as it is shown and stored (query values and credentials masked)."""
        servers = {"servers": " ".join(sorted(self.urls))}
        self._identity = {"kind": self.kind, "model": model, **(identity or servers)}
        self.in_flight = [0] * len(self.replicas)
        self.requests = [0] * len(self.replicas)
        """Requests each replica answered or failed (attempts)."""
        self.failovers = 0
        """Requests moved to another replica after a failure."""
        self._clock = clock
        self._hold = [0.0] * len(self.replicas)
        """Seconds each replica is held down for (0: up)."""
        self._changed_at = [-math.inf] * len(self.replicas)
        """When each replica last went down or came back up: what a request sent before says is old news."""
        self._down_until = [0.0] * len(self.replicas)
        self._trial = [False] * len(self.replicas)
        """Whether a set is trying the replica now (its hold is over): no other set goes to it meanwhile."""
        self._turn = 0

    def identity(self) -> dict[str, str]:
        return dict(self._identity)

    def capabilities(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for replica in self.replicas:
            found.update(replica.capabilities())
        return found

    def stats(self) -> dict[str, Any]:
        """Per replica URL (masked), the requests it took; the failovers."""
        return {"requests": dict(zip(self.urls, self.requests)), "failovers": self.failovers}

    def held(self) -> dict[str, float]:
        """Replica URL (masked) -> the seconds it is held down for, for the replicas that are down now."""
        return {url: hold for url, hold in zip(self.urls, self._hold) if hold}

    @property
    def http_requests(self) -> int:
        return sum(r.http_requests for r in self.replicas)

    def preflight(self) -> None:
        for replica in self.replicas:
            replica.preflight()

    def check_score(self, head: ScoreHead) -> None:
        self.replicas[0].check_score(head)

    async def probe(self) -> None:
        """Probe every replica; one that cannot be reached is held down (the run goes on with the rest).

        Raises:
            BackendUnavailableError: when no replica can be reached.
        """
        started = self._clock()
        found = await asyncio.gather(*(r.probe() for r in self.replicas), return_exceptions=True)
        failed = [i for i, f in enumerate(found) if isinstance(f, BaseException)]
        for i in failed:
            self._failed(i, started, str(found[i]))
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
            i, trial = self._pick(tried)
            self.in_flight[i] += len(todo)
            self.requests[i] += len(todo)
            started = self._clock()
            try:
                found = await getattr(self.replicas[i], op)([requests[j] for j in todo], *extra)
            finally:
                self.in_flight[i] -= len(todo)
                if trial:
                    self._trial[i] = False
            again: list[int] = []
            why: Failure | None = None
            for j, result in zip(todo, found):
                results[j] = result
                error = getattr(result, "error", None)
                if error is not None and error.category in ELSEWHERE:
                    again.append(j)
                    why = why or error
            if why is not None:
                self._failed(i, started, f"{why.category.value}: {why.message}")
                tried.add(i)
                if attempt + 1 < self.max_attempts:
                    self.failovers += len(again)
            else:
                self._answered(i, started)
            todo = again
        return results

    def _pick(self, tried: set[int]) -> tuple[int, bool]:
        """A replica not `tried` for this call, and whether the call is its trial: one whose hold is over, as its
        trial (one set at a time); else the one with the fewest requests in flight among those up (ties: in
        turn); else, every one being held down, the one with the fewest in flight."""
        now = self._clock()
        left = [i for i in range(len(self.replicas)) if i not in tried]
        due = [i for i in left if self._hold[i] and self._down_until[i] <= now and not self._trial[i]]
        if due:
            i = min(due, key=lambda i: self._down_until[i])
            self._trial[i] = True
            return i, True
        up = [i for i in left if not self._hold[i]] or left
        self._turn += 1
        return min(up, key=lambda i: (self.in_flight[i], (i - self._turn) % len(self.replicas))), False

    def _failed(self, i: int, started: float, why: str) -> None:
        """Replica `i` failed a request sent at `started`: hold it down (`HOLD_S`, doubled after a failed trial),
        unless the request was sent before its last change (the outage it belongs to is already held)."""
        if started < self._changed_at[i]:
            return
        was_up = not self._hold[i]
        self._hold[i] = HOLD_S if was_up else min(HOLD_CAP_S, 2 * self._hold[i])
        self._changed_at[i] = now = self._clock()
        self._down_until[i] = now + self._hold[i]
        say = log.warning if was_up else log.debug
        say("%s: replica %s is %s (%s); its requests go to the other replicas, and it is tried again in %g s",
            self.model, self.urls[i], "down" if was_up else "still down", redact_text(" ".join(why.split())),
            self._hold[i])

    def _answered(self, i: int, started: float) -> None:
        """Replica `i` answered a request sent at `started`: a replica held down is up again, if the request was
        sent after it went down (an answer from before says nothing new)."""
        if self._hold[i] and started >= self._changed_at[i]:
            self._hold[i] = 0.0
            self._changed_at[i] = self._clock()
            log.warning("%s: replica %s is back up; requests go to it again", self.model, self.urls[i])


def _one_attempt(backend: Any) -> Any:
    """The replica making one attempt per request: the router retries, on another replica."""
    backend.options = dataclasses.replace(backend.options, max_attempts=1)
    return backend
