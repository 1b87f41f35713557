"""Benchmarks declare their metrics; a new benchmark with a metric of its own needs no change in reports/."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import scoring
from harness.records import EvalRecord
from harness.registry import lookup, names, register
from harness.runstore import Manifest


def test_every_benchmark_declares_its_metrics():
    for name in names("benchmark"):
        bench = lookup("benchmark", name)
        assert isinstance(bench.display, str) and bench.display
        if bench.kind == "policy":  # scored by its judge protocol; its metrics come with it
            continue
        assert bench.metrics and all(isinstance(m, scoring.Metric) for m in bench.metrics), name
        assert len({m.name for m in bench.metrics}) == len(bench.metrics), name
        assert bench.metrics[0].name == "acc"  # the headline: Table 1's columns read `BENCHMARK.acc`
    assert [m.name for m in lookup("benchmark", "nectar_lmsys").metrics] == ["acc", "ndcg", "gap"]
    assert lookup("benchmark", "rm_bench").metrics[0].weights is not None


class ToyErrors:
    """A benchmark whose metric is an error rate (lower is better), declared in its own module only."""

    name = "toy_errors"
    display = "Toy"
    kind = "pairwise"
    metrics = (
        replace(scoring.PAIRWISE_ACC, name="acc", display="Err.", description="share of pairs got wrong",
                per_item=lambda r: 1.0 - scoring.pair_correct(r), higher_is_better=False),
    )

    def load(self, *, data_dir=None, limit=None, seed=0):  # pragma: no cover - records are written directly
        return []


if "toy_errors" not in names("benchmark"):
    register("benchmark", "toy_errors")(ToyErrors())


def _run(path: Path, spec: str, wrong: list[bool]) -> Path:
    rows = {"row": spec}
    settings = {"rows": rows, "benchmarks": ["toy_errors"], "seeds": 1, "seed": 0, "limit": None,
                "data": {"toy_errors": "fp"}, "models": {}}
    Manifest(path / "manifest.json").start(command="eval", settings=settings, config={}, extra={"rows": rows})
    records = [EvalRecord(spec, "toy_errors", f"i{i}", 0, 0, "pairwise", (0.0, 1.0) if w else (1.0, 0.0),
                          preferred=0) for i, w in enumerate(wrong)]
    (path / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_a_new_metric_flows_through_reports_tables_and_the_gate(tmp_path: Path):
    from reports.compare import compare_runs
    from reports.report import write_reports

    rng = random.Random(0)
    base_wrong = [rng.random() < 0.5 for _ in range(300)]
    cand_wrong = [w and rng.random() < 0.4 for w in base_wrong]  # far fewer errors
    base = _run(tmp_path / "base", "pairwise-judge:model=hf:a", base_wrong)
    cand = _run(tmp_path / "cand", "pairwise-judge:model=hf:b", cand_wrong)
    payload = write_reports(base)
    cell = payload["results"]["row"]["benchmarks"]["toy_errors"]["acc"]
    assert cell["value"] == pytest.approx(sum(base_wrong) / 300)
    table = (base / "table.md").read_text()
    assert "| Evaluator | Toy |" in table and f"{100 * sum(base_wrong) / 300:.1f}" in table
    assert "- Toy: share of pairs got wrong" in table
    (gate,) = compare_runs(base, cand).cells
    assert gate.diff < 0 and gate.verdict == "improvement"  # fewer errors is better for this metric
    (worse,) = compare_runs(cand, base).cells
    assert worse.verdict == "regression"


def test_pairwise_benchmarks_report_the_score_gap_beside_accuracy():
    """Δ_gap: the mean of score(preferred) - score(other) over the scored pairs, with its bootstrap interval; an
    unscored pair counts in n_failed and not in the mean; a tie contributes 0 and counts in the tie rate."""
    def record(i: int, scores: tuple, preferred: int) -> EvalRecord:
        return EvalRecord("row", "ultrafeedback", f"i{i}", 0, 0, "pairwise", scores, preferred=preferred)

    records = [record(0, (0.9, 0.1), 0), record(1, (0.2, 0.6), 1), record(2, (0.5, 0.5), 0),
               record(3, (0.3, 0.8), 0), record(4, (None, 0.4), 1)]
    for name in ("judgebench", "personalized_rb", "ultrafeedback"):
        assert [m.name for m in lookup("benchmark", name).metrics] == ["acc", "gap"]
    result = scoring.PAIRWISE_GAP.result(records, seed=0)
    assert result.value == pytest.approx((0.8 + 0.4 + 0.0 - 0.5) / 4)
    assert (result.n, result.n_failed, result.tie_rate) == (5, 1, pytest.approx(1 / 5))
    assert result.ci_low < result.value < result.ci_high
    assert not scoring.PAIRWISE_GAP.gated and not scoring.PAIRWISE_GAP.binary


def test_the_gap_lands_in_results_json(tmp_path: Path):
    from reports.report import write_reports

    path = tmp_path / "run"
    path.mkdir()
    rows = {"row": "pairwise-judge:model=hf:a"}
    settings = {"rows": rows, "benchmarks": ["ultrafeedback"], "seeds": 1, "seed": 0, "limit": None,
                "data": {"ultrafeedback": "fp"}, "models": {}}
    Manifest(path / "manifest.json").start(command="eval", settings=settings, config={}, extra={"rows": rows})
    gaps = [0.5, -0.25, 0.75, 0.0]
    records = [EvalRecord(rows["row"], "ultrafeedback", f"i{i}", 0, 0, "pairwise", (0.5 + g / 2, 0.5 - g / 2),
                          preferred=0) for i, g in enumerate(gaps)]
    (path / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    cell = write_reports(path)["results"]["row"]["benchmarks"]["ultrafeedback"]
    assert cell["gap"]["value"] == pytest.approx(sum(gaps) / 4) and cell["acc"]["value"] == pytest.approx(0.5)


def test_listwise_benchmarks_report_the_score_gap_over_gold_ordered_pairs():
    """Per list: the mean over its pairs of different gold rank of score(better) - score(worse); an unscored list
    counts in n_failed, not in the mean."""
    def record(i: int, scores: tuple, ranks: tuple) -> EvalRecord:
        return EvalRecord("row", "nectar_lmsys", f"i{i}", 0, 0, "listwise", scores, gold_ranks=ranks)

    records = [record(0, (0.9, 0.5, 0.1), (1, 2, 3)),  # better minus worse: 0.4, 0.8, 0.4
               record(1, (0.2, 0.6, 0.6), (1, 2, 3)),  # -0.4, -0.4, 0.0
               record(2, (None, 0.6, 0.1), (1, 2, 3))]
    for name in ("nectar_lmsys", "aeollm"):
        assert [m.name for m in lookup("benchmark", name).metrics] == ["acc", "ndcg", "gap"]
    first = ((0.9 - 0.5) + (0.9 - 0.1) + (0.5 - 0.1)) / 3
    second = ((0.2 - 0.6) + (0.2 - 0.6) + (0.6 - 0.6)) / 3
    assert scoring.list_gap(records[0]) == pytest.approx(first)
    result = scoring.LISTWISE_GAP.result(records, seed=0)
    assert result.value == pytest.approx((first + second) / 2) and (result.n, result.n_failed) == (3, 1)
