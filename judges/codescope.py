"""CodeScope's checker: upstream's label extraction and exact match on the label (no model).

`extract_label` follows the inference scripts (`code_smell/inference/run_gpt.py`, `code_review/inference/run_gpt.py`):
of the task's labels, the one whose first occurrence in the answer comes earliest; code smell lowercases the answer
first (`"Large Class"` counts), code review looks for the characters `0` and `1` as they are (so `"10 lines"` reads
as 1). An answer naming no label is upstream's empty smell / diff tag 2: wrong, and counted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from benchmarks.base import PolicyItem
from harness.errors import Failure
from benchmarks.codescope import DIFF_TAGS, SMELLS


def extract_label(task: str, text: str) -> str | None:
    """The label upstream reads from `text` for `task` (`smell` or `review`), or None."""
    labels, haystack = (SMELLS, text.lower()) if task == "smell" else (DIFF_TAGS, text)
    found = [(haystack.find(label), label) for label in labels if label in haystack]
    return min(found)[1] if found else None


@dataclass(frozen=True, slots=True)
class LabelJudgment:
    item: str
    correct: bool
    label: str | None
    """The extracted label (None: none found)."""
    failure: None = None


class CodeScopeChecker:
    """Exact match of the extracted label with the gold one (see the module docstring)."""

    needs_model: ClassVar[bool] = False
    """A checker: the run's judge model is not asked (`judges.policy.judge_needs_model`)."""

    def __init__(self, backend: Any = None) -> None:
        del backend  # a checker, not a judge
        self.requests = 0

    @property
    def settings(self) -> dict[str, Any]:
        return {"checker": "codescope earliest-label extraction"}

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        del text
        trace = {"judgment": {"label": j.label, "gold": item.meta["gold"], "unextracted": j.label is None}}
        return (float(j.correct),), trace, ()

    async def judge_all(self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int) -> list[LabelJudgment]:
        del seed
        out = []
        for item, output in pairs:
            label = extract_label(item.meta["task"], output)
            out.append(LabelJudgment(item.id, label == item.meta["gold"], label))
        return out
