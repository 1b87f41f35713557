"""WritingBench's per-criterion judge: one 1-10 score per query criterion (the scores: `benchmarks.writingbench_score`).

Upstream: GitHub `X-PLUG/WritingBench` (Apache-2.0; paper arXiv 2503.05244), snapshot `ae2d517` (2025-12-19):
`evaluate_benchmark.py`, `evaluator/llm.py`, `evaluator/critic.py`, `prompt.py` and `calculate_scores.py`.
Each query carries its own criteria (5 in every shipped file; `benchmarks.writingbench` loads them into
`meta["criteria"]`), abbreviated: `{"name": "Technical_Accuracy", "criteria_description": "...", "1-2": "...",
"3-4": "...", "5-6": "...", "7-8": "...", "9-10": "..."}`. One upstream score record (`evaluate_benchmark.py`,
`EVAL_TIMES = 1`): `{"index": 16, "scores": {"Technical_Accuracy": [{"score": 7, "reason": "..."}], ...}}`.

The protocol, as upstream runs it:
- One judge call per (response, criterion) (`evaluate_benchmark.py:process`), a system message
  (`prompt.py:evaluate_system`) and the prompt with the query, the response and the criterion
  (`EvalAgent.generate_score`). Upstream fills `{criteria}` with `str()` of the criterion dict, i.e. its
  Python repr with single quotes (`str.format` of a dict), and so does the judge here (`fill_upstream`).
- Before judging, the response loses everything up to the first `</think>\\n\\n` (`process_gen_field`): that
  exact marker, two newlines included; a `</think>` without them is left in, as upstream leaves it
  (`strip_think`).
- Sampling (`evaluator/llm.py:ClaudeAgent.run`, `evaluator/critic.py:CriticAgent.run`; README "Parameters for
  scoring"): temperature 1.0, top_p 0.95, max_tokens 2048. Here the sample is seeded from (seed, item id,
  criterion name).
- An answer is valid (`EvalAgent.success_check_fn_score`) when `json.loads(text.strip('json|```'))` gives an
  object with `score` and `reason`, `score in [1, ..., 10]` and `reason` a string (`parse_criterion_score`).
  So a fenced ```` ```json ```` block is read, text around the JSON is not, the string `"8"` and 7.5 are
  refused, and 8.0 counts as 8.
- Scores (`calculate_scores.py`): `benchmarks.writingbench_score`.

Deviations, stated:
- Retries: upstream samples the same prompt again, without a word on what was wrong, up to 5 times per
  `agent.run` and 3 runs (15 answers), then raises and stops the whole evaluation. Here an unreadable or
  out-of-range answer is re-asked once with the complaint (`retry_writingbench.txt`) and then recorded as a
  PARSE failure (attempts=2); failed criteria are counted (`n_failed`) and left out of every mean, a query
  with none scored is in no query-level mean. HTTP faults are retried by the backend.
- The judge's own reasoning block (text up to its last `</think>`) is dropped before parsing, so a thinking
  judge can be used (upstream's judges do not think); whitespace around the answer is stripped first. A JSON
  `true` is refused as a score (upstream's `True in [1, ...]` takes it as 1).
- The prompt is ours (`judges/prompts/writingbench_criterion.txt`, one user turn) unless `template` names
  upstream's two `prompt.py` strings written out as files (`evaluate_prompt.txt`, `evaluate_system.txt`).
  `structured=True` (default) also sends a JSON schema (integer score 1..10, string reason).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.backends.base import Constraint, Message, SamplingParams
from harness.errors import ConfigError, Failure
from harness.seeds import derive_seed
from judges.templates import render_template
from judges.ask import Ask, ask_all

if TYPE_CHECKING:
    from benchmarks.base import PolicyItem
    from harness.backends.base import BaseBackend

__all__ = [
    "SCORE_CONSTRAINT",
    "THINK_MARKER",
    "WritingBenchJudge",
    "WritingBenchJudgment",
    "fill_upstream",
    "parse_criterion_score",
    "read_upstream_template",
    "strip_think",
]

THINK_MARKER = "</think>\n\n"
"""What upstream's `process_gen_field` cuts a response after (its first occurrence)."""
UPSTREAM_PROMPT = "evaluate_prompt.txt"
UPSTREAM_SYSTEM = "evaluate_system.txt"
_SCORES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)  # upstream's `valid_score_values`: `in` takes 8.0, not 7.5
_FENCE_CHARS = "json|`"  # the character set of upstream's `strip('json|```')`
_UPSTREAM_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_UPSTREAM_SLOTS = ("query", "response", "criteria")

