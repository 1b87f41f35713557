"""Table 3: the macro Average is the mean of the six columns (each the benchmark's declared metric, AVG@k), with a
bootstrap interval over the columns' items; a row missing a column gets no Average in the tables (the paper's is
over all six) and a note naming the column."""

from __future__ import annotations

import csv
import io

import pytest

from harness.records import EvalRecord
from reports.evaluator_tables import TABLE3_SPEC
from reports.render import render_csv, render_latex, render_markdown
from reports.report import report_spec
from reports.results import compute_results, macro_average


def pair(spec: str, bench: str, item: str, right: bool | None, *, repeat: int = 0, **meta: str) -> EvalRecord:
    """A pair whose preferred response (index 0) scores 1 against 0 (right), 0 against 1 (wrong), or ties."""
    scores = (0.5, 0.5) if right is None else (1.0, 0.0) if right else (0.0, 1.0)
    return EvalRecord(spec, bench, item, repeat, 0, "pairwise", scores, meta=meta, preferred=0)


def ranked(spec: str, bench: str, item: str, top_right: bool) -> EvalRecord:
    """A list of three, gold best first; our top score on it (right) or on the worst (wrong)."""
    scores = (0.9, 0.5, 0.1) if top_right else (0.1, 0.5, 0.9)
    return EvalRecord(spec, bench, item, 0, 0, "listwise", scores, gold_ranks=(1, 2, 3))


def records(spec: str, *, lmsys: bool = True) -> list[EvalRecord]:
    rm = {"domain": "chat"}
    found = [
        # JudgeBench: repeat 0 one of two, repeat 1 both: AVG@2 = 0.75
        pair(spec, "judgebench", "j1", True), pair(spec, "judgebench", "j2", False),
        pair(spec, "judgebench", "j1", True, repeat=1), pair(spec, "judgebench", "j2", True, repeat=1),
        # Personalized-RB: 1.0
        pair(spec, "personalized_rb", "p1", True), pair(spec, "personalized_rb", "p2", True),
        # RM-Bench Overall: the cell (0, 0) holds right and wrong (0.5), the cell (1, 0) right (1.0): 0.75
        # (pooled over the pairs it would be 2/3)
        pair(spec, "rm_bench", "r1", True, chosen_style="0", rejected_style="0", **rm),
        pair(spec, "rm_bench", "r2", False, chosen_style="0", rejected_style="0", **rm),
        pair(spec, "rm_bench", "r3", True, chosen_style="1", rejected_style="0", **rm),
        # UltraFeedback: right, a tie (wrong), wrong, wrong: 0.25
        pair(spec, "ultrafeedback", "u1", True), pair(spec, "ultrafeedback", "u2", None),
        pair(spec, "ultrafeedback", "u3", False), pair(spec, "ultrafeedback", "u4", False),
        # AEOLLM top-1: 0.5; LMSYS top-1: 1.0
        ranked(spec, "aeollm", "a1", True), ranked(spec, "aeollm", "a2", False),
    ]
    return found + ([ranked(spec, "nectar_lmsys", "n1", True)] if lmsys else [])


ROWS = {"w/o anchor": "e-disc", "full": "e-both"}


@pytest.fixture(scope="module")
def table():
    found = records("e-disc") + records("e-both", lmsys=False)
    results = compute_results(found, ROWS)
    for label, average in macro_average(TABLE3_SPEC.columns, results, found, ROWS).items():
        results[label]["average"] = average
    return report_spec(TABLE3_SPEC, ROWS), results


def test_the_average_is_the_mean_of_the_six_columns(table):
    _, results = table
    cells = results["w/o anchor"]["benchmarks"]
    columns = [cells[b]["acc"]["value"] for b in ("judgebench", "personalized_rb", "rm_bench", "ultrafeedback",
                                                  "aeollm", "nectar_lmsys")]
    assert columns == pytest.approx([0.75, 1.0, 0.75, 0.25, 0.5, 1.0])
    average = results["w/o anchor"]["average"]
    assert average["value"] == pytest.approx(4.25 / 6)
    assert average["partial"] is False and average["of"] == 6 and len(average["columns"]) == 6
    assert average["ci_low"] <= average["value"] <= average["ci_high"]
    assert 0.0 <= average["ci_low"] < average["ci_high"] <= 1.0
    # Without LMSYS's column the mean is over the other five, and says so.
    partial = results["full"]["average"]
    assert partial["value"] == pytest.approx(3.25 / 5) and partial["partial"] and len(partial["columns"]) == 5


