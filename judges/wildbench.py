"""WildBench v2's checklist judge: its 1-10 answer read, the judge that asks for it (scored by
`benchmarks.wildbench_score`).

Upstream: `allenai/WildBench` (GitHub, Apache-2.0), snapshot `d6b8dcaf` (2024-08-01); the task set (with
`checklist`, `primary_tag`, `secondary_tags`) is the Hugging Face dataset `allenai/WildBench`, config `v2`,
1,024 tasks. This module reads a judgment (`parse_judgment`) and holds the judge (`WildBenchJudge`); the
leaderboard's scores (WB-Score, groups, task-macro) are computed in `benchmarks.wildbench_score`.

One per-task judge record (`eval_results/v2.0625/score.v2/eval=gpt-4o-2024-05-13/*.json`, abbreviated):
`{"session_id": "ae006110bb364606", "model_test": "gpt-3.5-turbo-0125", "score": "8", "model_output": "...",
"parsed_result": {"strengths": "...", "weaknesses": "...", "score": "8"}}`.

Official scoring rule, as the upstream code computes it (`leaderboard/data_dir/_create_tables.py`, `score` mode):
- The judge answers `{"strengths": ..., "weaknesses": ..., "score": "1~10"}`. Upstream's batch path
  (`src/openai_batch_eval/batch_results_format.py`), which produced the published results, runs the judge in
  JSON mode and keeps a judgment only if `json.loads` succeeds and the object has a `score`; the live path
  (`src/eval.py:parse_result`) falls back to a regex over the text (`src/eval.py:extract_values_from_json`)
  when `json.loads` fails. `parse_judgment` follows the live path: JSON first, then the regex, which reads only
  a *quoted* value (`"score": "7"`), the first one in the text. When the text is valid JSON the regex is not
  tried, even if the object lacks `score`. The score is `float(value)`.
- An empty response (blank after stripping) is not sent to the judge: its judgment is fixed to
  `EMPTY_OUTPUT_JUDGMENT`, score 1 (`src/eval.py:placeholder_generation`). Upstream's batch path sends it to
  the judge anyway; the one empty response in the published results (gemma-7b-it's) was judged 1 as well.
- WB-Score: `score` = mean raw score over the scored tasks, `adjusted_score` = (mean - 5) * 2; the leaderboard
  shows it x10 (`leaderboard/data_dir/_merge_results.py:merge_scores`). Tasks without a judgment are not in the
  file upstream, so they are in no mean; `total` = the number of scored tasks.
- Task groups: `primary_tag` and `secondary_tags` are mapped to five groups (`task_group_new`) and deduplicated,
  so a task counts once in each group any of its tags maps to. A task whose response was truncated for the
  judge (its shown text ends with `... (truncated)`, see `src/eval.py:shorten`) or is empty counts in the
  overall mean but in no group, and not in `avg_len` (mean characters of the shown response). A group's score
  is the adjusted mean of its tasks.
- Task-macro score: sum over the groups present of group score x weight (Creative Tasks 0.5, Planning &
  Reasoning 1.25, Math & Data Analysis 1.0, Information/Advice seeking 0.75, Coding & Debugging 1.25),
  divided by the sum of all five weights (4.75): a group with no task adds 0 and is not renormalised away.

Deviations, stated:
- A score outside 1..10 (or not finite, or a JSON boolean) is a parse failure here; upstream takes any value
  `float()` accepts. No judgment in the two shipped per-task files (gpt-3.5-turbo-0125, gemma-7b-it) is
  outside 1..10, so their published numbers do not change. A value `float()` rejects (`"8/10"`) crashes the upstream leaderboard script; here it is a failure.
- A failed judgment is counted in `n_failed` instead of vanishing from the results file.

The judge (`WildBenchJudge`), as `src/eval.py` builds and sends the score-mode request:
- One user message per task (the batch path's body, which produced the published results; the live path also
  sends the system message "You are a helpful AI assistant."), greedy (`--temperature 0`), `max_tokens=1024`
  (`--max_tokens`; the score scripts `evaluation/run_eval_v2_*.score.sh` change neither).
- The prompt's inputs (`placeholder_generation`, `score` mode): `history` and `user_query` as the loader builds
  them (`compose_eval_item`), the output, and the checklist as one `- item\n` line per checklist item. History,
  query and output are each cut by `shorten` to `max_words` words, marked with `TRUNCATION_MARKER`; the score
  scripts pass `--max_words_to_eval -1` (no cut), so that is the default here (argparse's 1000 is what the
  pairwise scripts pass). The output as shown to the judge is what the group rule reads (the batch path cuts
  `model_output` out of the prompt it sent, `batch_results_format.py`).
- Our prompt (`judges/prompts/wildbench_score.txt`) by default; `template=PATH` reads upstream's
  `evaluation/eval_template.score.v2.md` (placeholders `{$history}`, `{$user_query}`, `{$model_output}`,
  `{$checklist}`). Deviation: upstream fills it by four `str.replace` calls in a row, so a `{$...}` inside an
  inserted text would be filled again; here all four are filled in one pass (the same prompt for every text
  that holds no placeholder).
- An empty output (`is_empty_output`) gets `EMPTY_OUTPUT_JUDGMENT` and no request, as `placeholder_generation`
  intends. (Both upstream paths in fact send it anyway: the batch file lists every task, and `run_eval` only
  skips a task that already has a `parsed_result`, which the placeholder lacks.)
- `structured=True` (default) asks for a JSON schema: `strengths` and `weaknesses` strings, then `score` as
  one of the strings "1".."10". The string form is the form upstream's template asks for and every published
  judgment has (`"score": "8"`); an enum of strings says "a whole number 1..10" in every schema dialect (strict
  OpenAI schemas, vLLM, llama.cpp), where integer bounds are not honoured everywhere. Upstream's judge ran in
  JSON mode (`json_object`, no schema). The properties keep that order (score last, after the analysis) on
  every backend: `Constraint.json_schema` keeps the order of `properties`. The parser reads every answer either
  way; a reasoning block (`<think>...</think>`) before the answer is skipped.
- An answer `parse_judgment` cannot read is asked again once with the complaint
  (`judges/prompts/retry_wildbench.txt`), then recorded as a PARSE failure; upstream has no re-ask (the batch
  path drops the task, the live path records `{"N/A": "N/A"}`). A score is never defaulted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.wildbench_score import TRUNCATION_MARKER, TaskScore, counts_in_groups
from harness.backends.base import Constraint, Message, SamplingParams
from harness.errors import ConfigError, Failure
from judges.templates import render_template
from judges.ask import Ask, ask_all

if TYPE_CHECKING:
    from benchmarks.base import PolicyItem
    from harness.backends.base import BaseBackend

__all__ = [
    "EMPTY_OUTPUT_JUDGMENT",
    "GROUPS",
    "GROUP_WEIGHTS",
    "JUDGE_MAX_TOKENS",
    "LEADERBOARD_SCALE",
    "SCORE_CONSTRAINT",
    "SCORE_SCHEMA",
    "TASK_GROUPS",
    "TRUNCATION_MARKER",
    "UPSTREAM_PLACEHOLDERS",
    "Judgment",
    "TaskScore",
    "WBScoreResult",
    "WildBenchJudge",
    "WildBenchJudgment",
    "checklist_markdown",
    "counts_in_groups",
    "fill_upstream_template",
    "is_empty_output",
    "parse_judgment",
    "parse_score",
    "read_upstream_template",
    "shorten",
    "task_groups",
    "task_macro_score",
    "wb_result",
    "wb_score",
    "wildbench_result",
]

EMPTY_OUTPUT_JUDGMENT = json.dumps(
    {"strengths": "N/A", "weaknesses": "The model output is empty.", "score": "1"}
)
"""The judgment upstream records for an empty response instead of calling the judge (score 1)."""

_QUOTED_SCORE = re.compile(r'"score"\s*:\s*"([^"]*)"')
_SCORE_RANGE = (1.0, 10.0)


@dataclass(frozen=True, slots=True)
class Judgment:
    """One parsed judge answer."""

    score: float | None
    """The 1-10 score; None when the answer could not be read (see `error`)."""
    strengths: str | None = None
    """The `strengths` text when the answer was JSON and it is a string."""
    weaknesses: str | None = None
    """The `weaknesses` text when the answer was JSON and it is a string."""
    fallback: bool = False
    """Whether the score was read by the regex fallback (the answer was not valid JSON)."""
    error: str | None = None
    """Why there is no score; None when there is one."""


def parse_judgment(text: str) -> Judgment:
    """Read a WB-Score judgment as `src/eval.py:parse_result` and `extract_values_from_json` do.

    `json.loads` of the stripped text first; if that fails, the first quoted `"score": "..."` in the text.
    The value must be a number in 1..10, or a string `float()` reads as one (see the module docstring).
    """
    stripped = text.strip()
    try:
        parsed = json.loads(stripped)
    except ValueError:
        match = _QUOTED_SCORE.search(stripped)
        if match is None:
            reason = "the reply is empty" if not stripped else 'not JSON, and no quoted "score" value found'
            return Judgment(None, error=reason)
        return _with_score(match.group(1), fallback=True)
    if not isinstance(parsed, dict):
        return Judgment(None, error=f"the reply is JSON but not an object ({type(parsed).__name__})")
    if "score" not in parsed:
        return Judgment(None, error='the JSON object has no "score"')
    strengths, weaknesses = parsed.get("strengths"), parsed.get("weaknesses")
    return _with_score(
        parsed["score"],
        fallback=False,
        strengths=strengths if isinstance(strengths, str) else None,
        weaknesses=weaknesses if isinstance(weaknesses, str) else None,
    )


def parse_score(text: str) -> float | None:
    """The score of a judgment (`parse_judgment(text).score`): a float in 1..10, or None when unreadable."""
    return parse_judgment(text).score


def _with_score(value: Any, *, fallback: bool, **texts: str | None) -> Judgment:
    """A `Judgment` from the raw `score` value, or one with the reason it is not a 1..10 score."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return Judgment(None, fallback=fallback, error=f"score is not a number: {value!r}")
    try:
        score = float(value)
    except ValueError:
        return Judgment(None, fallback=fallback, error=f"score is not a number: {value!r}")
    low, high = _SCORE_RANGE
    if not low <= score <= high:  # also rejects NaN
        return Judgment(None, fallback=fallback, error=f"score {value!r} is outside 1..10")
    return Judgment(score, fallback=fallback, **texts)


