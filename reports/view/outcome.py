"""What each record counts as, by its benchmark's own declared metrics (`benchmarks.scoring`), and which
records changed between two runs. Computed when the page is built and embedded; the page never re-derives them.

A record is counted by the first metric its benchmark declares that applies to it (`Metric.applies`: an
Arena-Hard record by its category's metric). For a strict accuracy or a checked answer (`Metric.binary`) it is
`right` (per-item value 1) or `wrong` (0: a tie and an unscored record are wrong too, as the metric counts them);
a judged policy metric gives a value instead (`scored`). `tied` and `failed` are the metric's own `tied` and
`failed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.records import EvalRecord

Status = Literal["right", "wrong", "scored"]
STATUS_CODES: dict[Status, int] = {"right": 0, "wrong": 1, "scored": 2}
"""How the page's record index writes a status."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one record counts."""

    metric: str | None
    """The metric it is counted by (None: no declared metric applies to it)."""
    value: float | None
    """That metric's per-item value (unscaled)."""
    status: Status
    tied: bool
    failed: bool
    values: dict[str, float | None]
    """Every declared metric that applies: its per-item value, None where the metric leaves the record out of
    its mean (weight 0: Δ_gap of a pair with a side unscored, a judgment that failed)."""


def outcome(bench: Any, record: EvalRecord) -> Outcome:
    """How `record` counts under the metrics `bench` declares (see the module docstring)."""
    metrics = [m for m in bench.metrics if m.applies is None or m.applies(record)]
    values = {m.name: _counted(m, record) for m in metrics}
    if not metrics:
        return Outcome(None, None, "scored", False, bool(record.failures), values)
    head = metrics[0]
    value = float(head.per_item(record))
    status: Status = ("right" if value == 1.0 else "wrong") if head.binary else "scored"
    return Outcome(head.name, value, status, bool(head.tied(record)), bool(head.failed(record)), values)


def _counted(metric: Any, record: EvalRecord) -> float | None:
    """The record's per-item value under `metric`, None where the metric gives it no weight."""
    weights = metric.item_weights([record])
    if weights is not None and not weights[0] > 0:
        return None
    return float(metric.per_item(record))


def score_order(scores: Sequence[float | None]) -> dict[str, list]:
    """The order the scores put the responses in, best first, equal scores grouped (a tie), unscored apart."""
    scored = sorted({s for s in scores if s is not None}, reverse=True)
    groups = [[i for i, s in enumerate(scores) if s == value] for value in scored]
    return {"groups": groups, "unscored": [i for i, s in enumerate(scores) if s is None]}


def gold_order(record: EvalRecord) -> list[list[int]] | None:
    """The benchmark's order of the responses, best first (gold ties grouped); None for a policy record."""
    if record.kind == "pairwise":
        return [[record.preferred], [1 - record.preferred]]  # type: ignore[operator]
    if record.kind == "listwise" and record.gold_ranks is not None:
        ranks = sorted(set(record.gold_ranks))
        return [[i for i, r in enumerate(record.gold_ranks) if r == rank] for rank in ranks]
    return None


Change = Literal["right to wrong", "wrong to right", "worse", "better"]


def change(bench: Any, base: EvalRecord, cand: EvalRecord) -> Change | None:
    """How the record of one (row, item, repeat) changed from the base run to the candidate, by the metric it
    is counted by: a strict accuracy flips (`right to wrong`, `wrong to right`), another metric moves (`worse`,
    `better`, by its direction); None when it did not change."""
    b, c = outcome(bench, base), outcome(bench, cand)
    if b.metric is None or b.metric != c.metric or b.value == c.value:
        return None
    metric = next(m for m in bench.metrics if m.name == b.metric)
    if metric.binary:
        return "right to wrong" if b.value == 1.0 else "wrong to right"
    up = (c.value or 0.0) > (b.value or 0.0)
    return "better" if up == metric.higher_is_better else "worse"
