"""Evaluator metric arithmetic: one list's top-1 and nDCG, upstream rules, bootstrap CIs, AVG@k.

The metrics a benchmark reports are declared in `benchmarks.scoring` (`Metric`, `PAIRWISE`, `LISTWISE`) and
computed over a run's `EvalRecord`s there; this module holds the arithmetic they and the reports share.
Conventions (every evaluator number the project reports follows these):

- Values are fractions in [0, 1]; a `MetricResult` carries how its metric prints (`scale`, `digits`).
- **Pairwise strict accuracy**: an item is correct iff score(preferred) > score(other). A tie is wrong;
  `tie_rate` is the share of tied items.
- **Listwise strict top-1 accuracy** (`top1_correct`): correct iff exactly one response has the highest predicted
  score and it is gold-best (it has the list's lowest gold rank, normally 1). With several gold rank-1 responses
  the unique predicted top may be any of them. A tied top is wrong; `tie_rate` is the share of lists with one. A
  one-response list is correct.
- **nDCG** (`list_ndcg`) over the full list (no cutoff): relevance `rel = K - rank` (gold rank 1 -> K-1, ...,
  rank K -> 0), linear gain, discount `1 / log2(position + 1)` with position 1 at the top, divided by the DCG of
  the gold order; the mean over lists. Tied predicted scores are treated as by scikit-learn's
  `ndcg_score(ignore_ties=False)`: a tied group contributes its mean relevance times the sum of its positions'
  discounts, the expected DCG over all orders of the tie (McSherry & Najork, ECIR 2008). A list whose
  relevances are all 0 scores 0, as in scikit-learn. A one-response list scores 1.0 (scikit-learn refuses it;
  one response is trivially in gold order, and top-1 counts it correct too).
- **Failures are counted next to the metric, never dropped.** The functions here take numbers only and raise
  `ValueError` on None, NaN or empty input; `benchmarks.scoring` scores an unscored record as wrong (accuracy
  0, nDCG 0) and counts it in `n_failed`, so every value is over all `n` items.
- **CI**: percentile bootstrap of the mean over items (numpy only, a local generator seeded by `seed`).
- **AVG@k**: mean, population standard deviation (ddof=0), min and max of the per-repeat values.
- **JudgeBench** (both orders): each order's decision is +1 (picked the gold-preferred response), -1 (picked
  the other) or 0 (tie, or None: unparsable); a pair is correct iff the sum is > 0; accuracy over all pairs.
- **RM-Bench** 3x3 matrix: styles 0 concise, 1 detailed plain text, 2 detailed markdown; cell (i, j) is the
  accuracy of chosen style i against rejected style j. Hard = mean of the upper-triangle cells (i < j: chosen
  less formatted than rejected), Normal = mean of the diagonal, Easy = mean of the lower triangle, overall =
  mean of the 9 cells. Regions average cells, as the upstream script does (equal to pooling pairs when every
  prompt gives all 9 pairs). Across domains each of them is the plain mean over domains (leaderboard formula).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def _floats(values: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)  # None becomes NaN here, so one check catches both
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what}: need a non-empty sequence of numbers")
    if np.isnan(arr).any():
        # This text reaches results.json (a metric's `unavailable` reason), so it is kept as runs have it.
        raise ValueError(f"{what}: None/NaN scores; count failures with the *_result functions instead")
    return arr


def _unscored(x: float | None) -> bool:
    return x is None or bool(np.isnan(x))


def top1_correct(s: np.ndarray, g: np.ndarray) -> bool:
    """One list: is the unique highest-scored response gold-best (`s` scores, `g` gold ranks, both numeric)?"""
    top = np.flatnonzero(s == s.max())
    return top.size == 1 and g[top[0]] == g.min()


def list_ndcg(s: np.ndarray, g: np.ndarray) -> float:
    """One list's tie-averaged nDCG (`s` scores, `g` gold ranks, both numeric arrays)."""
    k = s.size
    if k == 1:
        return 1.0
    rel = k - g
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = float(np.sort(rel)[::-1] @ discount)
    if ideal == 0.0:
        return 0.0
    # Groups of equal predicted score, best first; each gets its mean relevance times the discounts it spans.
    _, group, counts = np.unique(-s, return_inverse=True, return_counts=True)
    mean_rel = np.bincount(group.ravel(), weights=rel) / counts
    group_discount = np.diff(np.cumsum(discount)[np.cumsum(counts) - 1], prepend=0.0)
    return float(mean_rel @ group_discount) / ideal


def _weights(weights: Sequence[float] | None, size: int) -> np.ndarray | None:
    if weights is None:
        return None
    w = _floats(weights, "weights")
    if w.size != size or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"need {size} non-negative weights with a positive sum, got {w.size}")
    return w


def _check_ci(n_resamples: int, alpha: float) -> None:
    if n_resamples < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need n_resamples >= 1 and 0 < alpha < 1, got {n_resamples}, {alpha}")


