"""A result cell carries how it prints (its metric's scale and digits) from where it is computed, so printing a
value asks no registry; the paragraph under a policy table holds that table's own scale note and no other's."""

from __future__ import annotations

import csv
import dataclasses
import io

import pytest

from benchmarks.scoring import NDCG, PAIRWISE_ACC, PAIRWISE_GAP
from harness.records import EvalRecord
from reports.render import POLICY_CONVENTIONS, cell_text, cell_value, conventions, render_csv
from reports.results import compute_results
from reports.tables import POLICY_SCALES, Column, PolicySetup, Row, TableSpec, get_table

ROWS = {"Skywork-27B": "rm"}


def records() -> list[EvalRecord]:
    pairs = [EvalRecord("rm", "judgebench", i, 0, 0, "pairwise", s, preferred=0)
             for i, s in (("a", (1.0, 0.0)), ("b", (0.0, 1.0)), ("c", (0.7, 0.2)))]
    lists = [EvalRecord("rm", "aeollm", "l", 0, 0, "listwise", (0.2, 0.9, 0.5), gold_ranks=(1, 2, 3))]
    return pairs + lists


def test_each_cell_carries_its_metrics_scale_and_digits():
    cells = compute_results(records(), ROWS)["Skywork-27B"]["benchmarks"]
    for bench, metric in (("judgebench", PAIRWISE_ACC), ("judgebench", PAIRWISE_GAP), ("aeollm", NDCG)):
        cell = cells[bench][metric.name]
        assert (cell["scale"], cell["digits"]) == (metric.scale, metric.digits)


def test_printing_a_value_asks_no_registry(monkeypatch: pytest.MonkeyPatch):
    results = compute_results(records(), ROWS)
    spec = dataclasses.replace(get_table("table1"), rows=(Row("Skywork-27B", None, {"paper": "rm", "cpu": "rm"}),),
                               columns=(Column("judgebench", "acc"), Column("aeollm", "ndcg")))

    def refuse(self):
        raise AssertionError(f"{self.key}: looked up its benchmark to print a value")

    monkeypatch.setattr(Column, "declared", refuse)
    assert cell_value(results, "Skywork-27B", Column("judgebench", "acc")) == pytest.approx(200 / 3)
    assert cell_text(results, "Skywork-27B", Column("judgebench", "acc")) == "66.7"
    assert cell_text(results, "Skywork-27B", Column("aeollm", "ndcg")) == "0.760"
    assert cell_text(results, "Skywork-27B", Column("ultrafeedback", "acc")) == "-"
    lines = list(csv.DictReader(io.StringIO(render_csv(spec, results))))
    assert [float(r["value"]) for r in lines] == [pytest.approx(200 / 3), pytest.approx(0.760188, abs=1e-6)]
    # A cell that says it prints otherwise is printed so: the cell, not the benchmark, decides.
    results["Skywork-27B"]["benchmarks"]["judgebench"]["acc"].update(scale=1.0, digits=3)
    assert cell_text(results, "Skywork-27B", Column("judgebench", "acc")) == "0.667"


def test_a_policy_table_prints_its_own_scale_note_and_no_other():
    for name in ("table2", "table6", "table8", "fig2b"):
        assert conventions(get_table(name)) == f"{POLICY_CONVENTIONS} {POLICY_SCALES}"
    plugin = TableSpec(name="toy", title="Toy", rows=(), columns=(), paper={},
                       setups={"paper": PolicySetup(judge="openai:judge")})
    assert conventions(plugin) == POLICY_CONVENTIONS and "x10" not in conventions(plugin)
    own = dataclasses.replace(plugin, scale_note="Scores as the toy leaderboard prints them.")
    assert conventions(own) == f"{POLICY_CONVENTIONS} Scores as the toy leaderboard prints them."
