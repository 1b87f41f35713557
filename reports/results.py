"""From run records to results: per (row, benchmark) metrics per repeat, AVG@k, counts and intervals.

Records are the lines of a run's `records.jsonl` (one per evaluator x benchmark x item x repeat). Each metric the
benchmark declares (`Benchmark.metrics`, `benchmarks.scoring`) is computed per repeat (failures counted wrong,
never dropped), then summarised over the repeats as AVG@k: mean, spread (population std, min, max), and the
bootstrap interval of repeat 0 as the per-item uncertainty. Each metric's cell carries how its metric prints
(`scale`, `digits`), so a renderer need not go back to the benchmark. A metric's `details` (RM-Bench's
matrices) are kept under `details[metric]`, one per repeat. Reports never call a model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import metrics
from benchmarks.scoring import Unavailable
from harness.records import EvalRecord
from harness.registry import lookup

NDCG_TIES = "scikit-learn ndcg_score convention: tied predicted scores get the average gain over their orderings"


def benchmark(name: str) -> Any:
    """The registered benchmark `name` (every benchmark module imported first)."""

    return lookup("benchmark", name)


def repeat_results(bench: Any, records: Sequence[EvalRecord]) -> dict[str, Any]:
    """Every metric the benchmark declares over one repeat's records, plus each metric's `details` (its own, or
    its upstream aggregate's) and, under `unavailable`, why a metric has no value (no record it applies to,
    every judgment failed, an aggregate that cannot be had)."""
    out: dict[str, Any] = {}
    for metric in bench.metrics:
        if not metric.select(records):
            continue
        try:
            result, details = metric.evaluate(records, seed=0)
        except (ValueError, Unavailable) as exc:
            out.setdefault("unavailable", {})[metric.name] = str(exc)
            continue
        out[metric.name] = result.to_json()
        if metric.details is not None:
            details = {**metric.details(metric.select(records)), **details}
        if details:
            out.setdefault("details", {})[metric.name] = details
    return out


def _summarise(per_repeat: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = [m for m in dict.fromkeys(m for r in per_repeat for m in r) if m not in ("details", "unavailable")]
    for key in ("details", "unavailable"):  # metric -> one entry per repeat, as computed (None: none there)
        inner = dict.fromkeys(name for r in per_repeat for name in r.get(key, {}))
        if inner:
            out[key] = {name: [r.get(key, {}).get(name) for r in per_repeat] for name in inner}
    for metric in names:
        if not all(metric in r for r in per_repeat):  # no value in some repeat: no AVG@k either
            out.setdefault("unavailable", {}).setdefault(metric, [None] * len(per_repeat))
            continue
        values = [r[metric]["value"] for r in per_repeat]
        mean, std, lo, hi = metrics.avg_at_k(values)
        first = per_repeat[0][metric]
        out[metric] = {
            "value": mean,
            "std": std,
            "min": lo,
            "max": hi,
            "repeats": len(values),
            "per_repeat": values,
            "n": first["n"],
            "n_failed": sum(r[metric]["n_failed"] for r in per_repeat),
            "tie_rate": sum(r[metric]["tie_rate"] for r in per_repeat) / len(per_repeat),
            "ci_low": first["ci_low"],
            "ci_high": first["ci_high"],
            "scale": first["scale"],
            "digits": first["digits"],
        }
    return out


@dataclass(frozen=True, slots=True)
class Repeats:
    """One evaluator's records of one benchmark, by repeat."""

    complete: dict[int, list[EvalRecord]]
    """Repeat index -> its records sorted by item, in repeat order: the repeats that have every item (as many
    records as the largest repeat)."""
    incomplete: list[int]
    """The other repeats (an interrupted run), left out of every value."""


