"""A scripted in-process backend for unit tests: deterministic text (and scores) from the request, call counting."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from harness.backends.base import (
    BaseBackend,
    Completion,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    ScoreRequest,
    ScoreResult,
    Usage,
    sample_seed,
)
from harness.errors import Failure, FailureCategory


class ScriptedBackend(BaseBackend):
    """Answers `echo:<last user message>#<sample seed>`; fails requests whose text contains `fail_marker`.

    Next-token logprobs are a hash of each context's last message (one dict per branch for a branched request);
    a score is the length of the scored turn, with its word count as the token count.
    """

    kind = "scripted"

    def __init__(self, model: str = "scripted-model", *, fail_marker: str = "FAIL") -> None:
        self.model = model
        self.fail_marker = fail_marker
        self.requests: list[GenerateRequest] = []
        self.logprob_requests: list[LogprobRequest] = []
        self.score_requests: list[ScoreRequest] = []

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        out = []
        for r in requests:
            self.requests.append(r)
            text = r.messages[-1].content
            if self.fail_marker in text:
                out.append(Completion((), error=Failure(FailureCategory.SERVER_ERROR, "scripted failure", 3)))
                continue
            seeds = [None if r.params.greedy else sample_seed(r.params.seed, i) for i in range(r.params.n)]
            out.append(Completion(tuple(f"echo:{text}#{s}" for s in seeds), Usage(len(text), 5 * r.params.n)))
        return out

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        out = []
        for r in requests:
            self.logprob_requests.append(r)
            found = []
            for context in r.contexts():
                digest = hashlib.sha256(context[-1].content.encode()).digest()
                found.append({c: -float(digest[i % 32]) / 10 for i, c in enumerate(candidates)})
            out.append(LogprobResult({}, branches=tuple(found)) if r.branches else LogprobResult(found[0]))
        return out

    def check_score(self, head: str) -> None:
        return None

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        out = []
        for r in requests:
            self.score_requests.append(r)
            text = r.messages[-1].content
            if self.fail_marker in text:
                out.append(ScoreResult(None, error=Failure(FailureCategory.BACKEND, "scripted failure")))
                continue
            words = len(text.split())
            out.append(ScoreResult(float(len(text)), words, min(words, r.max_length)))
        return out
