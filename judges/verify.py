"""The DR-Verifier: answer every rubric item for every response of a set, in one of three modes.

- `per_item` (the paper's scheme): one request per item x response (M*K), asking for one word, Yes or No.
- `batched`: one request per response (K) listing every item; the model writes an answer sheet, one line per item:
  `1: yes` / `2: no` / ... Exactly one verdict per item, or the whole sheet is rejected.
- `logprob`: the `batched` prompt and sheet, generated greedily with the top-5 alternatives of every token; an item's
  verdict is the probability of "yes" at the token where its answer was written,
  `P(yes) = sum(exp(lp) of yes-variants) / sum(exp(lp) of yes- and no-variants)` over that position's top list
  (variants: any token spelling "yes"/"no" after dropping case, spaces and punctuation). Soft verdicts lie in [0, 1].
  Where the slot cannot be located or neither word is among the alternatives, the written (hard) verdict is used and
  a note is left in `raw["notes"]`; only a sheet with no usable verdict is a failure.

Deviations from the paper: `batched` and `logprob` are additions (the paper verifies item by item); they cut the
requests from M*K to K. The verifier never sees the item weights. Every prompt puts the response before the items,
so the requests for one response share a long prefix (servers with prefix caching reuse it).

Parsing is strict; an unreadable answer is asked again once, with the parser's complaint, and then recorded as a
PARSE failure (`StageFailure(stage="verify")`). All requests of a round go to the backend in one `generate` batch.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.backends.base import Backend, Completion, GenerateRequest, Message, SamplingParams, TokenLogprob
from harness.errors import Failure, FailureCategory
from judges.base import StageFailure
from judges.rubric import Rubric
from judges.templates import render_template

__all__ = [
    "LOGPROB_TOP",
    "VERIFY_MODES",
    "Ask",
    "Verification",
    "VerdictParseError",
    "VerifyMode",
    "ask_all",
    "p_yes",
    "parse_answer_sheet",
    "parse_yes_no",
    "soft_verdicts",
    "verify",
]

VerifyMode = Literal["per_item", "batched", "logprob"]
VERIFY_MODES: tuple[str, ...] = ("per_item", "batched", "logprob")
LOGPROB_TOP = 5
"""Alternatives requested per token in `logprob` mode."""


class VerdictParseError(ValueError):
    """A verifier answer that cannot be read; the message is shown to the model on the re-ask."""


# --- parsing ---

_FIRST_WORD = re.compile(r"[\s*_`\"'>#:.\-]*([A-Za-z]+)")
_SHEET_LINE = re.compile(
    r"^[ \t>*_#`\-]*(?:(?:criterion|item|question)[ \t]*)?#?(\d+)[ \t*_`]*[:.)\]\-]?[ \t*_`\"']*(yes|no)\b",
    re.IGNORECASE | re.MULTILINE,
)


def _answer_start(text: str) -> int:
    """Offset where the answer begins: after the last `</think>` (reasoning never counts as a verdict)."""
    end = text.rfind("</think>")
    return 0 if end < 0 else end + len("</think>")


def parse_yes_no(text: str) -> bool:
    """Read a one-word verdict: the first word of the answer must be `yes` or `no` (any case, markdown allowed).

    Raises:
        VerdictParseError: the answer is empty, still thinking, or starts with another word.
    """
    answer = text[_answer_start(text):]
    if "<think>" in answer:
        raise VerdictParseError("the answer ended inside <think> before giving a verdict")
    m = _FIRST_WORD.match(answer)
    if m is None:
        raise VerdictParseError("the answer is empty; expected Yes or No")
    word = m.group(1).casefold()
    if word not in ("yes", "no"):
        raise VerdictParseError(f"expected the answer to start with Yes or No, got {answer.strip()[:60]!r}")
    return word == "yes"


def _sheet_entries(text: str, n_items: int) -> tuple[dict[int, tuple[bool, int]], list[str]]:
    """Item number -> (verdict, offset of the yes/no word in `text`), and the problems found."""
    start = _answer_start(text)
    entries: dict[int, tuple[bool, int]] = {}
    problems: list[str] = []
    for m in _SHEET_LINE.finditer(text, start):
        number = int(m.group(1))
        if not 1 <= number <= n_items:
            problems.append(f"item {number} does not exist (there are {n_items})")
        elif number in entries:
            problems.append(f"item {number} is answered more than once")
        else:
            entries[number] = (m.group(2).casefold() == "yes", m.start(2))
    if not entries and not problems:
        problems.append("found no lines of the form `1: yes` or `1: no`")
    else:
        missing = [str(i) for i in range(1, n_items + 1) if i not in entries]
        if missing:
            problems.append(f"no answer for item(s) {', '.join(missing)}")
    return entries, problems


def parse_answer_sheet(text: str, n_items: int) -> list[bool]:
    """Read an answer sheet: one `N: yes|no` line per item 1..n_items; other lines (prose) are ignored.

    Raises:
        VerdictParseError: an item is missing, answered twice or out of range; the message lists every problem.
    """
    entries, problems = _sheet_entries(text, n_items)
    if problems:
        raise VerdictParseError("; ".join(problems))
    return [entries[i][0] for i in range(1, n_items + 1)]


def _word(token: str) -> str:
    return re.sub(r"[^a-z]", "", token.casefold())


def p_yes(top: Mapping[str, float]) -> float | None:
    """P(yes) among the yes/no variants of one position's alternatives; None when neither word is there."""
    yes = sum(math.exp(lp) for tok, lp in top.items() if _word(tok) == "yes")
    no = sum(math.exp(lp) for tok, lp in top.items() if _word(tok) == "no")
    return yes / (yes + no) if yes + no > 0 else None


