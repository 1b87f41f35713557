"""WildBench v2 WB-Score: reading the checklist judge's 1-10 answer and computing the leaderboard scores.

Upstream: `allenai/WildBench` (GitHub, Apache-2.0), snapshot `d6b8dcaf` (2024-08-01); the task set (with
`checklist`, `primary_tag`, `secondary_tags`) is the Hugging Face dataset `allenai/WildBench`, config `v2`,
1,024 tasks. This module is the pure part of the protocol: parsing a judgment and scoring; building the judge
prompt (`evaluation/eval_template.score.v2.md`) and calling the judge live elsewhere.

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
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.wildbench import TASK_GROUPS
from harness.errors import ConfigError

__all__ = [
    "EMPTY_OUTPUT_JUDGMENT",
    "GROUPS",
    "GROUP_WEIGHTS",
    "LEADERBOARD_SCALE",
    "TASK_GROUPS",
    "TRUNCATION_MARKER",
    "Judgment",
    "TaskScore",
    "WBScoreResult",
    "counts_in_groups",
    "is_empty_output",
    "parse_judgment",
    "parse_score",
    "task_groups",
    "task_macro_score",
    "wb_result",
    "wb_score",
]

GROUPS = (
    "Creative Tasks",
    "Planning & Reasoning",
    "Math & Data Analysis",
    "Information/Advice seeking",
    "Coding & Debugging",
)
"""The five task groups, in the leaderboard's column order (`_merge_results.py:merge_scores`)."""

GROUP_WEIGHTS: Mapping[str, float] = {
    "Creative Tasks": 0.5,
    "Planning & Reasoning": 1.25,
    "Math & Data Analysis": 1.0,
    "Information/Advice seeking": 0.75,
    "Coding & Debugging": 1.25,
}
"""Group weights of the task-macro score (`_create_tables.py`, `weights_by_task`)."""

LEADERBOARD_SCALE = 10
"""The leaderboard prints `adjusted_score`, the group scores and the task-macro score times this."""

TRUNCATION_MARKER = "... (truncated)"
"""What upstream's `src/eval.py:shorten` appends to a response cut to its first words for the judge."""

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


def counts_in_groups(output: str) -> bool:
    """Whether a scored task enters the group scores and `avg_len` (`_create_tables.py`, `score` mode).

    `output` is the response as shown to the judge; upstream stores it stripped and skips it when it is empty
    or ends with `TRUNCATION_MARKER`.
    """
    shown = output.strip()
    return bool(shown) and not shown.endswith(TRUNCATION_MARKER)


def task_groups(tags: Iterable[str]) -> frozenset[str]:
    """The groups of a task's tags (`primary_tag` and `secondary_tags`), deduplicated (`_create_tables.py`).

    Raises:
        ConfigError: on a tag outside `TASK_GROUPS`, or no tag at all.
    """
    tags = tuple(tags)
    if not tags:
        raise ConfigError("a WildBench task needs at least its primary_tag")
    unknown = [t for t in tags if t not in TASK_GROUPS]
    if unknown:
        raise ConfigError(
            f"unknown WildBench task tag(s) {unknown}; expected one of {', '.join(TASK_GROUPS)}"
        )
    return frozenset(TASK_GROUPS[t] for t in tags)


def wb_score(scores: Sequence[float]) -> float:
    """WB-Score, unscaled: (mean raw 1-10 score - 5) * 2 (`_create_tables.py`, `adjusted_score`).

    Raises:
        ValueError: on an empty sequence.
    """
    if len(scores) == 0:
        raise ValueError("wb_score: no scores")
    return (sum(scores) / len(scores) - 5) * 2


def task_macro_score(group_scores: Mapping[str, float]) -> float:
    """The weighted task-macro score from adjusted group scores (`_create_tables.py`, `task_macro_score`).

    Sum of score x `GROUP_WEIGHTS[group]` over the groups given, divided by the sum of all five weights: a
    missing group adds 0.

    Raises:
        ConfigError: on a group outside `GROUP_WEIGHTS`.
    """
    unknown = [g for g in group_scores if g not in GROUP_WEIGHTS]
    if unknown:
        raise ConfigError(f"unknown WildBench task group(s) {unknown}; expected one of {', '.join(GROUPS)}")
    return sum(s * GROUP_WEIGHTS[g] for g, s in group_scores.items()) / sum(GROUP_WEIGHTS.values())


@dataclass(frozen=True, slots=True)
class TaskScore:
    """One task's judgment, as `wb_result` takes it."""

    score: float | None
    """The parsed 1-10 score; None for a failed judgment."""
    tags: tuple[str, ...]
    """The task's `primary_tag` followed by its `secondary_tags`."""
    output: str
    """The response as shown to the judge (after upstream's shortening), for the group and length rules."""


@dataclass(frozen=True, slots=True)
class WBScoreResult:
    """A policy's WB-Score numbers, with the leaderboard's field names where it has one (unscaled)."""

    score: float | None
    """Mean raw 1-10 score over the scored tasks; None when no task was scored."""
    adjusted_score: float | None
    """WB-Score, (score - 5) * 2; the leaderboard shows x`LEADERBOARD_SCALE`."""
    task_categorized_scores: dict[str, float]
    """Adjusted score per group that has at least one counted task."""
    group_n: dict[str, int]
    """Counted tasks per group (the groups of `task_categorized_scores`)."""
    task_macro_score: float | None
    """Weighted task-macro score of the group scores; None when no task was scored."""
    n_scored: int
    """Tasks with a score (upstream `total`)."""
    n_failed: int
    """Tasks without a score, left out of every mean."""
    avg_len: float | None
    """Mean characters of the shown responses counted in groups; None when there are none."""

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def wb_result(tasks: Sequence[TaskScore]) -> WBScoreResult:
    """All WB-Score numbers of one policy from its per-task judgments (`_create_tables.py`, `score` mode).

    Raises:
        ValueError: on no tasks.
        ConfigError: on a task with an unknown or no tag.
    """
    if not tasks:
        raise ValueError("wb_result: no tasks")
    groups = [task_groups(t.tags) for t in tasks]
    scores: list[float] = []
    by_group: dict[str, list[float]] = {}
    lengths: list[int] = []
    for task, task_group_set in zip(tasks, groups, strict=True):
        if task.score is None:
            continue
        scores.append(task.score)
        if not counts_in_groups(task.output):
            continue
        lengths.append(len(task.output.strip()))
        for group in task_group_set:
            by_group.setdefault(group, []).append(task.score)
    group_scores = {g: wb_score(by_group[g]) for g in GROUPS if g in by_group}
    return WBScoreResult(
        score=sum(scores) / len(scores) if scores else None,
        adjusted_score=wb_score(scores) if scores else None,
        task_categorized_scores=group_scores,
        group_n={g: len(by_group[g]) for g in group_scores},
        task_macro_score=task_macro_score(group_scores) if scores else None,
        n_scored=len(scores),
        n_failed=len(tasks) - len(scores),
        avg_len=sum(lengths) / len(lengths) if lengths else None,
    )