def _resampled_means(arrays: Sequence[np.ndarray], w: np.ndarray | None, n_resamples: int, seed: int) -> np.ndarray:
    """Per resample (rows) and array (columns): the (weighted) mean over items drawn with replacement, every
    array resampled with the same item indices."""
    size = arrays[0].size
    rng = np.random.default_rng(seed)
    means = np.empty((n_resamples, len(arrays)))
    step = max(1, (1 << 22) // size)  # bounds the index matrix to ~4M entries per chunk
    for start in range(0, n_resamples, step):
        stop = min(start + step, n_resamples)
        idx = rng.integers(0, size, size=(stop - start, size))
        for col, arr in enumerate(arrays):
            if w is None:
                means[start:stop, col] = arr[idx].mean(axis=1)
            else:
                # A resample that drew only weight-0 items (failed judgments) has no mean: NaN, left out of
                # the quantiles (the interval is conditional on drawing something to average).
                total = w[idx].sum(axis=1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    means[start:stop, col] = np.where(total > 0, (arr[idx] * w[idx]).sum(axis=1) / total, np.nan)
    return means


def weighted_mean(values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """The mean of per-item `values`, weighted by `weights` when given (a benchmark's aggregate)."""
    arr = _floats(values, "values")
    w = _weights(weights, arr.size)
    return float(arr.mean() if w is None else (arr * w).sum() / w.sum())


def bootstrap_ci(
    values: Sequence[float],
    *,
    weights: Sequence[float] | None = None,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-item `values` (same seed, same interval).

    With `weights` each resample's statistic is the weighted mean of the drawn items with their weights (a
    ratio estimator: the aggregate of a benchmark whose items do not count equally, such as RM-Bench's).
    """
    arr = _floats(values, "values")
    _check_ci(n_resamples, alpha)
    means = _resampled_means([arr], _weights(weights, arr.size), n_resamples, seed)[:, 0]
    lo, hi = np.nanquantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def paired_bootstrap_ci(
    base: Sequence[float],
    candidate: Sequence[float],
    *,
    weights: Sequence[float] | None = None,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(candidate) - mean(base) over paired items.

    `base[i]` and `candidate[i]` are the same item's values in two runs; each resample draws items (not values),
    so both runs see the same items and the between-item variance cancels. `weights` as in `bootstrap_ci`.
    """
    b, c = _floats(base, "base"), _floats(candidate, "candidate")
    if b.shape != c.shape:
        raise ValueError(f"base has {b.size} items, candidate {c.size}")
    _check_ci(n_resamples, alpha)
    means = _resampled_means([b, c], _weights(weights, b.size), n_resamples, seed)
    lo, hi = np.nanquantile(means[:, 1] - means[:, 0], [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def macro_bootstrap_ci(
    columns: Sequence[tuple[Sequence[float], Sequence[float] | None]],
    *,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of a macro mean: the mean over columns of each column's (weighted) mean of
    its per-item values. `columns`: (values, weights or None) per column. Each resample draws every column's items
    with replacement, each column on its own (the columns are different benchmarks with different items).
    """
    if not columns:
        raise ValueError("macro_bootstrap_ci: no columns")
    _check_ci(n_resamples, alpha)
    rng = np.random.default_rng(seed)
    means = np.column_stack([
        _resampled_means([arr], _weights(weights, arr.size), n_resamples, int(rng.integers(2**32)))[:, 0]
        for arr, weights in ((_floats(v, f"columns[{i}]"), w) for i, (v, w) in enumerate(columns))
    ])
    lo, hi = np.nanquantile(means.mean(axis=1), [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def mcnemar_exact(base_only: int, candidate_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs.

    `base_only`: items right in the base run and wrong in the candidate; `candidate_only`: the reverse. Under
    the null each discordant item is a fair coin, so p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2)
    (the binomial test scipy's `binomtest` and statsmodels' `mcnemar(exact=True)` compute). No discordant
    pair gives 1.0.
    """
    if base_only < 0 or candidate_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {base_only}, {candidate_only}")
    n, k = base_only + candidate_only, min(base_only, candidate_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def avg_at_k(per_repeat_values: Sequence[float]) -> tuple[float, float, float, float]:
    """AVG@k over k repeats: (mean, population std, min, max)."""
    arr = _floats(per_repeat_values, "per_repeat_values")
    return float(arr.mean()), float(arr.std()), float(arr.min()), float(arr.max())


@dataclass(frozen=True, slots=True)
class MetricResult:
    """One metric value with the counts and interval every reported number carries."""

    name: str
    """Metric name (`acc`, `ndcg`, `gap`, `judgebench_acc`, ...)."""
    value: float
    """The metric over all `n` items, failures included as wrong."""
    n: int
    """Items the value is over (scored and failed)."""
    n_failed: int
    """Items that could not be scored (counted wrong, not dropped)."""
    tie_rate: float
    """Share of the `n` items lost to a tie (pairwise: equal scores; listwise: a tied top)."""
    ci_low: float
    """Lower end of the bootstrap interval of `value`."""
    ci_high: float
    """Upper end of the bootstrap interval of `value`."""
    scale: float
    """How the value prints: printed value = value x scale (the metric's `benchmarks.scoring.Metric.scale`)."""
    digits: int
    """Decimals printed (the metric's `Metric.digits`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def metric_result(
    name: str,
    per_item: Sequence[float],
    *,
    n_failed: int,
    ties: int,
    scale: float,
    digits: int,
    weights: Sequence[float] | None = None,
    **ci: Any,
) -> MetricResult:
    """A `MetricResult` from per-item values (failures already scored as wrong), with its bootstrap interval;
    `scale` and `digits`: how the metric prints."""
    lo, hi = bootstrap_ci(per_item, weights=weights, **ci)
    n = len(per_item)
    return MetricResult(name, weighted_mean(per_item, weights), n, int(n_failed), float(ties) / n, lo, hi, scale,
                        digits)


def both_orders_sum(decisions: Iterable[int | None]) -> int:
    """JudgeBench's per-pair sum over the orders it was judged in: +1 right, -1 wrong, 0 tie, None (unparsable) 0.

    The one place the both-orders rule is written: `judgebench_pair_correct` and the pairwise judge
    (`judges.pairwise.score_games`) both read it.
    """
    total = 0
    for d in decisions:
        if d not in (1, 0, -1, None) or isinstance(d, bool):
            raise ValueError(f"a decision is +1, 0, -1 or None, got {d!r}")
        total += d or 0
    return total


def judgebench_pair_correct(decisions: Iterable[int | None]) -> bool:
    """JudgeBench's both-orders rule: a pair is right iff its `both_orders_sum` is more than 0."""
    return both_orders_sum(decisions) > 0


def decisions_from_scores(order_scores: Iterable[tuple[float | None, float | None]]) -> list[int | None]:
    """Per order, a score-based evaluator's (preferred_score, other_score) as a JudgeBench decision.

    Each tuple is already mapped back to the gold frame (preferred first, whatever order they were shown in).
    +1 if preferred scored higher, -1 if lower, 0 on a tie, None if either side is unscored.
    """
    return [
        None if _unscored(p) or _unscored(o) else 1 if p > o else -1 if p < o else 0 for p, o in order_scores
    ]


def judgebench_result(
    pair_decisions: Sequence[Sequence[int | None]],
    *,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> MetricResult:
    """JudgeBench accuracy over pairs, each with its per-order decisions (see `judgebench_pair_correct`).

    `n_failed` counts pairs with at least one unparsable (None) order; they stay in `n` and are scored by the
    upstream rule (the unparsable order adds 0). `tie_rate` is pairs whose decisions sum to 0.
    """
    if not pair_decisions:
        raise ValueError("judgebench_result: no pairs")
    correct = np.array([judgebench_pair_correct(d) for d in pair_decisions], dtype=float)
    ties = sum(both_orders_sum(d) == 0 for d in pair_decisions)
    n_failed = sum(any(x is None for x in d) for d in pair_decisions)
    return metric_result("judgebench_acc", correct, n_failed=n_failed, ties=ties, scale=100.0, digits=1,
                         n_resamples=n_resamples, alpha=alpha, seed=seed)


def rm_bench_matrix(records: Iterable[tuple[int, int, bool | None]]) -> dict[str, Any]:
    """RM-Bench's 3x3 style matrix from one domain's (chosen_style, rejected_style, correct) pair records.

    `correct` None marks an unscorable pair: counted in `n_failed` and as wrong. Returns `hard`, `normal`,
    `easy`, `overall`, `matrix` (3x3 list, rows = chosen style), `n` and `n_failed`.

    Raises:
        ValueError: on a style outside 0..2 or a cell with no pairs.
    """
    hits, counts, n_failed = np.zeros((3, 3)), np.zeros((3, 3)), 0
    for c, r, ok in records:
        if c not in (0, 1, 2) or r not in (0, 1, 2):
            raise ValueError(f"RM-Bench styles are 0..2, got ({c!r}, {r!r})")
        counts[c, r] += 1
        n_failed += ok is None
        hits[c, r] += bool(ok)
    if (counts == 0).any():
        empty = np.argwhere(counts == 0).tolist()
        raise ValueError(f"RM-Bench cells with no pairs (chosen, rejected): {empty}")
    m = hits / counts
    return {
        "hard": float(m[np.triu_indices(3, 1)].mean()),
        "normal": float(np.diag(m).mean()),
        "easy": float(m[np.tril_indices(3, -1)].mean()),
        "overall": float(m.mean()),
        "matrix": m.tolist(),
        "n": int(counts.sum()),
        "n_failed": n_failed,
    }


def rm_bench_domain_average(per_domain: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Leaderboard averages over domains: each of hard/normal/easy/overall is the plain mean over the domains.

    Pass one `rm_bench_matrix` result per domain (Safety pooled from safety-refuse and safety-response first).
    """
    if not per_domain:
        raise ValueError("rm_bench_domain_average: no domains")
    keys = ("hard", "normal", "easy", "overall")
    return {k: float(np.mean([d[k] for d in per_domain.values()])) for k in keys}