SCORE_CONSTRAINT = Constraint.json_schema(
    {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 1, "maximum": 10},
            "reason": {"type": "string"},
        },
        "required": ["score", "reason"],
        "additionalProperties": False,
    },
    name="writingbench_score",
    think=True,
)
"""`structured=True`: the answer is `{"score": <1..10>, "reason": "..."}`, after any reasoning block."""


def strip_think(response: str) -> str:
    """The response as upstream shows it to the judge: after the first `</think>\\n\\n`, if any
    (`evaluate_benchmark.py:process_gen_field`)."""
    at = response.find(THINK_MARKER)
    return response if at < 0 else response[at + len(THINK_MARKER):]


def parse_criterion_score(text: str) -> tuple[int, str]:
    """(score, reason) of one judge answer, valid as upstream's `success_check_fn_score` checks it.

    The judge's reasoning (up to its last `</think>`) and surrounding whitespace are dropped; then upstream's
    `strip('json|```')` and `json.loads`. The object needs `score` in 1..10 (an integer; 8.0 counts as 8, as
    `8.0 in [1, ..., 10]` does upstream) and a string `reason`.

    Raises:
        ValueError: saying what is wrong (the complaint sent on the re-ask).
    """
    end = text.rfind("</think>")
    answer = (text if end < 0 else text[end + len("</think>"):]).strip()
    if "<think>" in answer:
        raise ValueError("the answer ended inside <think> before giving the JSON object")
    if not answer:
        raise ValueError('the answer is empty; expected a JSON object {"score": ..., "reason": ...}')
    try:
        result = json.loads(answer.strip(_FENCE_CHARS))
    except ValueError:
        raise ValueError(
            "the answer is not a JSON object (write only the object, optionally in a ```json fence, with no "
            f"text before or after it): {answer[:80]!r}"
        ) from None
    # ValueError throughout, not TypeError: `ask_all` re-asks on a ValueError, its message the complaint.
    if not isinstance(result, dict):
        kind = type(result).__name__
        raise ValueError(f"the answer is JSON but a {kind}, not an object with score, reason")  # noqa: TRY004
    missing = [k for k in ("score", "reason") if k not in result]
    if missing:
        raise ValueError(f"the JSON object lacks {' and '.join(repr(k) for k in missing)}")
    score = result["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or score not in _SCORES:
        kind = " (a string)" if isinstance(score, str) else ""
        raise ValueError(f"score must be an integer from 1 to 10, got {score!r}{kind}")
    if not isinstance(result["reason"], str):
        raise ValueError(f"reason must be a string, got {type(result['reason']).__name__}")  # noqa: TRY004
    return int(score), result["reason"]


# --- upstream's prompt files ---


def fill_upstream(template: str, *, query: str, response: str, criteria: str) -> str:
    """Upstream's `evaluate_prompt.format(query=..., response=..., criteria=...)`, in one pass over the
    template: `{{`/`}}` become braces, the three fields their values, and inserted texts are never read again.

    Raises:
        ConfigError: for another field or a lone brace (`str.format` would raise too).
    """
    values = {"query": query, "response": response, "criteria": criteria}

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        if m.group(1) in values:
            return values[m.group(1)]
        raise ConfigError(f"the WritingBench prompt template has {token!r}; it takes only "
                          f"{', '.join('{' + s + '}' for s in _UPSTREAM_SLOTS)} (and {{{{ }}}} for braces)")

    return _UPSTREAM_FIELD.sub(one, template)


def read_upstream_template(template: str | Path, system: str | Path | None = None) -> tuple[str, str]:
    """(system message, prompt template) of upstream's `prompt.py`, both stripped as upstream strips them.

    Args:
        template: A folder holding `evaluate_prompt.txt` and `evaluate_system.txt`, or the prompt file itself
            (the system file is then the `evaluate_system.txt` beside it).
        system: Another system prompt file.

    Raises:
        ConfigError: when a file cannot be read, or the prompt lacks one of `{query}`, `{response}`,
            `{criteria}` or has another field.
    """
    path = Path(template)
    prompt_path = path / UPSTREAM_PROMPT if path.is_dir() else path
    system_path = Path(system) if system is not None else prompt_path.parent / UPSTREAM_SYSTEM
    texts = []
    for what, p in (("system prompt", system_path), ("prompt", prompt_path)):
        try:
            texts.append(p.read_text(encoding="utf-8").strip())
        except OSError as exc:
            raise ConfigError(f"cannot read the WritingBench {what} {p}: {exc.strerror}") from None
    found = {m.group(1) for m in _UPSTREAM_FIELD.finditer(texts[1]) if m.group(1) is not None}
    if not set(_UPSTREAM_SLOTS) <= found:
        raise ConfigError(f"{prompt_path}: a WritingBench prompt needs {{query}}, {{response}} and "
                          f"{{criteria}}; found {sorted(found)}")
    fill_upstream(texts[1], query="", response="", criteria="")  # another field fails here, not mid-run
    return texts[0], texts[1]


# --- the judge ---


@dataclass(frozen=True, slots=True)
class WritingBenchJudgment:
    """The judge's scores of one response, one per criterion of its query."""

    item: str
    """The `PolicyItem` id."""
    scores: dict[str, int | None]
    """Criterion name -> 1..10, in the query's criteria order; None where the criterion failed."""
    reasons: dict[str, str | None]
    """Criterion name -> the judge's `reason`; None where the criterion failed."""
    failures: dict[str, Failure] = field(default_factory=dict)
    """Criterion name -> why it has no score (the backend's failure, or PARSE after the re-ask)."""
    raw: dict[str, Any] = field(default_factory=dict)
    """`answers` (criterion name -> the judge's texts, first and, if re-asked, second), `retries` (criterion
    name -> the complaint sent) and `think_stripped` (whether the response lost a `</think>` block)."""

    @property
    def score(self) -> float | None:
        """The query score: the mean of the scored criteria; None when none was scored."""
        found = [s for s in self.scores.values() if s is not None]
        return sum(found) / len(found) if found else None

    @property
    def failure(self) -> Failure | None:
        """The first criterion's failure when none was scored (the response has no score); else None."""
        if self.score is not None or not self.failures:
            return None
        return next(iter(self.failures.values()))

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "scores": dict(self.scores), "reasons": dict(self.reasons),
                "failures": {k: f.to_json() for k, f in self.failures.items()}, "raw": self.raw}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WritingBenchJudgment:
        failures = {k: Failure.from_json(f) for k, f in data.get("failures", {}).items()}
        raw = dict(data.get("raw", {}))
        return cls(data["item"], dict(data["scores"]), dict(data["reasons"]), failures, raw)


