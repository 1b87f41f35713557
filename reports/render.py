"""Render results as Markdown, LaTeX (booktabs) and CSV tables with the paper's numbers beside ours.

Each evaluator row is followed by the paper's row. Accuracies print as percentages with one decimal, nDCG with
three. In each column the best of our rows is bold and the best dynamic-rubric generator row underlined, as in
the paper. A cell with no result prints as a dash, and the notes say why (no data, evaluator unavailable).

A table's `layout` may turn it: `benchmarks_as_rows` prints a line per column (each followed by the paper's) and
the rows as columns (Table 7). A table with `average` adds an Average column (Table 3), the macro mean of the
row's columns from `results[row]["average"]` (`reports.results.macro_average`): a row missing a column has
none (a dash, and a note naming the columns), since the paper's Average is over every column; the paper's Average
prints only where the table has all the columns the paper averaged. A table with `gap` (`harness run|report
--gap`) also prints Δ_gap after each benchmark's columns (`TableSpec.shown`); the paper has no gap, so its row
prints dashes there, and no best row is marked in a gap column (`Metric.ranked`). Table 9's case study has a
renderer of its own (`reports.case_study`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from reports.tables import GAP, Column, TableSpec

CONVENTIONS = (
    "Strict accuracy: a tie counts as wrong; unscorable items count as wrong and are reported as n_failed. "
    "Listwise Acc: the gold best response must have the unique highest score. nDCG: relevance K - rank, linear "
    "gain, log2 discount, tied scores averaged as scikit-learn's ndcg_score. Values are AVG@k over repeats."
)


GAP_NOTE = (
    "\u0394_gap columns (--gap): the mean over the scored items of score(preferred) - score(other) in the "
    "evaluator's own units (a rubric score in [0, 1], a reward model's logit), so no best row is marked; the paper "
    "reports no gap."
)


def metric_cell(results: Mapping[str, Any], label: str, col: Column) -> dict[str, Any] | None:
    """The row's result of the column's metric (`reports.results`), None when there is none."""
    cell = results.get(label, {}).get("benchmarks", {}).get(col.benchmark)
    return cell.get(col.metric) if cell else None


def cell_value(results: Mapping[str, Any], label: str, col: Column) -> float | None:
    """The cell's value as printed (scaled by the scale the result carries), None when there is none."""
    cell = metric_cell(results, label, col)
    return None if cell is None else cell["value"] * cell["scale"]


def cell_text(results: Mapping[str, Any], label: str, col: Column) -> str:
    """The cell as printed: its scaled value with the decimals the result carries, a dash for none."""
    cell = metric_cell(results, label, col)
    return "-" if cell is None else f"{cell['value'] * cell['scale']:.{cell['digits']}f}"


def paper_text(value: float | None, col: Column) -> str:
    """A paper's value (already at the printed scale) with the decimals the column's metric declares: the
    paper's numbers are the table's, not results that carry their own."""
    return "-" if value is None else f"{value:.{col.declared().digits}f}"


