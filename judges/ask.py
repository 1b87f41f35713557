"""Asking a model a question whose answer must be read, with one re-ask on an unreadable answer.

Every judge that reads a model's text goes through `ask_all`: the rubric verifier (`judges.verify`), the rubric
generator (`judges.dynamic`) and the policy judges (`judges.alpaca`, `judges.arena_hard`, `judges.wildbench`,
`judges.writingbench`). An `Ask` carries the chat, the sampling parameters, the parser and the re-ask message;
`ask_all` sends a batch in one `generate`, re-asks the unreadable ones once with the parser's complaint (again in one
batch) and leaves each ask with its `result`, or its `failure` (the backend's own, or `parse` after the re-ask):
never a default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.backends.base import BaseBackend, GenerateRequest, Message, SamplingParams, assistant_text
from harness.errors import Failure, FailureCategory

__all__ = ["Ask", "ask_all"]


@dataclass(slots=True)
class Ask:
    """One question to a backend: its chat, how to read the answer, and how to complain about an unreadable one."""

    messages: tuple[Message, ...]
    params: SamplingParams
    parse: Callable[[str], Any]
    """Reads the answer text (prefill joined on); raises a `ValueError` (its message is the complaint)."""
    retry: Callable[[str], str]
    """The user message of the re-ask, given the complaint."""
    prefix: str = ""
    """A prefill for the assistant turn (sent on the re-ask too); see `assistant_text`."""
    result: Any = None
    failure: Failure | None = None
    texts: list[str] = field(default_factory=list)
    """The model's answers, first and (if re-asked) second, each with its prefill."""
    problem: str | None = None
    """The complaint sent on the re-ask, if any."""


async def ask_all(backend: BaseBackend, asks: Sequence[Ask]) -> tuple[int, int]:
    """Send every ask in one `generate` batch, re-ask the unreadable ones once (again in one batch).

    Each ask ends with `result` set or `failure` set (the backend's own, or PARSE after the re-ask). `parse`
    sees the whole answer, its prefill joined on where the backend continued it (`assistant_text`).

    Returns:
        (requests sent, requests not served by the call cache).
    """
    requests = calls = 0
    pending = list(asks)
    for attempt in (1, 2):
        if not pending:
            break
        batch = [GenerateRequest(a.messages, a.params, a.prefix) for a in pending]
        completions = await backend.generate(batch)
        if len(completions) != len(pending):  # a broken backend, not a bad answer: never guess the alignment
            raise RuntimeError(f"backend {backend.model!r} returned {len(completions)} results for {len(pending)}")
        requests += len(pending)
        calls += sum(not c.cached for c in completions)
        again = []
        for a, c in zip(pending, completions):
            if c.error is not None:
                a.failure = c.error
                continue
            if len(c.texts) != 1:
                a.failure = Failure(FailureCategory.MALFORMED_RESPONSE, f"expected 1 text, got {len(c.texts)}")
                continue
            text = assistant_text(a.prefix, c)
            a.texts.append(text)
            try:
                a.result = a.parse(text)
            except ValueError as exc:
                if attempt == 2:
                    message = f"unreadable after a re-ask: {exc} (first answer: {a.problem})"
                    a.failure = Failure(FailureCategory.PARSE, message, attempts=2)
                    continue
                a.problem = str(exc)
                a.messages += (Message("assistant", text), Message("user", a.retry(str(exc))))
                again.append(a)
        pending = again
    return requests, calls