def group_repeats(records: Iterable[EvalRecord]) -> dict[tuple[str, str], Repeats]:
    """The records by (evaluator spec, benchmark), each group's complete repeats apart from its incomplete ones:
    what `compute_results` summarises and `macro_average` resamples."""
    grouped: dict[tuple[str, str], dict[int, list[EvalRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        grouped[(r.evaluator, r.benchmark)][r.repeat].append(r)
    out: dict[tuple[str, str], Repeats] = {}
    for key, repeats in grouped.items():
        size = max(len(v) for v in repeats.values())
        # Records are in completion order, which differs between runs (concurrency, resume); sorting by item
        # makes the bootstrap intervals, which resample per-item values, independent of it.
        complete = {k: sorted(v, key=lambda r: r.item) for k, v in sorted(repeats.items()) if len(v) == size}
        out[key] = Repeats(complete, sorted(set(repeats) - set(complete)))
    return out


def compute_results(records: Iterable[EvalRecord], rows: Mapping[str, str]) -> dict[str, Any]:
    """Results per row label and benchmark from records; `rows` maps row label -> evaluator spec.

    Only complete repeats count: a repeat missing some items of a benchmark (an interrupted run) is left out and
    reported under `incomplete_repeats`, so partial runs render honestly.
    """
    grouped = group_repeats(records)
    results: dict[str, Any] = {}
    for label, spec in rows.items():
        cells = {}
        for (ev, bench), repeats in grouped.items():
            if ev != spec:
                continue
            bench_obj = benchmark(bench)
            cell = _summarise([repeat_results(bench_obj, v) for v in repeats.complete.values()])
            cell["kind"] = bench_obj.kind
            cell["incomplete_repeats"] = repeats.incomplete
            cells[bench] = cell
        results[label] = {"evaluator": spec, "benchmarks": cells}
    return results


def item_values(metric: Any, per_repeat: Sequence[Sequence[EvalRecord]]) -> tuple[Any, Any]:
    """Per item, the metric's value over the repeats and its weight (None: every item counts the same).

    `per_repeat`: one list per repeat, the same items in the same order in each. An item's value is its mean over
    the repeats (for a metric with weights, its weighted mean over the repeats that scored it, and its weight their
    mean weight), so resampling items resamples what the table's AVG@k averages.
    """
    import numpy as np

    values = np.array([metric.values(recs) for recs in per_repeat])  # repeats x items
    if metric.weights is None:
        return values.mean(axis=0), None
    w = np.array([metric.item_weights(recs) for recs in per_repeat])
    total = w.sum(axis=0)
    averaged = np.divide((values * w).sum(axis=0), total, out=np.zeros(values.shape[1]), where=total > 0)
    return averaged, total / len(per_repeat)


def macro_average(columns: Sequence[Any], results: Mapping[str, Any], records: Iterable[EvalRecord],
                  rows: Mapping[str, str], *, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Per row label, the Average column: the mean of the row's column values (each AVG@k, unscaled) and the
    percentile bootstrap interval of that mean (`metrics.macro_bootstrap_ci`: each column's items resampled on
    their own, over the same complete repeats as its value). `columns`: `reports.tables.Column`s.

    A column without a value leaves the mean to the others: `columns` lists those averaged, `of` how many the
    table has (`partial` when fewer); no column with a value gives None. A partial mean is kept here for the
    record, but the tables print no Average for it (`reports.render.average_text`): the paper's Average is
    over every column, and a mean over fewer is not comparable with it.
    """
    grouped = group_repeats(records)
    out: dict[str, Any] = {}
    for label, spec in rows.items():
        cells = results.get(label, {}).get("benchmarks", {})
        used, values, samples = [], [], []
        for col in columns:
            cell = cells.get(col.benchmark, {}).get(col.metric)
            if not cell:
                continue
            metric = col.declared()
            per_repeat = [metric.select(v) for v in grouped[(spec, col.benchmark)].complete.values()]
            used.append(col.key)
            values.append(cell["value"])
            samples.append(item_values(metric, per_repeat))
        if not used:
            out[label] = {"value": None, "columns": [], "of": len(columns), "partial": True}
            continue
        lo, hi = metrics.macro_bootstrap_ci(samples, n_resamples=n_resamples, seed=seed)
        out[label] = {"value": sum(values) / len(values), "ci_low": lo, "ci_high": hi, "columns": used,
                      "of": len(columns), "partial": len(used) < len(columns)}
    return out
