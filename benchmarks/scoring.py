"""What a benchmark declares about its metrics, and the common ones: every report, table and gate asks these.

A benchmark lists its metrics in `metrics` (first = its headline). Each `Metric` says how one record contributes
(`per_item`: a failed item contributes its worst value, never dropped), how items are weighted in the aggregate
(`weights`: None is the plain mean), how it prints (`display`, `scale`, `digits`), which way is better, and whether
the per-item values are 0/1 (a strict accuracy, so McNemar's test applies when two runs are compared). The
aggregate is always the weighted mean of the per-item values, so a bootstrap over items (one run's interval, or the
paired interval of two runs' difference) is the same computation for every benchmark.

A policy benchmark's metrics read the judged records of `harness run table2` (kind `policy`): a judgment that
failed has weight 0 (`failed` says so and `n_failed` counts it) rather than a worst value, since the policy
answered and only the judge could not say how well. Where upstream's number is not a weighted mean of per-item
values (AlpacaEval's length-controlled win rate: a GLM; Arena-Hard: a bootstrap mean; WildBench's task-macro
score: a weighted sum over groups) the metric's `aggregate` computes it from the records, and the weighted mean
stays what `harness compare` resamples. `applies` restricts a metric to some records (an Arena-Hard category).

Pairwise and listwise benchmarks report the score gap Δ_gap beside their accuracy (`PAIRWISE_GAP`, `LISTWISE_GAP`:
`gap` in results.json): per item, score(preferred) - score(other) (a list: the mean of S_i - S_j over its pairs
whose gold ranks differ, i the better), averaged over the scored items with its bootstrap interval. It is in the
evaluator's own units (a rubric score in [0, 1]; a reward model's raw logit), so it compares runs of one evaluator
kind: it is not gated by `harness compare`, and a table marks no best row in its column (`ranked`). RM-Bench
averages it as it averages its accuracy, over domains and style cells (`benchmarks.rm_bench`).

Adding a benchmark with a metric of its own: define the `Metric` in its module and list it in `metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from benchmarks import metrics
from harness.records import EvalRecord


class Unavailable(Exception):
    """An `aggregate` that cannot be computed for these records (saying why); the cell prints a dash."""


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Upstream's value of a metric over one repeat's records, where it is not the weighted mean."""

    value: float
    """Unscaled, as `Metric.scale` expects."""
    ci: tuple[float, float] | None = None
    """Upstream's interval of `value`; None: the bootstrap interval of the weighted mean is reported."""
    details: dict[str, Any] = field(default_factory=dict)
    """Upstream's other numbers (standard error, counts), kept in results.json."""


