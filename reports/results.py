"""From run records to results: per (row, benchmark) metrics per repeat, AVG@k, counts and intervals.

Records are the lines of a run's `records.jsonl` (one per evaluator x benchmark x item x repeat). Each metric is
computed per repeat with `benchmarks.metrics` (failures counted wrong, never dropped), then summarised over the
repeats as AVG@k: mean, spread (population std, min, max), and the bootstrap interval of repeat 0 as the
per-item uncertainty. Reports never call a model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks import metrics
from harness.records import EvalRecord

NDCG_TIES = "scikit-learn ndcg_score convention: tied predicted scores get the average gain over their orderings"


def _pairwise(records: list[EvalRecord]) -> dict[str, Any]:
    pairs = []
    for r in records:
        s, p = r.scores, r.preferred
        pairs.append((s[p], s[1 - p]))
    result = metrics.pairwise_result(pairs, seed=0).to_json()
    out = {"acc": result}
    if records and "chosen_style" in records[0].meta:
        out["rm_bench"] = _rm_bench(records)
    return out


def _rm_bench(records: list[EvalRecord]) -> dict[str, Any]:
    """RM-Bench's hard/normal/easy per domain group, averaged over groups; None where a 3x3 matrix is incomplete."""
    by_domain: dict[str, list] = defaultdict(list)
    for r in records:
        s, p, m = r.scores, r.preferred, r.meta
        ok = None if s[p] is None or s[1 - p] is None else s[p] > s[1 - p]
        by_domain[m.get("domain_group", m.get("domain", "all"))].append(
            (int(m["chosen_style"]), int(m["rejected_style"]), ok)
        )
    per_domain = {}
    for domain, rows in by_domain.items():
        try:
            per_domain[domain] = metrics.rm_bench_matrix(rows)
        except ValueError as exc:  # a --limit run may not fill every cell
            per_domain[domain] = {"error": str(exc)}
    complete = {d: v for d, v in per_domain.items() if "error" not in v}
    average = metrics.rm_bench_domain_average(complete) if complete else None
    return {"per_domain": per_domain, "average": average}


def _listwise(records: list[EvalRecord]) -> dict[str, Any]:
    scores = [None if r.n_unscored else list(r.scores) for r in records]
    result = metrics.listwise_result(scores, [list(r.gold_ranks) for r in records], seed=0).to_json()
    return {"acc": result["acc"], "ndcg": result["ndcg"]}


def _summarise(per_repeat: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in per_repeat[0]:
        if metric == "rm_bench":
            out[metric] = [r[metric] for r in per_repeat]
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
            kind = next(iter(complete.values()))[0].kind
            per_repeat = [(_pairwise if kind == "pairwise" else _listwise)(v) for v in complete.values()]
            cell = _summarise(per_repeat)
            cell["kind"] = kind
            cell["incomplete_repeats"] = sorted(set(repeats) - set(complete))
            cells[bench] = cell
        results[label] = {"evaluator": spec, "benchmarks": cells}
    return results
