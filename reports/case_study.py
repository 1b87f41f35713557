"""Table 9, the case study: one item scored by each generator row (the paper's G0 and G2), read from the run's
records (no model calls).

Per row: the rubric of repeat 0 (criteria and weights), its verdict matrix over the responses, the raw weighted
sums `sum_m w_m v_m(y)` and the scores (the sums over the total weight); then, over every repeat (each a new rubric,
the candidates shown in an order shuffled by the repeat's seed), the mean nDCG and Acc. of the item. The responses
are listed in gold order: a pair as preferred then other, a list by its gold rank. Acc. is strict (a pair's
preferred response scores higher; a list's gold-best has the unique top score) and nDCG is the benchmark's
(relevance K - rank, tied scores averaged: a tied pair gives 0.8155); a repeat left unscored counts 0 for both and
is counted failed. The paper's sums, nDCG and Acc. go beside ours (`reports.paper.TABLE9`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import metrics
from harness.records import EvalRecord
from harness.runstore import write_json_atomic, write_text_atomic
from reports.tables import TableSpec


def gold_order(record: EvalRecord) -> list[int]:
    """Response indices in gold order: preferred then other, or by gold rank (best first)."""
    if record.preferred is not None:
        return [record.preferred, 1 - record.preferred]
    return sorted(range(len(record.scores)), key=lambda j: record.gold_ranks[j])  # type: ignore[index]


def _gold_ranks(record: EvalRecord) -> np.ndarray:
    if record.preferred is not None:
        return np.array([1.0, 2.0] if record.preferred == 0 else [2.0, 1.0])
    return np.asarray(record.gold_ranks, dtype=float)


def weighted_sums(trace: Mapping[str, Any]) -> list[float | None]:
    """Per response, `sum_m w_m v_m` under the trace's rubric; None where a verdict is missing."""
    rubric, verdicts = trace.get("rubric"), trace.get("verdicts")
    if not rubric or not verdicts:
        return []
    k = len(verdicts[0])
    sums: list[float | None] = []
    for j in range(k):
        column = [row[j] for row in verdicts]
        sums.append(None if any(v is None for v in column)
                    else float(sum(item["weight"] * v for item, v in zip(rubric, column))))
    return sums


def outcome(record: EvalRecord) -> tuple[float, float, bool]:
    """(Acc., nDCG, failed) of one record: strict accuracy and tie-averaged nDCG of its scores against the gold
    order; an unscored response makes both 0 and the record failed."""
    if record.n_unscored:
        return 0.0, 0.0, True
    scores = np.asarray(record.scores, dtype=float)
    gold = _gold_ranks(record)
    return float(metrics.top1_correct(scores, gold)), metrics.list_ndcg(scores, gold), False


def case_results(records: Sequence[EvalRecord], rows: Mapping[str, str]) -> dict[str, Any]:
    """Per row label: the item, repeat 0's rubric, verdicts (in gold order), sums and scores, and per repeat and
    on average Acc. and nDCG."""
    out: dict[str, Any] = {}
    for label, spec in rows.items():
        mine = sorted((r for r in records if r.evaluator == spec), key=lambda r: r.repeat)
        if not mine:
            out[label] = {"evaluator": spec, "repeats": []}
            continue
        first = mine[0]
        order = gold_order(first)
        trace = first.trace
        sums = weighted_sums(trace)
        verdicts = trace.get("verdicts") or []
        repeats = []
        for r in mine:
            acc, ndcg, failed = outcome(r)
            r_sums = weighted_sums(r.trace)
            repeats.append({"repeat": r.repeat, "seed": r.seed, "acc": acc, "ndcg": ndcg, "failed": failed,
                            "sums": [r_sums[j] for j in order] if r_sums else None,
                            "scores": [r.scores[j] for j in order]})
        out[label] = {
            "evaluator": spec,
            "benchmark": first.benchmark,
            "item": first.item,
            "kind": first.kind,
            "order": order,
            "rubric": trace.get("rubric"),
            "verdicts": [[row[j] for j in order] for row in verdicts],
            "sums": [sums[j] for j in order] if sums else None,
            "total_weight": sum(i["weight"] for i in trace.get("rubric") or []),
            "scores": [first.scores[j] for j in order],
            "failures": trace.get("failures") or [],
            "repeats": repeats,
            "acc": float(np.mean([x["acc"] for x in repeats])),
            "ndcg": float(np.mean([x["ndcg"] for x in repeats])),
            "n_failed": sum(x["failed"] for x in repeats),
        }
    return out


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _verdict(value: float | None) -> str:
    if value is None:
        return "failed"
    return {1.0: "yes", 0.0: "no"}.get(float(value), f"{value:.2f}")


def _names(case: Mapping[str, Any]) -> list[str]:
    if case["kind"] == "pairwise":
        return ["preferred", "other"]
    return [f"rank {i + 1}" for i in range(len(case["order"]))]


def _summary(spec: TableSpec, cases: Mapping[str, Any]) -> list[list[str]]:
    """Lines of the summary: per row ours, then the paper's."""
    lines = []
    for row in spec.rows:
        case = cases.get(row.label) or {}
        if case.get("repeats"):
            sums = "/".join(_num(x) for x in case["sums"]) if case["sums"] else "-"
            lines.append([row.label, sums, f"{case['ndcg']:.4f}", f"{case['acc']:.2f}",
                          f"{len(case['repeats'])} ({case['n_failed']} failed)"])
        else:
            lines.append([row.label, "-", "-", "-", "0"])
        paper = spec.paper.get(row.paper) if row.paper else None
        if paper:
            lines.append(["*paper*", "/".join(_num(x) for x in paper["sums"]), f"{paper['ndcg']:.4f}",
                          f"{paper['acc']:.2f}", "5"])
        else:
            lines.append(["*paper*", "-", "-", "-", "-"])
    return lines


