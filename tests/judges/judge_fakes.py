"""A scripted judge backend for rubric tests: answers generator and verifier prompts from a truth table.

It reads the request the way a model would: a rubric request gets the next scripted rubric text; a one-item
verification gets Yes/No from `truth[(response, criterion)]`; an answer-sheet request gets `i: yes|no` lines. A
`hook(request)` can override any answer (a text, a `Failure`, or a whole `Completion`). When a request asks for
logprobs, every token carries a top list; yes/no tokens get `answer_top[word]`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from harness.backends.base import Completion, GenerateRequest, TokenLogprob, Usage
from harness.errors import Failure

YES_TOP = {" yes": math.log(0.8), " Yes": math.log(0.1), " no": math.log(0.1)}  # P(yes) = 0.9
NO_TOP = {" no": math.log(0.7), " yes": math.log(0.2), "\n": math.log(0.1)}  # P(yes) = 0.2 / 0.9
_TOKEN = re.compile(r"\s*[A-Za-z]+|\s*\d+|\s*[^\sA-Za-z\d]|\s+")


def tokenise(text: str) -> list[str]:
    """Word-ish tokens whose concatenation is `text` (leading whitespace attached, as BPE tokenizers do)."""
    pieces = _TOKEN.findall(text)
    assert "".join(pieces) == text
    return pieces


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


class FakeJudge:
    """A backend that plays both DR-Generator and DR-Verifier. See the module docstring."""

    kind = "fake"

    def __init__(
        self,
        *,
        rubrics: Sequence[str | Failure] = (),
        truth: dict[tuple[str, str], bool] | None = None,
        hook: Callable[[GenerateRequest], str | Failure | Completion | None] | None = None,
        model: str = "fake-judge",
    ) -> None:
        self.model = model
        self.rubrics = list(rubrics)
        self.truth = truth or {}
        self.hook = hook
        self.answer_top = {"yes": YES_TOP, "no": NO_TOP}
        self.batches: list[list[GenerateRequest]] = []

    @property
    def requests(self) -> list[GenerateRequest]:
        return [r for batch in self.batches for r in batch]

    def identity(self) -> dict[str, str]:
        return {"kind": self.kind, "model": self.model}

    async def probe(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def next_token_logprobs(self, requests, candidates):  # pragma: no cover - not used by rubric judges
        raise NotImplementedError

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        self.batches.append(list(requests))
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerateRequest) -> Completion:
        answer = self.hook(request) if self.hook else None
        if answer is None:
            answer = self._scripted(request)
        if isinstance(answer, Completion):
            return answer
        if isinstance(answer, Failure):
            return Completion((), error=answer)
        logprobs = None
        if request.params.logprobs:
            logprobs = (tuple(self._token(t) for t in tokenise(answer)),)
        return Completion((answer,), Usage(10, 5), logprobs=logprobs)

    def _token(self, token: str) -> TokenLogprob:
        top = self.answer_top.get(token.strip().casefold(), {token: 0.0})
        return TokenLogprob(token, top.get(token, 0.0), dict(top))

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