def soft_verdicts(tokens: Sequence[TokenLogprob], n_items: int) -> list[float | None]:
    """Per item, P(yes) at the token where the sheet written by `tokens` answers it (None: not located/ranked)."""
    starts, offset = [], 0
    for t in tokens:
        starts.append(offset)
        offset += len(t.token)
    entries, _ = _sheet_entries("".join(t.token for t in tokens), n_items)
    out: list[float | None] = []
    for number in range(1, n_items + 1):
        if number not in entries or not tokens:
            out.append(None)
            continue
        position = bisect.bisect_right(starts, entries[number][1]) - 1
        out.append(p_yes(tokens[position].top))
    return out


# --- asking, with one re-ask on a parse failure ---


@dataclass(slots=True)
class Ask:
    """One question to a backend: its chat, how to read the answer, and how to complain about an unreadable one."""

    messages: tuple[Message, ...]
    params: SamplingParams
    parse: Callable[[Completion], Any]
    """Reads the completion; raises a `ValueError` (its message is the complaint) when it cannot."""
    retry: Callable[[str], str]
    """The user message of the re-ask, given the complaint."""
    result: Any = None
    failure: Failure | None = None
    texts: list[str] = field(default_factory=list)
    """The model's answers, first and (if re-asked) second."""
    problem: str | None = None
    """The complaint sent on the re-ask, if any."""


async def ask_all(backend: Backend, asks: Sequence[Ask]) -> tuple[int, int]:
    """Send every ask in one `generate` batch, re-ask the unreadable ones once (again in one batch).

    Each ask ends with `result` set or `failure` set (the backend's own, or PARSE after the re-ask).

    Returns:
        (requests sent, requests not served by the call cache).
    """
    requests = calls = 0
    pending = list(asks)
    for attempt in (1, 2):
        if not pending:
            break
        completions = await backend.generate([GenerateRequest(a.messages, a.params) for a in pending])
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
            a.texts.append(c.texts[0])
            try:
                a.result = a.parse(c)
            except ValueError as exc:
                if attempt == 2:
                    message = f"unreadable after a re-ask: {exc} (first answer: {a.problem})"
                    a.failure = Failure(FailureCategory.PARSE, message, attempts=2)
                    continue
                a.problem = str(exc)
                a.messages += (Message("assistant", c.texts[0]), Message("user", a.retry(str(exc))))
                again.append(a)
        pending = again
    return requests, calls


# --- the three modes ---


