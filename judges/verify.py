"""The DR-Verifier: answer every rubric item for every response of a set, in one of three modes.

- `per_item` (the paper's scheme): one request per item x response (M*K), asking for one word, Yes or No.
- `batched`: one request per response (K) listing every item; the model writes an answer sheet, one line per item:
  `1: yes` / `2: no` / ... Exactly one verdict per item, or the whole sheet is rejected. The assistant turn is
  prefilled with `1:`, end-of-sequence is held back until the sheet has had room for every line
  (`min_tokens = SHEET_TOKENS_PER_ITEM * M - 3`, a lower bound for common tokenizers) and generation stops at
  a blank line or at line M+1: small models that know the format but end after two or three lines then write
  whole sheets. (A server that cannot prefill is asked for the whole sheet, `1:` included, and its answer is
  read as written: `Completion.continues_prefix`.)
- `logprob`: the `per_item` question, read from the next-token distribution instead of generated. One request
  per response (K) carries the M items as branches of one context (`LogprobRequest.branches`): the prompt and
  response come first and are computed once where the backend allows (`hf`: one KV cache per response; `vllm`
  and servers: prefix caching), then one position per item gives
  `P(yes) = sum(exp(lp) of yes-variants) / sum(exp(lp) of yes- and no-variants)` over the candidates `YES_NO`.
  Soft verdicts lie in [0, 1]; `raw["yes_no_mass"]` keeps the probability the two words carry at each position
  (low mass: the model wanted to say something else). A cell where neither word is ranked (a server's top list
  without them) is a PARSE failure of that cell.

Deviations from the paper: `batched` and `logprob` are additions (the paper verifies item by item); they cut the
requests from M*K to K. The verifier never sees the item weights. Every prompt puts the response before the items,
so the requests for one response share a long prefix (servers with prefix caching reuse it).

Parsing is strict; an unreadable answer (`per_item`, `batched`) is asked again once, with the parser's
complaint, and then recorded as a PARSE failure (`StageFailure(stage="verify")`). All requests of a round go
to the backend in one batch.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.backends.base import (
    BaseBackend,
    Constraint,
    LogprobRequest,
    Message,
    SamplingParams,
)
from harness.errors import Failure, FailureCategory
from judges.ask import Ask, ask_all
from judges.base import StageFailure
from judges.rubric import Rubric
from judges.templates import load_template, render, render_template

__all__ = [
    "SHEET_PREFILL",
    "SHEET_TOKENS_PER_ITEM",
    "VERIFY_MODES",
    "YES_NO",
    "Verification",
    "VerdictParseError",
    "VerifyMode",
    "item_question_parts",
    "p_yes",
    "parse_answer_sheet",
    "parse_yes_no",
    "sheet_constraint",
    "sheet_params",
    "sheet_prompt",
    "verify",
]

VerifyMode = Literal["per_item", "batched", "logprob"]
VERIFY_MODES: tuple[str, ...] = ("per_item", "batched", "logprob")
YES_NO = ("Yes", "No", "yes", "no")
"""The candidate first tokens `logprob` mode scores (backends also try each with a leading space)."""
SHEET_PREFILL = "1:"
"""How `batched` mode starts the assistant's answer sheet."""
SHEET_TOKENS_PER_ITEM = 4
"""Tokens of one sheet line (`2: no` plus its newline) in common tokenizers, for the sheet's `min_tokens`."""


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


def _sheet_entries(text: str, n_items: int) -> tuple[dict[int, bool], list[str]]:
    """Item number -> verdict, and the problems found."""
    start = _answer_start(text)
    entries: dict[int, bool] = {}
    problems: list[str] = []
    for m in _SHEET_LINE.finditer(text, start):
        number = int(m.group(1))
        if not 1 <= number <= n_items:
            problems.append(f"item {number} does not exist (there are {n_items})")
        elif number in entries:
            problems.append(f"item {number} is answered more than once")
        else:
            entries[number] = m.group(2).casefold() == "yes"
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
    return [entries[i] for i in range(1, n_items + 1)]