def _unscored(r: EvalRecord) -> bool:
    return r.n_unscored > 0


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric of a benchmark (see the module docstring)."""

    name: str
    """Key in results.json, in table column keys (`BENCHMARK.NAME`) and in compare's cells: `acc`, `ndcg`, ..."""
    display: str
    """How a column header names it after the benchmark's display name (`Acc.`, `nDCG`)."""
    description: str
    """One sentence: what the value is."""
    per_item: Callable[[EvalRecord], float]
    """One record's contribution; an unscored record contributes the worst value (0)."""
    tied: Callable[[EvalRecord], bool]
    """Whether a record was lost to a tie (counted in `tie_rate`)."""
    scale: float = 100.0
    """Printed value = value x scale (100: a percentage; 1: as is)."""
    digits: int = 1
    """Decimals printed."""
    higher_is_better: bool = True
    binary: bool = True
    """Per-item values are 0 or 1 (a strict accuracy): McNemar's exact test applies."""
    weights: Callable[[Sequence[EvalRecord]], np.ndarray] | None = None
    """Per-item weights of the aggregate, from the records of one run (None: every item counts the same)."""
    details: Callable[[Sequence[EvalRecord]], dict[str, Any]] | None = field(default=None, compare=False)
    """Extra numbers for results.json (RM-Bench's per-domain 3x3 matrices), from one repeat's records."""
    failed: Callable[[EvalRecord], bool] = field(default=_unscored, compare=False)
    """Whether a record counts in `n_failed` (default: a response left unscored)."""
    applies: Callable[[EvalRecord], bool] | None = field(default=None, compare=False)
    """Only the records this accepts enter the metric (None: all)."""
    aggregate: Callable[[Sequence[EvalRecord]], Aggregate] | None = field(default=None, compare=False)
    """Upstream's value from one repeat's records where it is not the weighted mean (may raise `Unavailable`)."""
    gated: bool = True
    """Compared by `harness compare` (False: the aggregate is a model fit whose per-item stand-in is another
    metric of the benchmark, e.g. AlpacaEval's length-controlled win rate, gated through its win rate)."""
    ranked: bool = True
    """A table marks the best row of its column (False: the value is in the evaluator's own units, which rows of
    other evaluator kinds do not share, e.g. Δ_gap: a rubric score against a reward model's logit)."""

    def select(self, records: Sequence[EvalRecord]) -> list[EvalRecord]:
        """The records the metric is over (`applies`)."""
        return list(records) if self.applies is None else [r for r in records if self.applies(r)]

    def values(self, records: Sequence[EvalRecord]) -> np.ndarray:
        return np.array([self.per_item(r) for r in records], dtype=float)

    def item_weights(self, records: Sequence[EvalRecord]) -> np.ndarray | None:
        return None if self.weights is None else np.asarray(self.weights(records), dtype=float)

    def result(self, records: Sequence[EvalRecord], **ci: Any) -> metrics.MetricResult:
        """The metric over one repeat's records (`evaluate` without the aggregate's details)."""
        return self.evaluate(records, **ci)[0]

    def evaluate(self, records: Sequence[EvalRecord], **ci: Any) -> tuple[metrics.MetricResult, dict[str, Any]]:
        """The metric over one repeat's records (those it `applies` to): value, n, n_failed, tie rate, bootstrap
        interval and how it prints (`scale`, `digits`); with `aggregate`, upstream's value (and interval, where it
        has one) and its details.

        Raises:
            ValueError: for no records, or no record with a positive weight (every judgment failed).
            Unavailable: when `aggregate` cannot be computed (the reason).
        """
        records = self.select(records)
        if not records:
            raise ValueError(f"metric {self.name}: no records")
        weights = self.item_weights(records)
        if weights is not None and not weights.sum() > 0:
            raise ValueError(f"metric {self.name}: no record could be scored ({len(records)} failed)")
        found = metrics.metric_result(
            self.name,
            self.values(records),
            n_failed=sum(self.failed(r) for r in records),
            ties=sum(self.tied(r) for r in records),
            scale=self.scale,
            digits=self.digits,
            weights=weights,
            **ci,
        )
        if self.aggregate is None:
            return found, {}
        upstream = self.aggregate(records)
        lo, hi = upstream.ci if upstream.ci is not None else (found.ci_low, found.ci_high)
        return replace(found, value=upstream.value, ci_low=lo, ci_high=hi), dict(upstream.details)

    def format(self, value: float | None) -> str:
        """A value (unscaled) as a table prints it; None is a dash."""
        return "-" if value is None else f"{value * self.scale:.{self.digits}f}"


def _pair(r: EvalRecord) -> tuple[float, float] | None:
    p = r.preferred
    s = r.scores
    if s[p] is None or s[1 - p] is None:  # type: ignore[index]
        return None
    return s[p], s[1 - p]  # type: ignore[index,return-value]


def _list(r: EvalRecord) -> tuple[np.ndarray, np.ndarray] | None:
    if r.n_unscored:
        return None
    return np.asarray(r.scores, dtype=float), np.asarray(r.gold_ranks, dtype=float)


def pair_correct(r: EvalRecord) -> float:
    """Strict: 1 iff score(preferred) > score(other); a tie or an unscored side is 0."""
    pair = _pair(r)
    return float(pair is not None and pair[0] > pair[1])


def pair_tied(r: EvalRecord) -> bool:
    pair = _pair(r)
    return pair is not None and pair[0] == pair[1]


def pair_gap(r: EvalRecord) -> float:
    """score(preferred) - score(other); 0 for an unscored pair (which `scored_pairs` gives weight 0)."""
    pair = _pair(r)
    return 0.0 if pair is None else float(pair[0] - pair[1])


def scored_pairs(records: Sequence[EvalRecord]) -> np.ndarray:
    """Weight 1 for a pair with both scores, 0 for one with a side unscored (counted in n_failed, not averaged)."""
    return np.array([float(_pair(r) is not None) for r in records])


