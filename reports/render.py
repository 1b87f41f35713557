"""Render results as Markdown, LaTeX (booktabs) and CSV tables with the paper's numbers beside ours.

Each evaluator row is followed by the paper's row. Accuracies print as percentages with one decimal, nDCG with
three. In each column the best of our rows is bold and the best dynamic-rubric generator row underlined, as in
the paper. A cell with no result prints as a dash, and the notes say why (no data, evaluator unavailable).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from reports.tables import Column, TableSpec

CONVENTIONS = (
    "Strict accuracy: a tie counts as wrong; unscorable items count as wrong and are reported as n_failed. "
    "Listwise Acc: the gold best response must have the unique highest score. nDCG: relevance K - rank, linear "
    "gain, log2 discount, tied scores averaged as scikit-learn's ndcg_score. Values are AVG@k over repeats."
)


def _value(results: Mapping[str, Any], label: str, col: Column) -> float | None:
    """The cell's value as printed (scaled by the metric's declared scale), None when there is none."""
    cell = results.get(label, {}).get("benchmarks", {}).get(col.benchmark)
    if not cell or col.metric not in cell:
        return None
    return cell[col.metric]["value"] * col.declared().scale


def _fmt(value: float | None, col: Column) -> str:
    """A printed-scale value (ours already scaled, or the paper's) with the metric's decimals."""
    return "-" if value is None else f"{value:.{col.declared().digits}f}"


def _marks(spec: TableSpec, results: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(row label, column key) -> "best", "best-dynamic" or "best best-dynamic"."""
    marks: dict[tuple[str, str], str] = {}
    for col in spec.columns:
        values = {r.label: _value(results, r.label, col) for r in spec.rows}
        scored = {k: v for k, v in values.items() if v is not None}
        pick = max if col.declared().higher_is_better else min
        if scored:
            best = pick(scored.values())
            for k, v in scored.items():
                if v == best:
                    marks[(k, col.key)] = "best"
        dynamic = {r.label: values[r.label] for r in spec.rows if r.dynamic and values[r.label] is not None}
        if dynamic:
            best = pick(dynamic.values())
            for k, v in dynamic.items():
                if v == best:
                    marks[(k, col.key)] = (marks.get((k, col.key), "") + " best-dynamic").strip()
    return marks


POLICY_CONVENTIONS = (
    "Each policy answers each prompt once per repeat (the judged text without <think> blocks); the table's judge "
    "judges every answer with the benchmark's protocol; a judgment that failed after its re-ask is left out of "
    "the value and counted as failed, never defaulted. Win rates and scores in percent; WildBench and "
    "WritingBench x10 as their leaderboards print them."
)


VERIFIABLE_CONVENTIONS = (
    "Each policy answers each problem once per repeat (sampled; the checked text without <think> blocks); a "
    "deterministic checker scores it (no judge model): 1 for a verified answer, 0 otherwise, a check that timed "
    "out counted as failed and wrong. Values are AVG@k over repeats, in percent."
)


def _conventions(spec: TableSpec) -> str:
    if spec.kind != "policy":
        return CONVENTIONS
    if spec.setups and all(s.judge is None for s in spec.setups.values()):
        return VERIFIABLE_CONVENTIONS
    return POLICY_CONVENTIONS


def _header(spec: TableSpec) -> list[str]:
    return ["Policy" if spec.kind == "policy" else "Evaluator"] + [spec.header(c) for c in spec.columns]


def _paper_cells(spec: TableSpec, paper_label: str | None) -> list[str]:
    row = spec.paper.get(paper_label) if paper_label else None
    return [_fmt(row.get(c.key) if row else None, c) for c in spec.columns]


def render_markdown(spec: TableSpec, results: Mapping[str, Any], notes: list[str]) -> str:
    marks = _marks(spec, results)
    head = _header(spec)
    lines = [f"### {spec.title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in spec.rows:
        cells = []
        for col in spec.columns:
            text = _fmt(_value(results, row.label, col), col)
            mark = marks.get((row.label, col.key), "")
            text = f"<u>{text}</u>" if "best-dynamic" in mark else text
            cells.append(f"**{text}**" if "best" in mark.split() else text)
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
        lines.append("| *paper* | " + " | ".join(_paper_cells(spec, row.paper)) + " |")
    lines += ["", "Counts per cell: n items (of which failed to score) and tie rate, summed over repeats.", ""]
    lines += [f"| {head[0]} | " + " | ".join(head[1:]) + " |", "|" + "---|" * len(head)]
    for row in spec.rows:
        cells = []
        for col in spec.columns:
            cell = results.get(row.label, {}).get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)
            cells.append(
                f"{cell['n'] * cell['repeats']} ({cell['n_failed']} failed), ties {cell['tie_rate']:.0%}" if cell else "-"
            )
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    lines += ["", _conventions(spec), ""]
    lines += [f"- {spec.header(c)}: {c.declared().description}" for c in spec.columns]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines).rstrip() + "\n"


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
        text = text.replace(a, b)
    return text


def render_latex(spec: TableSpec, results: Mapping[str, Any]) -> str:
    marks = _marks(spec, results)
    cols = "l" + "c" * len(spec.columns)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex_escape(spec.title)}}}",
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(_tex_escape(h) for h in _header(spec)) + r" \\",
        r"\midrule",
    ]
    for row in spec.rows:
        cells = []
        for col in spec.columns:
            text = _fmt(_value(results, row.label, col), col)
            mark = marks.get((row.label, col.key), "").split()
            if "best-dynamic" in mark:
                text = rf"\underline{{{text}}}"
            if "best" in mark:
                text = rf"\textbf{{{text}}}"
            cells.append(text)
        lines.append(_tex_escape(row.label) + " & " + " & ".join(cells) + r" \\")
        lines.append(r"\quad\textit{paper} & " + " & ".join(_paper_cells(spec, row.paper)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def render_csv(spec: TableSpec, results: Mapping[str, Any]) -> str:
    """Long format: one line per row x column with ours, the paper's, n, n_failed, tie rate and the interval."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["row", "evaluator", "benchmark", "metric", "value", "std", "paper", "n", "n_failed",
                     "tie_rate", "ci_low", "ci_high", "repeats"])
    for row in spec.rows:
        res = results.get(row.label, {})
        paper = spec.paper.get(row.paper, {}) if row.paper else {}
        for col in spec.columns:
            cell = res.get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)
            scale = col.declared().scale
            if cell:
                values = [cell["value"] * scale, cell["std"] * scale, paper.get(col.key), cell["n"],
                          cell["n_failed"], cell["tie_rate"], cell["ci_low"] * scale, cell["ci_high"] * scale,
                          cell["repeats"]]
            else:
                values = [None, None, paper.get(col.key), None, None, None, None, None, None]
            writer.writerow([row.label, res.get("evaluator"), col.benchmark, col.metric, *values])
    return buf.getvalue()
