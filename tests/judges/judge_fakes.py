"""A scripted judge backend for rubric tests: answers generator and verifier prompts from a truth table.

It reads the request the way a model would: a rubric request gets the next scripted rubric text; a one-item
verification gets Yes/No from `truth[(response, criterion)]`; an answer-sheet request gets `i: yes|no` lines
(honouring a prefill: the text returned continues `assistant_prefix`). A `hook(request)` can override any answer
(a text, returned as it is, a `Failure`, or a whole `Completion`). `next_token_logprobs` scores each context of a
request (branches included) like the one-item question: `answer_logprobs["yes" | "no"]` by the truth table;
`logprob_hook(context_text)` can override a context (a dict or a `Failure`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from harness.backends.base import (
    BaseBackend,
    Completion,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    TokenLogprob,
    Usage,
)
from harness.errors import Failure

YES_LOGPROBS = {"Yes": math.log(0.8), "yes": math.log(0.1), "No": math.log(0.1)}  # P(yes) = 0.9, mass 1.0
NO_LOGPROBS = {"No": math.log(0.5), "no": math.log(0.1), "Yes": math.log(0.15)}  # P(yes) = 0.2, mass 0.75
_TOKEN = re.compile(r"\s*[A-Za-z]+|\s*\d+|\s*[^\sA-Za-z\d]|\s+")


def tokenise(text: str) -> list[str]:
    """Word-ish tokens whose concatenation is `text` (leading whitespace attached, as BPE tokenizers do)."""
    pieces = _TOKEN.findall(text)
    assert "".join(pieces) == text
    return pieces


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


class FakeJudge(BaseBackend):
    """A backend that plays both DR-Generator and DR-Verifier. See the module docstring."""

    kind = "fake"

    def __init__(
        self,
        *,
        rubrics: Sequence[str | Failure] = (),
        truth: dict[tuple[str, str], bool] | None = None,
        hook: Callable[[GenerateRequest], str | Failure | Completion | None] | None = None,
        logprob_hook: Callable[[str], dict[str, float] | Failure | None] | None = None,
        model: str = "fake-judge",
    ) -> None:
        self.model = model
        self.rubrics = list(rubrics)
        self.truth = truth or {}
        self.hook = hook
        self.logprob_hook = logprob_hook
        self.answer_logprobs = {"yes": YES_LOGPROBS, "no": NO_LOGPROBS}
        self.batches: list[list[GenerateRequest]] = []
        self.logprob_batches: list[list[LogprobRequest]] = []

    @property
    def requests(self) -> list[GenerateRequest]:
        return [r for batch in self.batches for r in batch]

    async def next_token_logprobs(self, requests, candidates) -> list[LogprobResult]:
        self.logprob_batches.append(list(requests))
        return [self._score(r, candidates) for r in requests]

    def _score(self, request: LogprobRequest, candidates) -> LogprobResult:
        found = []
        for context in request.contexts():
            text = context[0].content
            answer = self.logprob_hook(text) if self.logprob_hook else None
            if isinstance(answer, Failure):
                return LogprobResult({}, error=answer)
            if answer is None:
                response = _between(text, "[Response]\n", "\n[End of Response]")
                criterion = _between(text, "\nCriterion: ", "\n")
                answer = self.answer_logprobs["yes" if self.truth.get((response, criterion), False) else "no"]
            found.append({c: answer.get(c, -math.inf) for c in candidates})
        if request.branches:
            return LogprobResult({}, branches=tuple(found), usage=Usage(10 * len(found), 0))
        return LogprobResult(found[0], usage=Usage(10, 0))

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        self.batches.append(list(requests))
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerateRequest) -> Completion:
        answer = self.hook(request) if self.hook else None
        if answer is None:
            answer = self._scripted(request)
            if isinstance(answer, str) and answer.startswith(request.assistant_prefix):
                answer = answer[len(request.assistant_prefix) :]
        if isinstance(answer, Completion):
            return answer
        if isinstance(answer, Failure):
            return Completion((), error=answer)
        logprobs = None
        if request.params.logprobs:
            logprobs = (tuple(self._token(t) for t in tokenise(answer)),)
        return Completion((answer,), Usage(10, 5), logprobs=logprobs)

    def _token(self, token: str) -> TokenLogprob:
        return TokenLogprob(token, 0.0, {token: 0.0})

    def _scripted(self, request: GenerateRequest) -> str | Failure:
        first = request.messages[0].content
        if "grading rubric" in first:
            return self.rubrics.pop(0)
        response = _between(first, "[Response]\n", "\n[End of Response]")
        if "\nCriterion: " in first:
            criterion = _between(first, "\nCriterion: ", "\n")
            return "Yes" if self.truth.get((response, criterion), False) else "No"
        criteria = _between(first, "Criteria:\n", "\n\n").splitlines()
        lines = []
        for line in criteria:
            number, criterion = line.split(". ", 1)
            lines.append(f"{number}: {'yes' if self.truth.get((response, criterion), False) else 'no'}")
        return "\n".join(lines)


class FakePool:
    """Stands in for `harness.pool.BackendPool`: `get(spec)` returns the backend named by spec (or the default)."""

    def __init__(self, default: FakeJudge, by_spec: dict[str, FakeJudge] | None = None) -> None:
        self.default = default
        self.by_spec = by_spec or {}
        self.specs: list[str] = []

    def get(self, spec: str) -> FakeJudge:
        self.specs.append(spec)
        return self.by_spec.get(spec, self.default)


def loopback_judge_backend(url: str):
    """An `openai` backend on a loopback judge server, with backoffs short enough that retried faults take
    milliseconds."""
    from harness.backends.base import BackendOptions
    from harness.backends.openai_backend import OpenAIBackend

    return OpenAIBackend("judge", BackendOptions(base_url=url, max_attempts=3, timeout=5),
                         backoff_base_s=0.01, backoff_cap_s=0.02)


def judge_all_closing(judge, backend, pairs, *, seed: int = 0):
    """`judge.judge_all(pairs, seed=seed)` in a fresh event loop, closing `backend` afterwards."""
    import asyncio

    async def go():
        try:
            return await judge.judge_all(pairs, seed=seed)
        finally:
            await backend.close()

    return asyncio.run(go())