def best_marks(spec: TableSpec, results: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(row label, column key) -> "best", "best-dynamic" or "best best-dynamic"."""
    marks: dict[tuple[str, str], str] = {}
    for col in spec.shown:
        if not col.declared().ranked:
            continue
        values = {r.label: cell_value(results, r.label, col) for r in spec.rows}
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
    "the value and counted as failed, never defaulted."
)
"""A policy table's conventions; its own `TableSpec.scale_note` follows (how its values print)."""


VERIFIABLE_CONVENTIONS = (
    "Each policy answers each problem once per repeat (sampled; the checked text without <think> blocks); a "
    "deterministic checker scores it (no judge model): 1 for a verified answer, 0 otherwise, a check that timed "
    "out counted as failed and wrong. Values are AVG@k over repeats, in percent."
)


def conventions(spec: TableSpec) -> str:
    """The paragraph under the table: its kind's conventions, then its own `scale_note` where it has one."""
    if spec.kind != "policy":
        text = CONVENTIONS
    elif spec.setups and all(s.judge is None for s in spec.setups.values()):
        text = VERIFIABLE_CONVENTIONS
    else:
        text = POLICY_CONVENTIONS
    return f"{text} {spec.scale_note}" if spec.scale_note else text


def paper_cells(spec: TableSpec, paper_label: str | None) -> list[str]:
    row = spec.paper.get(paper_label) if paper_label else None
    return [paper_text(row.get(c.key) if row else None, c) for c in spec.shown]


AVERAGE_DESCRIPTION = (
    "the macro mean of the row's columns (each an AVG@k); its interval resamples each column's items on their own. "
    "A row missing a column has no Average (a dash): the paper's Average is over all its columns."
)


def _average(results: Mapping[str, Any], label: str) -> dict[str, Any] | None:
    """The row's Average where it has one over every column; None for none or a partial one."""
    found = results.get(label, {}).get("average")
    return found if found and found.get("value") is not None and not found.get("partial") else None


def average_text(results: Mapping[str, Any], label: str) -> str:
    """The row's Average as printed (percent, one decimal), a dash for none or a partial one."""
    found = _average(results, label)
    return "-" if found is None else f"{found['value'] * 100:.1f}"


def average_counts(spec: TableSpec, results: Mapping[str, Any], label: str) -> str:
    """How many columns the row's Average covers, naming those without a value."""
    found = results.get(label, {}).get("average")
    if not found:
        return "-"
    missing = [spec.header(c) for c in spec.columns if c.key not in found["columns"]]
    return f"{len(found['columns'])} of {found['of']} columns" + (f" (no value in {', '.join(missing)})" if missing else "")


def paper_average(spec: TableSpec, paper_label: str | None) -> float | None:
    """The paper's Average of the row, where the table has exactly the columns the paper averaged (a table
    narrowed to some benchmarks, `items:`, does not)."""
    row = spec.paper.get(paper_label) if paper_label else None
    if not row or row.get("average") is None:
        return None
    averaged = set(row) - {"average"}
    return row["average"] if averaged == {c.key for c in spec.columns} else None


def average_notes(spec: TableSpec, results: Mapping[str, Any]) -> list[str]:
    """A note per row whose Average is left out for a missing column, and one when the paper's Average is over
    other columns than the table's."""
    if not spec.average:
        return []
    notes = []
    for row in spec.rows:
        found = results.get(row.label, {}).get("average")
        if found and found.get("partial"):
            missing = [spec.header(c) for c in spec.columns if c.key not in found["columns"]]
            notes.append(f"{row.label}: no Average: no value in {', '.join(missing)} (the paper's Average is over "
                         f"all {found['of']} columns; the mean of the other {len(found['columns'])} is kept in "
                         "results.json, marked partial)")
    papers = [r for r in spec.rows if r.paper and (spec.paper.get(r.paper) or {}).get("average") is not None]
    if any(paper_average(spec, r.paper) is None for r in papers):
        notes.append("the paper's Average is over all of its benchmarks, which this table does not have: its "
                     "Average prints a dash")
    return notes


def _average_marks(spec: TableSpec, results: Mapping[str, Any]) -> dict[str, str]:
    """Row label -> "best" for the best Average of our rows (and "best-dynamic" among the dynamic-rubric rows)."""
    values = {r.label: _average(results, r.label) for r in spec.rows}
    scored = {k: v["value"] for k, v in values.items() if v}
    marks: dict[str, str] = {}
    if scored:
        best = max(scored.values())
        marks.update({k: "best" for k, v in scored.items() if v == best})
    dynamic = {r.label: scored[r.label] for r in spec.rows if r.dynamic and r.label in scored}
    if dynamic:
        best = max(dynamic.values())
        for k, v in dynamic.items():
            if v == best:
                marks[k] = (marks.get(k, "") + " best-dynamic").strip()
    return marks


def _cells(spec: TableSpec, results: Mapping[str, Any], *, bold: str, underline: str) -> list[dict[str, Any]]:
    """One entry per row: its label, our cells (marked: `bold` and `underline` are format strings with `{}`),
    the paper's cells and the counts, over the columns and, for a table with an Average, that last."""
    marks, averages = best_marks(spec, results), _average_marks(spec, results)
    out = []
    for row in spec.rows:
        ours, counts = [], []
        for col in spec.shown:
            text = cell_text(results, row.label, col)
            ours.append(_marked(text, marks.get((row.label, col.key), ""), bold=bold, underline=underline))
            cell = results.get(row.label, {}).get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)
            counts.append(f"{cell['n'] * cell['repeats']} ({cell['n_failed']} failed), ties {cell['tie_rate']:.0%}"
                          if cell else "-")
        paper = paper_cells(spec, row.paper)
        if spec.average:
            ours.append(_marked(average_text(results, row.label), averages.get(row.label, ""), bold=bold,
                                underline=underline))
            counts.append(average_counts(spec, results, row.label))
            value = paper_average(spec, row.paper)
            paper.append("-" if value is None else f"{value:.1f}")
        out.append({"label": row.label, "ours": ours, "paper": paper, "counts": counts})
    return out