def is_empty_output(output: str) -> bool:
    """Whether a response is empty for upstream (`src/eval.py:placeholder_generation`: blank after stripping).

    Such a response is scored by `EMPTY_OUTPUT_JUDGMENT` instead of a judge call.
    """
    return not output.strip()




# --- the judge: one checklist-guided 1-10 score per (task, policy output) ---

JUDGE_MAX_TOKENS = 1024
"""The judge's token budget (`src/eval.py`, `--max_tokens`; the score scripts keep it)."""
UPSTREAM_PLACEHOLDERS = ("history", "user_query", "model_output", "checklist")
"""The slots of upstream's `eval_template.score.v2.md`, written `{$name}` there."""
_UPSTREAM_SLOT = re.compile(r"\{\$([A-Za-z_]+)\}")

SCORE_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "strengths": {"type": "string"},
        "weaknesses": {"type": "string"},
        "score": {"type": "string", "enum": [str(n) for n in range(1, 11)]},
    },
    "required": ["strengths", "weaknesses", "score"],
    "additionalProperties": False,
}
"""The structured answer: two strings, then the score as one of "1".."10" (see the module docstring)."""
SCORE_CONSTRAINT = Constraint.json_schema(SCORE_SCHEMA, name="wb_score", think=True)
"""`SCORE_SCHEMA` with its property order (the score last, after what it rests on) and an optional reasoning block."""


