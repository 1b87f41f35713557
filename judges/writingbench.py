"""WritingBench: the per-criterion judge (one 1-10 score per query criterion) and the benchmark's scores.

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
- Scores (`calculate_scores.py`), all on the 1-10 scale; the leaderboard prints them x10 (README: "scaled from
  10 to 100 by multiplying by 10"), here `overall_x10` and `LEADERBOARD_SCALE`:
  - query score: mean of its criterion scores (`read_scores_file`, `scores_data`);
  - overall: mean of ALL criterion scores, not of the query means (`read_scores_file`, `overall_avg`);
  - per domain (`domain1`, and `domain2`): mean of the query scores in it (`calculate_domain_scores`);
  - requirement dimensions (`calculate_requirement_scores`): `<dim>_R` = mean query score over the queries of
    `<dim>_subset.jsonl`; `<dim>_C` = mean, over those queries, of the scores of the criteria that
    `<dim>_subset_C.jsonl` lists for the query, looked up by criterion `name`.

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
- `<dim>_R` / `<dim>_C` with no query are None here (upstream prints 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.writingbench import DIMENSIONS
from harness.backends.base import Constraint, Message, SamplingParams
from harness.errors import ConfigError, Failure
from harness.seeds import derive_seed
from judges.templates import render_template
from judges.verify import Ask, ask_all

if TYPE_CHECKING:
    from benchmarks.base import PolicyItem
    from harness.backends.base import Backend

__all__ = [
    "DOMAIN1_ORDER",
    "LEADERBOARD_SCALE",
    "SCORE_CONSTRAINT",
    "THINK_MARKER",
    "RequirementScore",
    "WritingBenchJudge",
    "WritingBenchJudgment",
    "WritingBenchResult",
    "fill_upstream",
    "parse_criterion_score",
    "read_upstream_template",
    "requirement_score",
    "strip_think",
    "writingbench_result",
]

LEADERBOARD_SCALE = 10
"""The leaderboard prints every score x this (1-10 -> 10-100)."""
THINK_MARKER = "</think>\n\n"
"""What upstream's `process_gen_field` cuts a response after (its first occurrence)."""
DOMAIN1_ORDER = ("Academic & Engineering", "Finance & Business", "Politics & Law", "Literature & Arts",
                 "Education", "Advertising & Marketing")