class WritingBenchJudge:
    """WritingBench's judge: each criterion of a query scored 1-10 in its own call (see the module docstring).

    Args:
        backend: The judge model.
        template: None for our prompt; else upstream's prompt files (`read_upstream_template`).
        system: With `template`, another system prompt file.
        structured: Send `SCORE_CONSTRAINT` where the backend can (the parser reads every answer anyway).
        temperature, top_p, max_tokens: The judge's sampling (upstream's scoring parameters by default).

    Raises:
        ConfigError: for unreadable template files or sampling settings out of range.
    """

    def __init__(self, backend: BaseBackend, *, template: str | None = None, system: str | None = None,
                 structured: bool = True, temperature: float = 1.0, top_p: float = 0.95,
                 max_tokens: int = 2048) -> None:
        if system is not None and template is None:
            raise ConfigError("WritingBench judge: `system` goes with `template` (our prompt has no system "
                              "turn)")
        try:
            self._params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                          constraint=SCORE_CONSTRAINT if structured else None)
        except ValueError as exc:
            raise ConfigError(f"WritingBench judge: {exc}") from None
        self.backend = backend
        self.template, self.system = template, system
        self._upstream = read_upstream_template(template, system) if template else None
        self.structured = structured
        self.requests = 0
        """Requests sent to the backend (re-asks included)."""

    @property
    def settings(self) -> dict[str, Any]:
        """What the judgment depends on besides the judge model (recorded with every judgment)."""
        p = self._params
        return {"template": self.template or "ours", "system": self.system, "structured": self.structured,
                "temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}

    def messages(self, query: str, response: str, criterion: Mapping[str, Any]) -> tuple[Message, ...]:
        """The judge's chat for one criterion; `response` as judged (see `strip_think`)."""
        if self._upstream is not None:
            system, template = self._upstream
            text = fill_upstream(template, query=query, response=response, criteria=str(dict(criterion)))
            return (Message("system", system), Message("user", text))
        text = render_template(
            "writingbench_criterion", query=query, response=response, criterion_name=criterion["name"],
            criterion_description=criterion["criteria_description"], band_1_2=criterion["1-2"],
            band_3_4=criterion["3-4"], band_5_6=criterion["5-6"], band_7_8=criterion["7-8"],
            band_9_10=criterion["9-10"],
        )
        return (Message("user", text),)

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        del text
        names = [c["name"] for c in item.meta["criteria"]]
        scores = tuple(None if j.scores.get(n) is None else float(j.scores[n]) for n in names)
        failures = tuple((f"judge criterion {n!r}", f) for n, f in j.failures.items())
        return scores, {"judgment": j.to_json()}, failures

    async def judge_all(
        self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int
    ) -> list[WritingBenchJudgment]:
        """Score every (item, response) pair on each of the item's criteria: all calls in one batch (item by
        item, so the calls sharing a query and response are adjacent), then one re-ask batch; aligned with
        `pairs`."""
        asks: list[list[Ask]] = []
        for item, output in pairs:
            query, response = item.messages[-1].content, strip_think(output)
            row = []
            for criterion in item.meta["criteria"]:
                params = _seeded(self._params, derive_seed(seed, item.id, criterion["name"]))
                row.append(Ask(self.messages(query, response, criterion), params, parse_criterion_score,
                               lambda problem: render_template("retry_writingbench", problem=problem)))
            asks.append(row)
        requests, _ = await ask_all(self.backend, [a for row in asks for a in row])
        self.requests += requests
        out = []
        for (item, output), row in zip(pairs, asks):
            names = [c["name"] for c in item.meta["criteria"]]
            scores: dict[str, int | None] = {}
            reasons: dict[str, str | None] = {}
            failures = {}
            for name, ask in zip(names, row):
                scored = ask.failure is None
                scores[name], reasons[name] = ask.result if scored else (None, None)
                if not scored:
                    failures[name] = ask.failure
            raw = {"answers": {n: list(a.texts) for n, a in zip(names, row)},
                   "retries": {n: a.problem for n, a in zip(names, row) if a.problem is not None},
                   "think_stripped": strip_think(output) != output}
            out.append(WritingBenchJudgment(item.id, scores, reasons, failures, raw))
        return out


def _seeded(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
                          seed=seed, constraint=params.constraint)