def test_an_average_of_columns_without_spread_has_no_interval():
    found = [pair("e", "judgebench", f"j{i}", True) for i in range(3)] + [
        pair("e", "ultrafeedback", f"u{i}", False) for i in range(4)]
    rows = {"full": "e"}
    average = macro_average(TABLE3_SPEC.columns, compute_results(found, rows), found, rows)["full"]
    assert (average["value"], average["ci_low"], average["ci_high"]) == (0.5, 0.5, 0.5)


def test_the_tables_print_the_average_beside_the_papers(table):
    """A row with every column gets its Average beside the paper's; a row missing a column gets none (a dash in
    every format, a note naming the column): the paper's Average is over all six."""
    spec, results = table
    md = render_markdown(spec, results, [])
    head = "| Evaluator | JudgeBench | Personalized-RB | RM-Bench | UltraFeedback | AEOLLM | LMSYS-Chat-1M | Average |"
    assert head in md
    # the best of our rows in bold (both rows score the same on the first five)
    assert "| w/o anchor | **75.0** | **100.0** | **75.0** | **25.0** | **50.0** | **100.0** | **70.8** |" in md
    assert "| *paper* | 56.1 | 72.4 | 69.8 | 67.9 | 47.3 | 27.7 | 56.9 |" in md
    assert "| full | **75.0** | **100.0** | **75.0** | **25.0** | **50.0** | - | - |" in md
    assert "| *paper* | 57.4 | 73.3 | 69.8 | 68.7 | 51.2 | 28.0 | 58.1 |" in md
    assert "6 of 6 columns" in md and "5 of 6 columns (no value in LMSYS-Chat-1M)" in md
    assert "- full: no Average: no value in LMSYS-Chat-1M" in md
    assert "65.0" not in md and "\u2020" not in md
    tex = render_latex(spec, results)
    assert r"\textbf{70.8}" in tex and "65.0" not in tex and "dagger" not in tex
    assert r"full & \textbf{75.0} & \textbf{100.0} & \textbf{75.0} & \textbf{25.0} & \textbf{50.0} & - & - \\" in tex
    lines = [r for r in csv.DictReader(io.StringIO(render_csv(spec, results))) if r["benchmark"] == "average"]
    assert [(r["row"], r["value"] and round(float(r["value"]), 2), r["paper"], r["n"]) for r in lines] == [
        ("w/o anchor", 70.83, "56.9", "6"), ("full", "", "58.1", "5")]
    # results.json keeps the mean of the five, marked partial
    assert results["full"]["average"]["partial"] and results["full"]["average"]["value"] == pytest.approx(0.65)


def test_a_table_narrowed_to_some_benchmarks_prints_no_paper_average():
    """`items:` narrows the table to some benchmarks: its Average is over those, the paper's over all six, so
    the paper's is left out and a note says why."""
    from harness.config import RunConfig

    found = records("e-both")
    spec, _ = TABLE3_SPEC.resolve(RunConfig(items={"judgebench": ["j1", "j2"], "personalized_rb": ["p1", "p2"]}))
    assert [c.benchmark for c in spec.columns] == ["judgebench", "personalized_rb"]
    rows = {"full": "e-both"}
    results = compute_results(found, rows)
    for label, average in macro_average(spec.columns, results, found, rows).items():
        results[label]["average"] = average
    md = render_markdown(report_spec(spec, rows), results, [])
    assert "| full | **75.0** | **100.0** | **87.5** |" in md
    assert "| *paper* | 57.4 | 73.3 | - |" in md
    assert "the paper's Average is over all of its benchmarks" in md
