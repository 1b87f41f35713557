"""Table 7 is printed as the paper prints it: the benchmarks as lines (each followed by the paper's), the
(backbone, variant) rows as columns."""

from __future__ import annotations

from harness.records import EvalRecord
from reports.evaluator_tables import TABLE7_SPEC
from reports.render import render_latex, render_markdown
from reports.report import report_spec
from reports.results import compute_results

ROWS = {"Llama-3.1-8B native": "e-ln", "Llama-3.1-8B DR": "e-ld", "Qwen3-8B native": "e-qn", "Qwen3-8B DR": "e-qd"}


def _pairs(spec: str, right: int, of: int) -> list[EvalRecord]:
    return [EvalRecord(spec, "judgebench", f"j{i}", 0, 0, "pairwise", (1.0, 0.0) if i < right else (0.0, 1.0),
                       preferred=0) for i in range(of)]


def test_benchmarks_are_lines_and_backbones_columns():
    found = _pairs("e-ln", 1, 4) + _pairs("e-ld", 2, 4) + _pairs("e-qn", 1, 4) + _pairs("e-qd", 3, 4)
    spec = report_spec(TABLE7_SPEC, ROWS)
    results = compute_results(found, ROWS)
    md = render_markdown(spec, results, [])
    lines = md.splitlines()
    head = "| Benchmark | Llama-3.1-8B native | Llama-3.1-8B DR | Qwen3-8B native | Qwen3-8B DR |"
    assert lines[2] == head
    at = lines.index("| JudgeBench | 25.0 | 50.0 | 25.0 | **<u>75.0</u>** |")  # best in bold, best DR row underlined
    assert lines[at + 1] == "| *paper* | 34.8 | 46.8 | 36.4 | 57.4 |"
    assert lines[at + 2] == "| Personalized-RB | - | - | - | - |"
    assert lines[at + 3] == "| *paper* | 54.4 | 71.1 | 53.7 | 73.3 |"
    assert "| *paper* | 13.3 | 24.7 | 12.0 | 28.0 |" in lines  # LMSYS-Chat-1M, the last benchmark
    assert "| JudgeBench | 4 (0 failed), ties 0% | 4 (0 failed), ties 0% | 4 (0 failed), ties 0% |" in md
    tex = render_latex(spec, results)
    assert r"JudgeBench & 25.0 & 50.0 & 25.0 & \textbf{\underline{75.0}} \\" in tex
    assert r"\quad\textit{paper} & 34.8 & 46.8 & 36.4 & 57.4 \\" in tex