def shorten(text: str, max_words: int) -> str:
    """`src/eval.py:shorten`: the first `max_words` words (split on single spaces, as upstream) followed by
    `TRUNCATION_MARKER` when the text has more; unchanged when it has fewer or `max_words` <= 0."""
    words = text.split(" ")
    if max_words > 0 and len(words) > max_words:
        return " ".join(words[:max_words]) + TRUNCATION_MARKER
    return text


def checklist_markdown(checklist: Sequence[str]) -> str:
    """The checklist as `src/eval.py:placeholder_generation` writes it: one `- item` line each, newline-ended."""
    return "".join(f"- {entry}\n" for entry in checklist)


def read_upstream_template(path: str | Path) -> str:
    """The text of upstream's score template file, checked to hold exactly its four `{$...}` placeholders.

    Raises:
        ConfigError: when the file cannot be read or its placeholders differ (e.g. the pairwise template).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the WildBench template {path}: {exc.strerror}") from None
    found = set(_UPSTREAM_SLOT.findall(text))
    if found != set(UPSTREAM_PLACEHOLDERS):
        raise ConfigError(
            f"{path}: a WildBench score template needs exactly the placeholders "
            f"{', '.join('{$' + n + '}' for n in UPSTREAM_PLACEHOLDERS)}; found {sorted(found)}"
        )
    return text


def fill_upstream_template(template: str, **values: str) -> str:
    """Upstream's score template with every `{$name}` replaced by `values[name]`, in one pass over the template
    (an inserted text holding `{$history}` is copied as it is, never filled again).

    Raises:
        ValueError: when the values are not exactly the four `UPSTREAM_PLACEHOLDERS`.
    """
    if set(values) != set(UPSTREAM_PLACEHOLDERS):
        raise ValueError(f"the WildBench template takes {', '.join(UPSTREAM_PLACEHOLDERS)}; got {sorted(values)}")
    return _UPSTREAM_SLOT.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def _read_answer(text: str) -> Judgment:
    """A judge answer with a score, for `Ask`: reasoning before the last `</think>` is skipped, the rest goes to
    `parse_judgment`; raises `ValueError` (the complaint for the re-ask) when there is no 1..10 score."""
    answer = text[text.rfind("</think>") + len("</think>"):] if "</think>" in text else text
    if "<think>" in answer:
        raise ValueError("the answer ended inside <think> before giving the JSON object")
    judgment = parse_judgment(answer)
    if judgment.score is None:
        raise ValueError(judgment.error or "no score")
    return judgment


@dataclass(frozen=True, slots=True)
class WildBenchJudgment:
    """The judge's score for one (task, policy output) pair."""

    item: str
    """The `PolicyItem` id."""
    score: float | None
    """The 1-10 score; 1 for an empty output (not judged); None when the judgment failed (see `failure`)."""
    shown: str
    """The output as the judge saw it (after `shorten`): what `counts_in_groups` and `avg_len` read."""
    judged: bool = True
    """False for an empty output, scored by `EMPTY_OUTPUT_JUDGMENT` without a request."""
    failure: Failure | None = None
    """Why there is no score: the backend's failure, or PARSE after the re-ask."""
    raw: dict[str, Any] = field(default_factory=dict)
    """`answers`: the judge's answers (first and, if re-asked, second); `fallback`: whether the score was read
    by upstream's regex fallback (the answer was not valid JSON); `fixed`: the judgment of an empty output."""

    def task_score(self, item: PolicyItem) -> TaskScore:
        """The `wb_result` input of this judgment, with the task's tags (`primary_tag`, then `secondary_tags`)."""
        if item.id != self.item:
            raise ConfigError(f"judgment of {self.item} paired with task {item.id}")
        return TaskScore(self.score, (item.meta["primary_tag"], *item.meta["secondary_tags"]), self.shown)


