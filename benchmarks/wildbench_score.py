"""WildBench v2's leaderboard scores from per-task judgments: WB-Score, the task groups and the task-macro score.

Upstream: `allenai/WildBench` (GitHub, Apache-2.0), snapshot `d6b8dcaf` (2024-08-01),
`leaderboard/data_dir/_create_tables.py` (`score` mode) and `_merge_results.py`. The scoring rule (the judge that
produces the 1-10 scores is `judges.wildbench`):
- WB-Score: `score` = mean raw score over the scored tasks, `adjusted_score` = (mean - 5) * 2; the leaderboard
  shows it x10. Tasks without a judgment are in no mean (counted in `n_failed` here).
- Task groups: `primary_tag` and `secondary_tags` are mapped to five groups (`task_group_new`,
  `benchmarks.wildbench.TASK_GROUPS`) and deduplicated, so a task counts once in each group any of its tags maps
  to. A task whose response was truncated for the judge (its shown text ends with `... (truncated)`) or is
  empty counts in the overall mean but in no group, and not in `avg_len`. A group's score is the adjusted mean
  of its tasks.
- Task-macro score: sum over the groups present of group score x weight (Creative Tasks 0.5, Planning &
  Reasoning 1.25, Math & Data Analysis 1.0, Information/Advice seeking 0.75, Coding & Debugging 1.25), divided
  by the sum of all five weights (4.75): a group with no task adds 0 and is not renormalised away.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.errors import ConfigError

TASK_GROUPS: Mapping[str, str] = {
    "Information seeking": "Information/Advice seeking",
    "Creative Writing": "Creative Tasks",
    "Coding & Debugging": "Coding & Debugging",
    "Reasoning": "Planning & Reasoning",
    "Editing": "Creative Tasks",
    "Math": "Math & Data Analysis",
    "Planning": "Planning & Reasoning",
    "Brainstorming": "Creative Tasks",
    "Role playing": "Creative Tasks",
    "Advice seeking": "Information/Advice seeking",
    "Data Analysis": "Math & Data Analysis",
    "Others": "Creative Tasks",
}
"""Task tag -> group (`leaderboard/data_dir/_create_tables.py`, `task_group_new`)."""

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

    def leaderboard(self) -> dict[str, Any]:
        """The numbers as the leaderboard prints them: `WB_score`, each group's score and `WB_score.task_macro`,
        all x`LEADERBOARD_SCALE` (None where there is no score)."""
        def shown(value: float | None) -> float | None:
            return None if value is None else value * LEADERBOARD_SCALE

        return {
            "WB_score": shown(self.adjusted_score),
            **{f"WB_score.{g}": shown(s) for g, s in self.task_categorized_scores.items()},
            "WB_score.task_macro": shown(self.task_macro_score),
        }


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