def _word(token: str) -> str:
    return re.sub(r"[^a-z]", "", token.casefold())


def _yes_no(top: Mapping[str, float]) -> tuple[float, float]:
    """The probability the yes-variants and the no-variants of one position's alternatives carry."""
    yes = sum(math.exp(lp) for tok, lp in top.items() if _word(tok) == "yes")
    no = sum(math.exp(lp) for tok, lp in top.items() if _word(tok) == "no")
    return yes, no


def p_yes(top: Mapping[str, float]) -> float | None:
    """P(yes) among the yes/no variants of one position's alternatives; None when neither word is there."""
    yes, no = _yes_no(top)
    return yes / (yes + no) if yes + no > 0 else None


# --- the three modes ---


@dataclass(frozen=True, slots=True)
class Verification:
    """What the verifier found for one rubric x response set."""

    verdicts: list[list[float | None]]
    """Items x responses: 0/1, or P(yes) in `logprob` mode; None where verification failed."""
    failures: tuple[StageFailure, ...]
    """One per failed request (per item x response in `per_item`, per response otherwise), plus, in `logprob`
    mode, one per cell whose position ranked neither word."""
    requests: int
    """Requests sent to the backend, re-asks included."""
    calls: int
    """Of those, the ones not served by the call cache."""
    raw: dict[str, Any]
    """`per_item`/`batched`: `answers` (final texts) and `retries` (first answers and complaints); `logprob`:
    `yes_no_mass` (items x responses)."""


def sheet_prompt(prompt: str, response: str, rubric: Rubric) -> str:
    criteria = "\n".join(f"{i}. {c}" for i, c in enumerate(rubric.criteria, start=1))
    return render_template("verify_sheet", prompt=prompt, response=response, criteria=criteria, count=len(rubric))


VERDICT_CHOICE = Constraint.choice(["Yes", "No"], think=True)
"""`per_item`'s structured output: one word, after any reasoning block."""


def sheet_constraint(n_items: int) -> Constraint:
    """`batched`'s structured output: after the prefill `1:`, exactly `n_items` verdicts, one line each
    (` yes`, then `\n2: no`, ..., up to `\nM: yes`)."""
    lines = " ?(yes|no)" + "".join(f"\\n{m}: (yes|no)" for m in range(2, n_items + 1))
    return Constraint.regex(lines)


def sheet_params(n_items: int, max_tokens: int, *, structured: bool = False) -> SamplingParams:
    """Greedy sampling for an answer sheet of `n_items` lines (see the module docstring). Structured: the sheet
    is constrained to exactly `n_items` lines (`sheet_constraint`), so end-of-sequence need not be held back."""
    budget = max_tokens * n_items
    if structured:
        return SamplingParams(temperature=0.0, max_tokens=budget, constraint=sheet_constraint(n_items))
    return SamplingParams(
        temperature=0.0,
        max_tokens=budget,
        min_tokens=min(budget, max(0, SHEET_TOKENS_PER_ITEM * n_items - 3)),
        stop=("\n\n", f"\n{n_items + 1}:"),
    )


_CRITERION = "\x00criterion\x00"


def item_question_parts(prompt: str, response: str) -> tuple[str, str]:
    """The `per_item` question split around its criterion: `(head, tail)`, so `head + criterion + tail` is the
    question `per_item` asks about that criterion."""
    text = render(load_template("verify_item"), prompt=prompt, response=response, criterion=_CRITERION)
    head, tail = text.split(_CRITERION)
    return head, tail


