"""From run records to results: per (row, benchmark) metrics per repeat, AVG@k, counts and intervals.

Records are the lines of a run's `records.jsonl` (one per evaluator x benchmark x item x repeat). Each metric the
benchmark declares (`Benchmark.metrics`, `benchmarks.scoring`) is computed per repeat (failures counted wrong,
never dropped), then summarised over the repeats as AVG@k: mean, spread (population std, min, max), and the
bootstrap interval of repeat 0 as the per-item uncertainty. A metric's `details` (RM-Bench's matrices) are kept
under `details[metric]`, one per repeat. Reports never call a model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
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
        }
    return out


def compute_results(records: Iterable[EvalRecord], rows: Mapping[str, str]) -> dict[str, Any]:
    """Results per row label and benchmark from records; `rows` maps row label -> evaluator spec.

    Only complete repeats count: a repeat missing some items of a benchmark (an interrupted run) is left out and
    reported under `incomplete_repeats`, so partial runs render honestly.
    """
    grouped: dict[tuple[str, str], dict[int, list[EvalRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        grouped[(r.evaluator, r.benchmark)][r.repeat].append(r)
    results: dict[str, Any] = {}
    for label, spec in rows.items():
        cells = {}
        for (ev, bench), repeats in grouped.items():
            if ev != spec:
                continue
            size = max(len(v) for v in repeats.values())
            # Records are in completion order, which differs between runs (concurrency, resume); sorting by item
            # makes the bootstrap intervals, which resample per-item values, independent of it.
            complete = {k: sorted(v, key=lambda r: r.item) for k, v in sorted(repeats.items()) if len(v) == size}
            bench_obj = benchmark(bench)
            per_repeat = [repeat_results(bench_obj, v) for v in complete.values()]
            cell = _summarise(per_repeat)
            cell["kind"] = bench_obj.kind
            cell["incomplete_repeats"] = sorted(set(repeats) - set(complete))
            cells[bench] = cell
        results[label] = {"evaluator": spec, "benchmarks": cells}
    return results
