"""`harness compare --junit --summary`: the JUnit XML and the Markdown summary for CI, through the CLI, and the
README's GitHub Actions workflow, its gate step run as GitHub's bash shell runs it."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml
from test_compare import BASE_SPEC, CAND_SPEC, ROW, make_run
from typer.testing import CliRunner

from harness.commands.cli import app
from harness.records import EvalRecord
from reports.gate_ci import junit_xml, summary_markdown

README = Path(__file__).resolve().parents[2] / "README.md"
LABEL = "Row <a> & \"b\" 'c'"


def _cell(verdict: str, *, row: str = ROW, bench: str = "judgebench", metric: str = "acc", base: float | None = 0.8,
          cand: float | None = 0.6, lo: float | None = -0.25, hi: float | None = -0.15, **extra: Any) -> dict:
    """A cell as `Comparison.to_json()` writes it (300 items, 2 failed in BASE and 5 in CAND)."""
    diff = None if base is None or cand is None else cand - base
    return {"row": row, "benchmark": bench, "metric": metric, "base": base, "candidate": cand, "diff": diff,
            "ci_low": lo, "ci_high": hi, "margin": 1.0, "verdict": verdict, "n_items": 300, "repeats": 1,
            "paired": 300, "dropped": 0, "base_failed": 2, "candidate_failed": 5, "base_to_retry": 0,
            "candidate_to_retry": 0, "base_reported": base, "candidate_reported": cand, "mcnemar": None, **extra}


def _result(cells: list[dict], *, differences: tuple[str, ...] = (), exit_code: int = 1) -> dict:
    return {"base": "runs/base", "candidate": "runs/cand", "comparable": not differences,
            "differences": list(differences), "exit_code": exit_code,
            "config": {"margin": 1.0, "margins": {}, "n_resamples": 1000, "alpha": 0.05, "seed": 0}, "cells": cells}


MIXED = [
    _cell("no significant change", bench="rmbench", base=0.7, cand=0.7, lo=-0.005, hi=0.005),
    _cell("regression"),
    _cell("incomplete", bench="ppe", base_to_retry=3),
    _cell("unscored", bench="rewardbench", base=None, cand=None, lo=None, hi=None, paired=0),
    _cell("underpowered", bench="ultrafeedback", base=0.5, cand=0.49, lo=-0.05, hi=0.03, half_width=0.04,
          items_needed=4800),
    _cell("improvement", bench="helpsteer3", base=0.5, cand=0.6, lo=0.05, hi=0.15),
]


def _cases(xml: str) -> tuple[ET.Element, dict[str, ET.Element]]:
    root = ET.fromstring(xml)
    (suite,) = root.findall("testsuite")
    return suite, {f"{c.get('classname')}/{c.get('name')}": c for c in suite.findall("testcase")}


def test_junit_one_testcase_per_cell_with_its_numbers():
    suite, cases = _cases(junit_xml(_result(MIXED)))
    assert suite.get("name") == "harness compare"
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "6", "failures": "1", "errors": "2", "skipped": "1"}
    failure = cases[f"{ROW}/judgebench.acc"].find("failure")
    assert failure is not None and failure.get("type") == "regression"
    for shown in ("base 80.00", "candidate 60.00", "diff -20.00", "95% CI [-25.00, -15.00]", "margin 1",
                  "items paired 300/300", "failed B/C 2/5"):
        assert shown in failure.get("message", ""), shown
    incomplete = cases[f"{ROW}/ppe.acc"].find("error")
    assert incomplete is not None and "to retry B/C 3/0" in incomplete.get("message", "")
    unscored = cases[f"{ROW}/rewardbench.acc"].find("error")
    assert unscored is not None and unscored.get("type") == "unscored"
    assert "base -, candidate -, diff -" in unscored.get("message", "") and "CI" not in unscored.get("message", "")
    skipped = cases[f"{ROW}/ultrafeedback.acc"].find("skipped")
    assert skipped is not None
    assert "half-width 4.00" in skipped.get("message", "") and "items needed 4800" in skipped.get("message", "")
    for passing in ("rmbench.acc", "helpsteer3.acc"):
        case = cases[f"{ROW}/{passing}"]
        assert [child.tag for child in case] == ["system-out"]


def test_junit_of_incomparable_runs_has_an_erring_comparability_case():
    differences = ("benchmark 'judgebench': dataset fingerprints differ", "setting 'verifier' differs")
    suite, cases = _cases(junit_xml(_result([], differences=differences, exit_code=2)))
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("1", "1", "0")
    error = cases["harness compare/comparability"].find("error")
    assert error is not None and all(d in error.get("message", "") for d in differences)
    assert error.text is not None and error.text.splitlines() == list(differences)


def test_special_characters_survive_both_renderings():
    cells = [_cell("regression", row=LABEL + "\x01|x")]
    _, cases = _cases(junit_xml(_result(cells)))
    assert list(cases) == [f"{LABEL}\ufffd|x/judgebench.acc"]  # a control character XML cannot hold is replaced
    text = summary_markdown(_result(cells))
    assert "Row &lt;a&gt; &amp; \"b\" 'c'" in text and "\\|x" in text and "<a>" not in text


def test_summary_counts_each_failure_class_and_puts_the_worst_cells_first():
    slight = _cell("regression", bench="slight", lo=-0.05, hi=-0.02)  # 1 point past the margin
    cells = [slight, *MIXED] + [_cell("no significant change", bench=f"b{i}", lo=-0.01, hi=0.01) for i in range(7)]
    text = summary_markdown(_result(cells))
    lines = text.splitlines()
    assert lines[0].startswith("**Regression gate: FAILED** (regression), exit code 1: 14 cells")
    for shown in ("- Regressions: 2 cells", "- Incomplete: 1 cell", "- Unscored: 1 cell", "- Underpowered: 1 cell"):
        assert any(line.startswith(shown) for line in lines), shown
    assert "Not comparable" not in text
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| Verdict")]
    order = [row.split(" | ")[2] for row in rows]
    assert order[:6] == ["judgebench.acc", "slight.acc", "ppe.acc", "rewardbench.acc", "ultrafeedback.acc",
                         "rmbench.acc"]
    assert len(rows) == 10 and lines[-1] == "4 more cells in compare.md"
    assert "| Half-width | Items needed |" in text and "| 4.00 | 4800 |" in text


def test_summary_of_a_passing_gate_and_of_incomparable_runs():
    passing = summary_markdown(_result([_cell("improvement", lo=0.05, hi=0.15)], exit_code=0))
    assert passing.startswith("**Regression gate: passed**, exit code 0: 1 cell")
    assert "- " not in passing.split("\n| ")[0] and "Half-width" not in passing and "more cell" not in passing
    refused = summary_markdown(_result([], differences=("setting 'verifier' differs",), exit_code=2))
    assert refused.splitlines()[0].startswith("**Regression gate: FAILED** (runs not comparable), exit code 2")
    assert "- Not comparable: 1 difference\n  - setting 'verifier' differs" in refused and "|" not in refused


def _records(spec: str, correct: list[bool]) -> list[EvalRecord]:
    return [EvalRecord(spec, "ultrafeedback", f"i{i}", 0, 0, "pairwise", (1.0, 0.0) if ok else (0.0, 1.0),
                       preferred=0) for i, ok in enumerate(correct)]


def _pair(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """Two runs: `regression` (~20 points lost), `same` (equal records) or `incomparable` (other data)."""
    rng = random.Random(1)
    base = [rng.random() < 0.8 for _ in range(300)]
    cand = [ok and random.Random(i).random() > 0.25 for i, ok in enumerate(base)] if kind == "regression" else base
    data = {"ultrafeedback": "other"} if kind == "incomparable" else None
    return (make_run(tmp_path / kind / "base", _records(BASE_SPEC, base), rows={ROW: BASE_SPEC}),
            make_run(tmp_path / kind / "cand", _records(CAND_SPEC, cand), rows={ROW: CAND_SPEC}, data=data))


def test_cli_writes_junit_and_summary_beside_compare_json(tmp_path: Path):
    base, cand = _pair(tmp_path, "regression")
    junit, summary = tmp_path / "ci" / "junit.xml", tmp_path / "summary.md"
    result = CliRunner().invoke(app, ["compare", str(base), str(cand), "--out", str(tmp_path / "gate"),
                                      "--junit", str(junit), "--summary", str(summary)])
    assert result.exit_code == 1, result.output
    stored = json.loads((tmp_path / "gate" / "compare.json").read_text())
    assert junit.read_text() == junit_xml(stored) and summary.read_text() == summary_markdown(stored)
    suite, cases = _cases(junit.read_text())
    assert (suite.get("tests"), suite.get("failures")) == ("1", "1")
    assert cases[f"{ROW}/ultrafeedback.acc"].find("failure") is not None
    assert summary.read_text().startswith("**Regression gate: FAILED** (regression), exit code 1: 1 cell")


def _workflow() -> dict:
    match = re.search(r"<!-- ci-workflow -->\n```yaml\n(.*?)```\n<!-- /ci-workflow -->", README.read_text(), re.S)
    assert match, "README.md lost its ci-workflow block"
    return yaml.safe_load(match.group(1))


def test_the_readme_workflow_fails_the_job_on_the_gates_exit_code(tmp_path: Path):
    (job,) = _workflow()["jobs"].values()
    steps = job["steps"]
    gate = [s for s in steps if s.get("id") == "gate"]
    assert len(gate) == 1 and "--junit" in gate[0]["run"] and '--summary "$GITHUB_STEP_SUMMARY"' in gate[0]["run"]
    # A failed step fails the job unless something lets it pass; the reports are kept either way.
    assert not job.get("continue-on-error") and not any(s.get("continue-on-error") for s in steps)
    assert any(s.get("if") == "always()" and s.get("uses", "").startswith("actions/upload-artifact") for s in steps)
    assert job.get("defaults", {}).get("run", {}).get("shell") == "bash"
    script = tmp_path / "gate.sh"
    script.write_text(gate[0]["run"])
    venv_bin = Path(sys.executable).parent
    for kind, code in (("regression", 1), ("incomparable", 2), ("same", 0)):
        base, cand = _pair(tmp_path, kind)
        work, step_summary = tmp_path / f"work-{kind}", tmp_path / f"step-summary-{kind}.md"
        work.mkdir()
        step_summary.write_text("")  # the runner creates the file before the step
        env = {**os.environ, **job.get("env", {}), **gate[0].get("env", {}), "BASE_RUN": str(base),
               "CAND_RUN": str(cand), "GITHUB_STEP_SUMMARY": str(step_summary),
               "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        # GitHub runs a `shell: bash` step as `bash --noprofile --norc -eo pipefail {0}`.
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=work,
                              env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == code, proc.stderr
        assert step_summary.read_text().startswith(f"**Regression gate: {'passed' if code == 0 else 'FAILED'}**")
        assert f"exit code {code}" in step_summary.read_text().splitlines()[0]
        suite, _ = _cases((work / "gate" / "junit.xml").read_text())
        assert int(suite.get("failures", "0")) + int(suite.get("errors", "0")) == (code != 0)
        assert json.loads((work / "gate" / "compare.json").read_text())["exit_code"] == code