async def verify(
    backend: BaseBackend,
    prompt: str,
    responses: Sequence[str],
    rubric: Rubric,
    *,
    mode: VerifyMode = "per_item",
    max_tokens: int = 16,
    structured: bool = False,
) -> Verification:
    """Answer every item of `rubric` for every response.

    Args:
        backend: the verifier model.
        prompt: the prompt the responses answer (the verifier sees it).
        responses: the K responses, in input order.
        rubric: the M items (weights are not shown to the verifier).
        mode: `per_item`, `batched` or `logprob` (see the module docstring).
        max_tokens: token budget per verdict (`per_item`); a sheet gets `max_tokens * M`. Unused by `logprob`.
        structured: constrain the answers (`per_item`: `VERDICT_CHOICE`; `batched`: `sheet_constraint`) where
            the backend can; the parsers still read every answer.

    Returns:
        The verdict matrix (M x K), failures and request counts.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"unknown verify mode {mode!r}; valid: {', '.join(VERIFY_MODES)}")
    if mode == "logprob":
        return await _verify_logprob(backend, prompt, responses, rubric)
    n_items, k_resp = len(rubric), len(responses)
    verdicts: list[list[float | None]] = [[None] * k_resp for _ in range(n_items)]
    cells: list[tuple[int | None, int]]
    if mode == "per_item":
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, constraint=VERDICT_CHOICE if structured else None
        )
        cells = [(m, k) for k in range(k_resp) for m in range(n_items)]  # response-major: shared prefixes adjacent
        asks = [
            Ask(
                (Message("user", render_template(
                    "verify_item", prompt=prompt, response=responses[k], criterion=rubric.criteria[m]
                )),),
                params,
                lambda text: float(parse_yes_no(text)),
                lambda problem: render_template("retry_item", problem=problem),
            )
            for m, k in cells
        ]
    else:
        params = sheet_params(n_items, max_tokens, structured=structured)
        cells = [(None, k) for k in range(k_resp)]
        asks = [
            Ask(
                (Message("user", sheet_prompt(prompt, responses[k], rubric)),),
                params,
                lambda text: [float(v) for v in parse_answer_sheet(text, n_items)],
                lambda problem: render_template("retry_sheet", problem=problem, count=n_items),
                prefix=SHEET_PREFILL,
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
    return Verification(verdicts, tuple(failures), requests, calls, {"answers": answers, "retries": retries})


async def _verify_logprob(
    backend: BaseBackend, prompt: str, responses: Sequence[str], rubric: Rubric
) -> Verification:
    n_items, k_resp = len(rubric), len(responses)
    verdicts: list[list[float | None]] = [[None] * k_resp for _ in range(n_items)]
    mass: list[list[float | None]] = [[None] * k_resp for _ in range(n_items)]
    requests = []
    for response in responses:
        head, tail = item_question_parts(prompt, response)
        branches = tuple(c + tail for c in rubric.criteria)
        requests.append(LogprobRequest((Message("user", head),), branches=branches))
    results = await backend.next_token_logprobs(requests, YES_NO)
    if len(results) != len(requests):  # a broken backend, not a bad answer: never guess the alignment
        raise RuntimeError(f"backend {backend.model!r} returned {len(results)} results for {len(requests)}")
    failures = []
    for k, result in enumerate(results):
        if result.error is None and len(result.branches) != n_items:
            got = f"{len(result.branches)} branch results for {n_items} items"
            result = dataclasses.replace(result, error=Failure(FailureCategory.MALFORMED_RESPONSE, got))
        if result.error is not None:
            failures.append(StageFailure("verify", result.error, response=k))
            continue
        for m, top in enumerate(result.branches):
            mass[m][k] = sum(_yes_no(top))
            verdicts[m][k] = p_yes(top)
            if verdicts[m][k] is None:
                unranked = Failure(FailureCategory.PARSE, "neither Yes nor No among the next tokens ranked")
                failures.append(StageFailure("verify", unranked, response=k, item=m))
    calls = sum(not r.cached for r in results)
    return Verification(verdicts, tuple(failures), len(requests), calls, {"yes_no_mass": mass})