class WildBenchJudge:
    """WildBench v2's WB-Score judge: each policy output scored 1-10 against the task's checklist.

    The prompt is ours (`judges/prompts/wildbench_score.txt`) unless `template` names upstream's
    `eval_template.score.v2.md`. `max_words` cuts history, query and output as `src/eval.py:shorten` does
    (<= 0: no cut, the score scripts' `-1`). `structured` asks the backend for `SCORE_SCHEMA`. See the module
    docstring for the upstream rules and the deviations.
    """

    def __init__(self, backend: BaseBackend, *, template: str | Path | None = None, structured: bool = True,
                 max_tokens: int = JUDGE_MAX_TOKENS, max_words: int = -1) -> None:
        if max_tokens < 1:
            raise ConfigError(f"WildBench judge max_tokens must be >= 1, got {max_tokens}")
        self.backend = backend
        self.template = None if template is None else str(template)
        self._upstream = read_upstream_template(template) if template is not None else None
        self.structured = structured
        self.max_tokens = max_tokens
        self.max_words = max_words
        self.requests = 0
        """Requests sent to the backend (re-asks included)."""

    @property
    def settings(self) -> dict[str, Any]:
        """What the judgment depends on besides the judge model (recorded with every judgment)."""
        return {"template": self.template or "ours", "structured": self.structured,
                "max_tokens": self.max_tokens, "max_words": self.max_words}

    @property
    def params(self) -> SamplingParams:
        """Greedy, `max_tokens`, and the score schema when `structured`."""
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens,
                              constraint=SCORE_CONSTRAINT if self.structured else None)

    def prompt(self, item: PolicyItem, output: str) -> str:
        """The judge's prompt for `output` on `item` (`history`, `user_query`, `checklist` from its meta)."""
        values = {
            "history": shorten(item.meta["history"], self.max_words),
            "user_query": shorten(item.meta["user_query"], self.max_words),
            "model_output": shorten(output, self.max_words),
            "checklist": checklist_markdown(item.meta["checklist"]),
        }
        if self._upstream is not None:
            return fill_upstream_template(self._upstream, **values)
        if not values["history"]:
            values["history"] = "(none: the current query opens the conversation)"
        return render_template("wildbench_score", **values)

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        del item
        trace: dict[str, Any] = {
            "judgment": {"score": j.score, "judged": j.judged, "raw": j.raw},
            "in_groups": counts_in_groups(j.shown),
            "shown_chars": len(j.shown.strip()),
        }
        if j.shown != text:
            trace["shown"] = j.shown
        failures = (("judge", j.failure),) if j.failure is not None else ()
        return (j.score,), trace, failures

    async def judge_all(self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int) -> list[WildBenchJudgment]:
        """Score every (item, policy output) pair: one request each in one batch, one re-ask batch for the
        unreadable answers; empty outputs get score 1 without a request. Aligned with `pairs`.

        `seed` is accepted for the judges' common call and unused: the judge is greedy and shows one output.
        """
        del seed
        out: list[WildBenchJudgment | None] = [None] * len(pairs)
        todo, asks = [], []
        fixed = parse_judgment(EMPTY_OUTPUT_JUDGMENT)
        for i, (item, output) in enumerate(pairs):
            shown = shorten(output, self.max_words)
            if is_empty_output(output):
                raw = {"answers": [], "fallback": False, "fixed": EMPTY_OUTPUT_JUDGMENT}
                out[i] = WildBenchJudgment(item.id, fixed.score, shown, judged=False, raw=raw)
                continue
            todo.append((i, shown))
            asks.append(Ask((Message("user", self.prompt(item, output)),), self.params, _read_answer,
                            lambda problem: render_template("retry_wildbench", problem=problem)))
        if asks:
            requests, _ = await ask_all(self.backend, asks)
            self.requests += requests
        for (i, shown), ask in zip(todo, asks):
            item_id = pairs[i][0].id
            raw = {"answers": list(ask.texts), "fallback": False}
            if ask.failure is not None:
                out[i] = WildBenchJudgment(item_id, None, shown, failure=ask.failure, raw=raw)
                continue
            raw["fallback"] = ask.result.fallback
            out[i] = WildBenchJudgment(item_id, ask.result.score, shown, raw=raw)
        return out  # type: ignore[return-value]