_HEAD = ["Generator", "Raw weighted sums, repeat 0", "nDCG (mean over repeats)", "Acc. (mean over repeats)",
         "Repeats"]


def render_markdown(spec: TableSpec, cases: Mapping[str, Any], notes: Sequence[str]) -> str:
    some = next((c for c in cases.values() if c.get("repeats")), None)
    lines = [f"### {spec.title}", ""]
    if some:
        lines += [f"Item `{some['item']}` of {some['benchmark']} ({some['kind']}); responses in gold order: "
                  f"{', '.join(_names(some))}.", ""]
    lines += ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    lines += ["| " + " | ".join(line) + " |" for line in _summary(spec, cases)]
    for row in spec.rows:
        case = cases.get(row.label) or {}
        if not case.get("repeats"):
            continue
        names = _names(case)
        first = case["repeats"][0]
        lines += ["", f"#### {row.label}: the rubric of repeat 0 (seed {first['seed']})", ""]
        if not case["rubric"]:
            why = "; ".join(f"{f['stage']}: {f.get('message', f.get('category'))}" for f in case["failures"])
            lines.append(f"No rubric: {why or 'none recorded'}")
            continue
        head = ["#", "Criterion", "Weight", *names]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m, (item, verdicts) in enumerate(zip(case["rubric"], case["verdicts"]), 1):
            criterion = item["criterion"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {m} | {criterion} | {item['weight']} | " + " | ".join(map(_verdict, verdicts)) + " |")
        sums = case["sums"] or [None] * len(names)
        lines.append("|  | Weighted sum |  | " + " | ".join(map(_num, sums)) + " |")
        lines.append(f"|  | Score (sum / {case['total_weight']}) |  | "
                     + " | ".join("-" if s is None else f"{s:.3f}" for s in case["scores"]) + " |")
        lines += ["", "| Repeat | Seed | Weighted sums | Acc. | nDCG |", "|---|---|---|---|---|"]
        for r in case["repeats"]:
            shown = "/".join(map(_num, r["sums"])) if r["sums"] else "unscored"
            lines.append(f"| {r['repeat']} | {r['seed']} | {shown} | {r['acc']:.0f} | {r['ndcg']:.4f} |")
    lines += ["", __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(), ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines).rstrip() + "\n"


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(a, b)
    return text


def render_latex(spec: TableSpec, cases: Mapping[str, Any]) -> str:
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex(spec.title)}}}", r"\begin{tabular}{lcccc}",
             r"\toprule", " & ".join(_tex(h) for h in _HEAD) + r" \\", r"\midrule"]
    for line in _summary(spec, cases):
        first = r"\quad\textit{paper}" if line[0] == "*paper*" else _tex(line[0])
        lines.append(first + " & " + " & ".join(_tex(x) for x in line[1:]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    for row in spec.rows:
        case = cases.get(row.label) or {}
        if not case.get("rubric"):
            continue
        names = _names(case)
        lines += ["", r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex(row.label)}: the rubric of repeat 0}}",
                  rf"\begin{{tabular}}{{rp{{0.5\linewidth}}c{'c' * len(names)}}}", r"\toprule",
                  " & ".join(["\\#", "Criterion", "Weight", *names]) + r" \\", r"\midrule"]
        for m, (item, verdicts) in enumerate(zip(case["rubric"], case["verdicts"]), 1):
            lines.append(f"{m} & {_tex(item['criterion'])} & {item['weight']} & "
                         + " & ".join(map(_verdict, verdicts)) + r" \\")
        sums = case["sums"] or [None] * len(names)
        lines += [r"\midrule", " & Weighted sum & & " + " & ".join(map(_num, sums)) + r" \\",
                  r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def render_csv(spec: TableSpec, cases: Mapping[str, Any]) -> str:
    """One line per row and repeat (sums and scores in gold order, joined by `/`), then per row its mean over the
    repeats (`repeat` = `mean`) with the paper's values."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["row", "evaluator", "benchmark", "item", "repeat", "seed", "weighted_sums", "scores", "acc",
                     "ndcg", "paper_sums", "paper_acc", "paper_ndcg"])
    for row in spec.rows:
        case = cases.get(row.label) or {}
        paper = (spec.paper.get(row.paper) if row.paper else None) or {}
        for r in case.get("repeats", []):
            writer.writerow([row.label, case["evaluator"], case["benchmark"], case["item"], r["repeat"], r["seed"],
                             "/".join(map(_num, r["sums"])) if r["sums"] else "", "/".join(map(str, r["scores"])),
                             r["acc"], r["ndcg"], "", "", ""])
        if case.get("repeats"):
            writer.writerow([row.label, case["evaluator"], case["benchmark"], case["item"], "mean", "", "", "",
                             case["acc"], case["ndcg"], "/".join(map(_num, paper.get("sums", ()))),
                             paper.get("acc"), paper.get("ndcg")])
    return buf.getvalue()


def write_case_study(run_dir: Path, spec: TableSpec, payload: dict[str, Any], records: Sequence[EvalRecord]
                     ) -> dict[str, Any]:
    """results.json (the run's results plus `case_study`) and table.md, table.tex, table.csv; returns the payload."""
    cases = case_results(records, payload["rows"])
    payload = {**payload, "case_study": cases}
    write_json_atomic(Path(run_dir) / "results.json", payload)
    write_text_atomic(Path(run_dir) / "table.md", render_markdown(spec, cases, payload["notes"]))
    write_text_atomic(Path(run_dir) / "table.tex", render_latex(spec, cases))
    write_text_atomic(Path(run_dir) / "table.csv", render_csv(spec, cases))
    return payload
