"""The score gap Δ_gap as an optional table column (`harness run|report --gap`, `TableSpec.gap`) and in
`harness view`: off by default, after each benchmark's columns when asked, the paper's rows dashed there, no best
row marked in it, the Average still over the accuracy columns alone; the view shows it wherever results hold it."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from harness.records import EvalRecord
from harness.runstore import Manifest
from reports.evaluator_tables import TABLE3_SPEC
from reports.render import render_csv, render_latex, render_markdown
from reports.report import report_spec, write_reports
from reports.results import compute_results, macro_average
from reports.tables import get_table

ROWS = {"Skywork-27B": "rm", "DR-Generator-8B": "dr"}


def pair(spec: str, bench: str, item: str, scores: tuple, **meta: str) -> EvalRecord:
    return EvalRecord(spec, bench, item, 0, 0, "pairwise", scores, meta=meta, preferred=0)


def ranked(spec: str, bench: str, item: str, scores: tuple) -> EvalRecord:
    return EvalRecord(spec, bench, item, 0, 0, "listwise", scores, gold_ranks=(1, 2, 3))


def records() -> list[EvalRecord]:
    """A reward model with large raw gaps (logits) that is right less often than a rubric with small ones."""
    found = []
    for spec, big in (("rm", True), ("dr", False)):
        for bench in ("judgebench", "personalized_rb", "ultrafeedback"):
            found += [pair(spec, bench, "a", (4.0, -2.0) if big else (0.75, 0.5)),
                      pair(spec, bench, "b", (-1.0, 3.0) if big else (0.5, 0.25))]
        found += [pair(spec, "rm_bench", f"r{c}", (1.0, 0.5) if big else (0.6, 0.4), domain="chat",
                       chosen_style=str(c), rejected_style="0") for c in range(3)]
        for bench in ("aeollm", "nectar_lmsys"):
            found.append(ranked(spec, bench, "l", (3.0, 2.0, 0.0) if big else (0.9, 0.5, 0.1)))
    return found


@pytest.fixture(scope="module")
def table1():
    results = compute_results(records(), ROWS)
    return report_spec(get_table("table1"), ROWS), results


def test_no_gap_column_unless_asked(table1):
    spec, results = table1
    assert not spec.gap and spec.shown == spec.columns
    md = render_markdown(spec, results, [])
    assert "\u0394_gap" not in md.split("Counts per cell")[0]
    assert "| Evaluator | JudgeBench | Personalized-RB | RM-Bench |" in md
    assert all(r["metric"] != "gap" for r in csv.DictReader(io.StringIO(render_csv(spec, results))))


def test_asked_the_tables_print_the_gap_after_each_benchmark_and_the_paper_rows_dash_it(table1):
    spec, results = table1
    spec = dataclasses.replace(spec, gap=True)
    assert [c.key for c in spec.shown] == [
        "judgebench.acc", "judgebench.gap", "personalized_rb.acc", "personalized_rb.gap", "rm_bench.acc",
        "rm_bench.gap", "ultrafeedback.acc", "ultrafeedback.gap", "aeollm.acc", "aeollm.ndcg", "aeollm.gap",
        "nectar_lmsys.acc", "nectar_lmsys.ndcg", "nectar_lmsys.gap"]
    md = render_markdown(spec, results, [])
    assert "| Evaluator | JudgeBench Acc. | JudgeBench \u0394_gap | Personalized-RB Acc. |" in md
    # RM gaps: (6 - 4) / 2 = 1.0 on the pairs, 0.5 on RM-Bench, (1 + 3 + 2) / 3 = 2.0 on the lists; the rubric's
    # 0.25, 0.2 and 0.533. The gap columns mark no best row (the units differ); the accuracy columns do.
    assert ("| Skywork-27B | 50.0 | 1.000 | 50.0 | 1.000 | **100.0** | 0.500 | 50.0 | 1.000 | **100.0** | **1.000** "
            "| 2.000 |") in md
    assert "| DR-Generator-8B | **<u>100.0</u>** | 0.250 | **<u>100.0</u>** | 0.250 | **<u>100.0</u>** | 0.200 |" in md
    assert "| *paper* | 52.1 | - | 64.7 | - | 67.7 | - | 63.4 | - | 43.8 | 0.826 | - | 21.0 | 0.720 | - |" in md
    assert "reports no gap" in md
    tex = render_latex(spec, results)
    assert r"JudgeBench $\Delta$\_gap" in tex and "\u0394" not in tex
    lines = [r for r in csv.DictReader(io.StringIO(render_csv(spec, results))) if r["metric"] == "gap"]
    assert len(lines) == 12 and {r["paper"] for r in lines} == {""}
    rm = {r["benchmark"]: float(r["value"]) for r in lines if r["row"] == "Skywork-27B"}
    assert rm["judgebench"] == pytest.approx(1.0) and rm["nectar_lmsys"] == pytest.approx(2.0)


def test_the_average_stays_over_the_accuracy_columns():
    rows = {"full": "dr"}
    found = [r for r in records() if r.evaluator == "dr"]
    results = compute_results(found, rows)
    spec = dataclasses.replace(report_spec(TABLE3_SPEC, rows), gap=True)
    for label, average in macro_average(spec.columns, results, found, rows).items():
        results[label]["average"] = average
    assert results["full"]["average"]["of"] == 6 and not results["full"]["average"]["partial"]
    md = render_markdown(spec, results, [])
    head = [line for line in md.splitlines() if line.startswith("| Evaluator")][0]
    assert head.endswith("| LMSYS-Chat-1M \u0394_gap | Average |")
    assert "| full | **100.0** | 0.250 | **100.0** | 0.250 | **100.0** | 0.200 | **100.0** | 0.250 | **100.0** | 0.533 " \
           "| **100.0** | 0.533 | **100.0** |" in md
    assert "| *paper* | 57.4 | - | 73.3 | - | 69.8 | - | 68.7 | - | 51.2 | - | 28.0 | - | 58.1 |" in md


def _run(path: Path, *, gap: bool | None) -> Path:
    """A finished table1 run of `ROWS` on `records()`; `gap` as `harness run --gap` records it (None: a run made
    before the option)."""
    path.mkdir()
    settings = {"table": "table1", "rows": ROWS, "benchmarks": ["judgebench"], "seeds": 1, "seed": 0,
                "limit": None, "data": {}, "models": {}}
    config = {"table": "table1", "preset": "paper", "seeds": 1, **({} if gap is None else {"gap": gap})}
    Manifest(path / "manifest.json").start(command="run", settings=settings, config=config,
                                           extra={"rows": ROWS})
    (path / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records()
                                                if r.benchmark == "judgebench"))
    return path


def test_the_run_records_the_choice_and_report_can_override_it(tmp_path: Path):
    asked = _run(tmp_path / "asked", gap=True)
    assert write_reports(asked)["gap"] is True
    assert "| JudgeBench \u0394_gap |" in (asked / "table.md").read_text()
    assert write_reports(asked, gap=False)["gap"] is False
    assert "\u0394_gap" not in (asked / "table.md").read_text().split("Counts per cell")[0]
    older = _run(tmp_path / "older", gap=None)
    payload = write_reports(older)
    assert payload["gap"] is False and "gap" in payload["results"]["Skywork-27B"]["benchmarks"]["judgebench"]
    write_reports(older, gap=True)
    assert "| JudgeBench \u0394_gap |" in (older / "table.md").read_text()


def test_report_takes_gap_and_no_gap_on_the_command_line(tmp_path: Path):
    from typer.testing import CliRunner

    from harness.commands.cli import app

    run = _run(tmp_path / "run", gap=None)
    done = CliRunner().invoke(app, ["report", str(run), "--gap"])
    assert done.exit_code == 0, done.output
    assert "| JudgeBench \u0394_gap |" in done.output
    done = CliRunner().invoke(app, ["report", str(run), "--no-gap"])
    assert done.exit_code == 0 and "| JudgeBench \u0394_gap |" not in done.output
    help_text = CliRunner().invoke(app, ["run", "--help"]).output
    assert "--gap" in help_text


def test_the_view_shows_the_gap_of_each_row_and_record(tmp_path: Path):
    from reports.view.page import build_data
    from reports.view.runs import read_run_dir

    run = _run(tmp_path / "run", gap=None)
    unscored = pair("dr", "judgebench", "c", (None, 0.5))
    with open(run / "records.jsonl", "a") as fh:
        fh.write(json.dumps(unscored.to_json()) + "\n")
    data, details = build_data([read_run_dir(run)])
    table = data["runs"][0]["overview"]["table"]
    assert table["columns"][:3] == ["JudgeBench Acc.", "JudgeBench \u0394_gap", "Personalized-RB Acc."]
    by_row = {r["label"]: r for r in table["rows"]}
    assert [c["text"] for c in by_row["DR-Generator-8B"]["cells"][:2]] == ["66.7", "0.250"]
    assert not by_row["Skywork-27B"]["cells"][1]["best"] and by_row["Skywork-27B"]["paper"][1] == "-"
    # the markdown is table.md as the run asked for it: no gap column
    assert "| JudgeBench \u0394_gap |" not in data["runs"][0]["overview"]["markdown"]
    gaps = {(d["scores"][0], d["scores"][1]): d["values"]["gap"] for d in details}
    assert gaps[(4.0, -2.0)] == 6.0 and gaps[(0.75, 0.5)] == 0.25
    assert gaps[(None, 0.5)] is None  # a pair with a side unscored has no gap (not 0)