def top1_correct(r: EvalRecord) -> float:
    lst = _list(r)
    return float(lst is not None and metrics.top1_correct(*lst))


def top_tied(r: EvalRecord) -> bool:
    lst = _list(r)
    return lst is not None and int(np.count_nonzero(lst[0] == lst[0].max())) > 1


def checked_right(r: EvalRecord) -> float:
    """A verifiable task's record (one score from its checker): 1 when the answer was checked right, else 0."""
    return float(bool(r.scores) and r.scores[0] == 1.0)


def unextracted(r: EvalRecord) -> bool:
    """A checked record with no score, or whose answer held no label or letter to extract (`judgment.unextracted`)."""
    return not r.scores or bool((r.trace.get("judgment") or {}).get("unextracted"))


def checked_accuracy(description: str, *, failed: Callable[[EvalRecord], bool] = unextracted,
                     details: Callable[[Sequence[EvalRecord]], dict[str, Any]] | None = None) -> Metric:
    """The accuracy of a verifiable task (MATH-500, MMLU-Pro, CodeScope): `checked_right` per answer, no ties,
    `failed` counted in n_failed."""
    return Metric("acc", "Acc.", description, checked_right, lambda r: False, failed=failed, details=details)


def list_gap(r: EvalRecord) -> float:
    """The mean over the list's pairs with different gold ranks of score(better) - score(worse); 0 for an unscored
    list (which `scored_lists` gives weight 0)."""
    lst = _list(r)
    if lst is None:
        return 0.0
    s, g = lst
    i, j = np.nonzero(g[:, None] < g[None, :])
    return float(np.mean(s[i] - s[j])) if len(i) else 0.0


def scored_lists(records: Sequence[EvalRecord]) -> np.ndarray:
    """Weight 1 for a fully scored list with a preference in it, 0 otherwise (counted in n_failed, not averaged)."""
    return np.array([float(_list(r) is not None and len(set(r.gold_ranks)) > 1) for r in records])


def list_ndcg(r: EvalRecord) -> float:
    lst = _list(r)
    return 0.0 if lst is None else metrics.list_ndcg(*lst)


PAIRWISE_ACC = Metric(
    "acc",
    "Acc.",
    "strict pairwise accuracy: score(preferred) > score(other); ties and unscored pairs are wrong",
    pair_correct,
    pair_tied,
)
TOP1_ACC = Metric(
    "acc",
    "Acc.",
    "strict top-1 accuracy: the gold-best response has the unique highest score",
    top1_correct,
    top_tied,
)
NDCG = Metric(
    "ndcg",
    "nDCG",
    "nDCG over the full list: relevance K - rank, linear gain, log2 discount, tied scores averaged (scikit-learn)",
    list_ndcg,
    top_tied,
    scale=1.0,
    digits=3,
    binary=False,
)
PAIRWISE_GAP = Metric(
    "gap",
    "Δ_gap",
    "mean score gap Δ_gap: score(preferred) - score(other) over the scored pairs, in the evaluator's own units "
    "(unscored pairs count in n_failed, not in the mean)",
    pair_gap,
    pair_tied,
    scale=1.0,
    digits=3,
    binary=False,
    weights=scored_pairs,
    gated=False,
    ranked=False,
)
PAIRWISE = (PAIRWISE_ACC, PAIRWISE_GAP)
LISTWISE_GAP = Metric(
    "gap",
    "Δ_gap",
    "mean score gap Δ_gap: per list, the mean over its pairs of different gold rank of score(better) - "
    "score(worse), in the evaluator's own units (unscored lists count in n_failed, not in the mean)",
    list_gap,
    top_tied,
    scale=1.0,
    digits=3,
    binary=False,
    weights=scored_lists,
    gated=False,
    ranked=False,
)
LISTWISE = (TOP1_ACC, NDCG, LISTWISE_GAP)


def headline(benchmark: Any) -> Metric:
    """A benchmark's first declared metric."""
    return benchmark.metrics[0]


def metric_of(benchmark: Any, name: str) -> Metric:
    """The benchmark's metric `name`.

    Raises:
        KeyError: naming the benchmark and the metrics it declares.
    """
    for m in benchmark.metrics:
        if m.name == name:
            return m
    valid = ", ".join(m.name for m in benchmark.metrics)
    raise KeyError(f"benchmark {benchmark.name!r} has no metric {name!r}; it declares: {valid}")