def _marked(text: str, mark: str, *, bold: str, underline: str) -> str:
    text = underline.format(text) if "best-dynamic" in mark else text
    return bold.format(text) if "best" in mark.split() else text


def _column_names(spec: TableSpec) -> list[str]:
    return [spec.header(c) for c in spec.shown] + (["Average"] if spec.average else [])


def _lines(spec: TableSpec, cells: list[dict[str, Any]], *, paper: str, what: str = "ours"
           ) -> tuple[list[str], list[list[str]]]:
    """(header, lines) in the table's layout: a line per row followed by the paper's (`rows`), or a line per
    column followed by the paper's, with the rows as columns (`benchmarks_as_rows`). `what`: `ours` (with the
    paper's lines) or `counts`."""
    corner = "Policy" if spec.kind == "policy" else "Evaluator"
    names = _column_names(spec)
    lines: list[list[str]] = []
    if spec.layout == "benchmarks_as_rows":
        for i, name in enumerate(names):
            lines.append([name] + [c[what][i] for c in cells])
            if what == "ours":
                lines.append([paper] + [c["paper"][i] for c in cells])
        return ["Benchmark"] + [c["label"] for c in cells], lines
    for c in cells:
        lines.append([c["label"]] + c[what])
        if what == "ours":
            lines.append([paper] + c["paper"])
    return [corner] + names, lines


def render_markdown(spec: TableSpec, results: Mapping[str, Any], notes: list[str]) -> str:
    cells = _cells(spec, results, bold="**{}**", underline="<u>{}</u>")
    head, body = _lines(spec, cells, paper="*paper*")
    lines = [f"### {spec.title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(line) + " |" for line in body]
    lines += ["", "Counts per cell: n items (of which failed to score) and tie rate, summed over repeats.", ""]
    head, body = _lines(spec, cells, paper="*paper*", what="counts")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(line) + " |" for line in body]
    lines += ["", conventions(spec), ""]
    lines += [f"- {spec.header(c)}: {c.declared().description}" for c in spec.shown]
    if spec.average:
        lines.append(f"- Average: {AVERAGE_DESCRIPTION}")
    if any(c.metric == GAP for c in spec.shown):
        lines.append(f"- {GAP_NOTE}")
    lines += [f"- {n}" for n in [*average_notes(spec, results), *notes]]
    return "\n".join(lines).rstrip() + "\n"


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("\u2020", r"$^\dagger$"), ("\u0394", r"$\Delta$")):
        text = text.replace(a, b)
    return text


def render_latex(spec: TableSpec, results: Mapping[str, Any]) -> str:
    cells = _cells(spec, results, bold=r"\textbf{{{}}}", underline=r"\underline{{{}}}")
    head, body = _lines(spec, cells, paper=r"\quad\textit{paper}")
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex_escape(spec.title)}}}",
        rf"\begin{{tabular}}{{l{'c' * (len(head) - 1)}}}",
        r"\toprule",
        " & ".join(_tex_escape(h) for h in head) + r" \\",
        r"\midrule",
    ]
    for line in body:
        first = line[0] if line[0].startswith("\\quad") else _tex_escape(line[0])
        lines.append(first + " & " + " & ".join(line[1:]) + r" \\")
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
        for col in spec.shown:
            cell = res.get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)
            if cell:
                scale = cell["scale"]
                values = [cell["value"] * scale, cell["std"] * scale, paper.get(col.key), cell["n"],
                          cell["n_failed"], cell["tie_rate"], cell["ci_low"] * scale, cell["ci_high"] * scale,
                          cell["repeats"]]
            else:
                values = [None, None, paper.get(col.key), None, None, None, None, None, None]
            writer.writerow([row.label, res.get("evaluator"), col.benchmark, col.metric, *values])
        if spec.average:  # benchmark `average`, metric `macro`; n: the columns with a value (none: no Average)
            found = _average(results, row.label)
            given = results.get(row.label, {}).get("average") or {}
            values = [None] * 9 if found is None else [
                found["value"] * 100, None, None, len(found["columns"]), None, None, found["ci_low"] * 100,
                found["ci_high"] * 100, None]
            if found is None and given.get("columns"):
                values[3] = len(given["columns"])
            values[2] = paper_average(spec, row.paper)
            writer.writerow([row.label, res.get("evaluator"), "average", "macro", *values])
    return buf.getvalue()