"""`calculate_scores.py:DOMAIN1_ORDER`, the column order of the domain scores."""
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

    def __init__(self, backend: Backend, *, template: str | None = None, system: str | None = None,
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


# --- scores ---


@dataclass(frozen=True, slots=True)
class RequirementScore:
    """One requirement dimension's scores (`calculate_scores.py:calculate_requirement_scores`), 1-10."""

    r_score: float | None
    """`<dim>_R`: mean query score over the subset's queries that have one; None when none has."""
    c_score: float | None
    """`<dim>_C`: mean score of the `_C` criteria of those queries; None when none was scored."""
    n_queries: int
    """Queries in `r_score`."""
    n_criteria: int
    """Criterion scores in `c_score`."""
    n_criteria_failed: int
    """`_C` criteria of those queries that failed (left out of `c_score`)."""
    n_queries_failed: int
    """Subset queries judged with no criterion scored (in neither mean)."""
    n_not_judged: int
    """Subset queries without a judgment (upstream skips them too)."""


@dataclass(frozen=True, slots=True)
class WritingBenchResult:
    """A policy's WritingBench scores on the 1-10 scale (the leaderboard shows them x`LEADERBOARD_SCALE`)."""

    overall: float | None
    """Mean of all scored criterion scores (upstream `Overall`); None when none was scored."""
    overall_x10: float | None
    """`overall` x 10, as the leaderboard prints it."""
    domain1: dict[str, float]
    """Mean query score per primary domain (`DOMAIN1_ORDER` first, then any other, in order of appearance)."""
    domain1_n: dict[str, int]
    """Queries with a score per primary domain."""
    domain2: dict[str, float]
    """Mean query score per sub-domain."""
    requirements: dict[str, RequirementScore]
    """Per requirement dimension asked for (`style`, `format`, `length`)."""
    n_queries: int
    """Judged queries with at least one scored criterion (upstream `Count`)."""
    n_queries_failed: int
    """Judged queries with no criterion scored (in no mean)."""
    n_criteria: int
    """Scored criteria (the `overall` mean's count)."""
    n_failed: int
    """Failed criteria, left out of every mean."""
    n_not_judged: int
    """Items given without a judgment."""

    def to_json(self) -> dict[str, Any]:
        """The fields, with each dimension as upstream's `<dim>_R` / `<dim>_C` (and its counts)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "requirements"}
        for dim, r in self.requirements.items():
            out[f"{dim}_R"], out[f"{dim}_C"] = r.r_score, r.c_score
            out[f"{dim}_n"] = {k: getattr(r, k) for k in r.__slots__ if k not in ("r_score", "c_score")}
        return out


def _by_item(judgments: Sequence[WritingBenchJudgment]) -> dict[str, WritingBenchJudgment]:
    found: dict[str, WritingBenchJudgment] = {}
    for j in judgments:
        if j.item in found:
            raise ConfigError(f"two WritingBench judgments for item {j.item!r}")
        found[j.item] = j
    return found


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def requirement_score(judgments: Sequence[WritingBenchJudgment], subset: Sequence[PolicyItem],
                      subset_c: Sequence[PolicyItem]) -> RequirementScore:
    """`<dim>_R` and `<dim>_C` of one dimension from `subset` (`<dim>_subset.jsonl`) and `subset_c`
    (`<dim>_subset_C.jsonl`); the `_C` criteria are looked up by `name` among the judged ones.

    Raises:
        ConfigError: for a judged subset query missing from `subset_c`, or a `_C` criterion the query's
            judgment does not have (both `KeyError` upstream).
    """
    judged = _by_item(judgments)
    c_names = {item.id: [c["name"] for c in item.meta["criteria"]] for item in subset_c}
    r, c = [], []
    failed = queries_failed = not_judged = 0
    for item in subset:
        j = judged.get(item.id)
        if j is None:
            not_judged += 1
            continue
        if j.score is None:
            queries_failed += 1
            continue
        r.append(j.score)
        if item.id not in c_names:
            raise ConfigError(f"WritingBench requirement subset: {item.id} is not in the _C file")
        for name in c_names[item.id]:
            if name not in j.scores:
                raise ConfigError(
                    f"WritingBench requirement subset: {item.id} has no judged criterion {name!r}"
                )
            if j.scores[name] is None:
                failed += 1
            else:
                c.append(j.scores[name])
    return RequirementScore(_mean(r), _mean(c), len(r), len(c), failed, queries_failed, not_judged)


def writingbench_result(
    judgments: Sequence[WritingBenchJudgment], items: Sequence[PolicyItem], *,
    requirements: Mapping[str, tuple[Sequence[PolicyItem], Sequence[PolicyItem]]] | None = None,
) -> WritingBenchResult:
    """All WritingBench scores of one policy (`calculate_scores.py`; see the module docstring).

    Args:
        judgments: One per judged item.
        items: The items judged (their domains and criteria); items without a judgment are counted only.
        requirements: Dimension (`style`, `format`, `length`) -> (the `<dim>` subset's items, the `<dim>_C`
            subset's items), for `<dim>_R` / `<dim>_C`.

    Raises:
        ConfigError: for a judgment of an unknown item, two of one item, criteria that are not the item's, or
            an unknown dimension.
    """
    by_id = {item.id: item for item in items}
    judged = _by_item(judgments)
    for j in judgments:
        if j.item not in by_id:
            raise ConfigError(f"a WritingBench judgment for {j.item!r}, which is not among the items")
        extra = set(j.scores) - {c["name"] for c in by_id[j.item].meta["criteria"]}
        if extra:
            raise ConfigError(
                f"the WritingBench judgment of {j.item} scores criteria the item lacks: {sorted(extra)}"
            )
    every: list[int] = []
    d1: dict[str, list[float]] = {d: [] for d in DOMAIN1_ORDER}
    d2: dict[str, list[float]] = {}
    failed = queries_failed = 0
    for item in items:
        j = judged.get(item.id)
        if j is None:
            continue
        failed += len(j.failures)
        every += [s for s in j.scores.values() if s is not None]
        if j.score is None:
            queries_failed += 1
            continue
        d1.setdefault(item.meta["domain1"], []).append(j.score)
        d2.setdefault(item.meta["domain2"], []).append(j.score)
    reqs = {}
    for dim, (subset, subset_c) in (requirements or {}).items():
        if dim not in DIMENSIONS:
            raise ConfigError(
                f"unknown WritingBench requirement dimension {dim!r}; valid: {', '.join(DIMENSIONS)}"
            )
        reqs[dim] = requirement_score(judgments, subset, subset_c)
    overall = _mean(every)
    return WritingBenchResult(
        overall=overall,
        overall_x10=None if overall is None else overall * LEADERBOARD_SCALE,
        domain1={d: _mean(v) for d, v in d1.items() if v},  # type: ignore[misc]
        domain1_n={d: len(v) for d, v in d1.items() if v},
        domain2={d: _mean(v) for d, v in d2.items()},  # type: ignore[misc]
        requirements=reqs,
        n_queries=len(judged) - queries_failed,
        n_queries_failed=queries_failed,
        n_criteria=len(every),
        n_failed=failed,
        n_not_judged=len(by_id) - len(judged),
    )