@dataclass(frozen=True, slots=True)
class Verification:
    """What the verifier found for one rubric x response set."""

    verdicts: list[list[float | None]]
    """Items x responses: 0/1, or P(yes) in `logprob` mode; None where verification failed."""
    failures: tuple[StageFailure, ...]
    """One per failed request (per item x response in `per_item`, per response otherwise)."""
    requests: int
    """Requests sent to the backend, re-asks included."""
    calls: int
    """Of those, the ones not served by the call cache."""
    raw: dict[str, Any]
    """`answers` (final texts), `retries` (first answers and complaints), `notes` (logprob fallbacks)."""


def _sheet(prompt: str, response: str, rubric: Rubric) -> str:
    criteria = "\n".join(f"{i}. {c}" for i, c in enumerate(rubric.criteria, start=1))
    return render_template("verify_sheet", prompt=prompt, response=response, criteria=criteria, count=len(rubric))


def _read_sheet(n_items: int, notes: list[str], k: int) -> Callable[[Completion], list[float]]:
    def parse(c: Completion) -> list[float]:
        hard = parse_answer_sheet(c.texts[0], n_items)
        if c.logprobs is None:  # batched mode, or a backend that returned none
            return [float(v) for v in hard]
        soft = soft_verdicts(c.logprobs[0], n_items)
        for m, s in enumerate(soft):
            if s is None:
                notes.append(f"response {k} item {m}: no yes/no alternative at the answer; used the written verdict")
        return [float(h) if s is None else s for h, s in zip(hard, soft)]

    return parse


async def verify(
    backend: Backend,
    prompt: str,
    responses: Sequence[str],
    rubric: Rubric,
    *,
    mode: VerifyMode = "per_item",
    max_tokens: int = 16,
) -> Verification:
    """Answer every item of `rubric` for every response.

    Args:
        backend: the verifier model.
        prompt: the prompt the responses answer (the verifier sees it).
        responses: the K responses, in input order.
        rubric: the M items (weights are not shown to the verifier).
        mode: `per_item`, `batched` or `logprob` (see the module docstring).
        max_tokens: token budget per verdict; a sheet gets `max_tokens * M`.

    Returns:
        The verdict matrix (M x K), failures and request counts.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"unknown verify mode {mode!r}; valid: {', '.join(VERIFY_MODES)}")
    n_items, k_resp = len(rubric), len(responses)
    verdicts: list[list[float | None]] = [[None] * k_resp for _ in range(n_items)]
    notes: list[str] = []
    if mode == "per_item":
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        cells = [(m, k) for k in range(k_resp) for m in range(n_items)]  # response-major: shared prefixes adjacent
        asks = [
            Ask(
                (Message("user", render_template(
                    "verify_item", prompt=prompt, response=responses[k], criterion=rubric.criteria[m]
                )),),
                params,
                lambda c: float(parse_yes_no(c.texts[0])),
                lambda problem: render_template("retry_item", problem=problem),
            )
            for m, k in cells
        ]
    else:
        top = LOGPROB_TOP if mode == "logprob" else 0
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens * n_items, logprobs=top)
        cells = [(None, k) for k in range(k_resp)]
        asks = [
            Ask(
                (Message("user", _sheet(prompt, responses[k], rubric)),),
                params,
                _read_sheet(n_items, notes, k),
                lambda problem: render_template("retry_sheet", problem=problem, count=n_items),
            )
            for _, k in cells
        ]
    requests, calls = await ask_all(backend, asks)
    failures, retries = [], []
    answers: list[Any] = [[None] * k_resp for _ in range(n_items)] if mode == "per_item" else [None] * k_resp
    for (m, k), a in zip(cells, asks):
        if a.problem is not None:
            retries.append({"response": k, "item": m, "answer": a.texts[0], "problem": a.problem})
        if a.texts:
            if m is None:
                answers[k] = a.texts[-1]
            else:
                answers[m][k] = a.texts[-1]
        if a.failure is not None:
            failures.append(StageFailure("verify", a.failure, response=k, item=m))
        elif m is None:
            for row, value in zip(verdicts, a.result):
                row[k] = value
        else:
            verdicts[m][k] = a.result
    raw: dict[str, Any] = {"answers": answers, "retries": retries}
    if mode == "logprob":
        raw["notes"] = notes
    return Verification(verdicts, tuple(failures), requests, calls, raw)
