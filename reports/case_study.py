"""Table 9, the case study: one item scored by each generator row (the paper's G0 and G2), read from the run's
records (no model calls).

The paper's protocol: five independently generated rubric sets, each with its items in a shuffled order; nDCG and
Acc. are means over the five. Here each repeat of the run is one rubric (the table runs 5 repeats: `--seeds K`
changes it): the repeat's seed, `derive_seed(run seed, benchmark, item, repeat)`, seeds the generator's sampling
and the order it sees the candidates in, so the five requests differ and none is a cache hit of another. Each
rubric's items are listed in an order shuffled by `derive_seed(record seed, "rubric_order")`. Under `per_item`
verification (the paper's, the rows' default) and `logprob`, each verdict is asked about one item alone, so its
position cannot change it: the verdicts move with their items and the sums stay the rubric's. Under `batched`
verification (our addition: one answer sheet per response, the items in rubric order) the order can change the
verdicts, and re-verifying in another order takes model calls, which a report never makes: such a row lists each
rubric in the order its verifier read it, and says so.

Per row and rubric: the criteria and weights, the verdict matrix over the responses, the raw weighted sums
`sum_m w_m v_m(y)` and the scores (the sums over the total weight), Acc. and nDCG; per row their means and standard
deviations over the rubrics beside the paper's (`reports.paper.TABLE9`, whose sums are its seed-0 rubric's: ours
are rubric 0's). The responses are listed in gold order: a pair as preferred then other, a list by its gold rank.
Acc. is strict (a pair's preferred response scores higher; a list's gold-best has the unique top score) and nDCG is
the benchmark's (relevance K - rank, tied scores averaged: a tied pair gives 0.8155); a rubric left unscored counts
0 for both and is counted failed.
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import metrics
from harness.records import EvalRecord
from harness.runstore import write_json_atomic, write_text_atomic
from harness.seeds import derive_seed
from reports.tables import TableSpec

RUBRICS = 5
"""Independently generated rubrics per row, as the paper's case study averages over (the table's default seeds)."""
ORDER_FREE_MODES = ("per_item", "logprob")
"""Verification modes whose verdicts do not depend on the order of the rubric's items (one item per question)."""
DESCRIPTION = (
    "Five rubrics per generator, each generated independently (one per repeat: its own seed and candidate order) "
    "and listed with its items in a seeded shuffled order, as the paper's case study; nDCG and Acc. are means (and "
    "standard deviations) over the rubrics. Verified item by item (per_item, logprob), a verdict cannot depend on "
    "where its item sits; a batched verifier's rubric is listed in the order it read. Acc. is strict (a tie is "
    "wrong), nDCG the benchmark's (relevance K - rank, tied scores averaged: a tied pair gives 0.8155); an unscored "
    "rubric counts 0 and is counted failed. Raw weighted sums are rubric 0's."
)


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


def item_order(n_items: int, seed: int) -> list[int]:
    """A rubric's items (indices) in the order shuffled by `derive_seed(seed, "rubric_order")`."""
    order = list(range(n_items))
    random.Random(derive_seed(seed, "rubric_order")).shuffle(order)
    return order


def verify_mode(spec: str) -> str:
    """The verification mode an evaluator spec names (`mode=`; default `per_item`)."""
    from judges.base import parse_evaluator_spec

    return parse_evaluator_spec(spec)[1].get("mode", "per_item")


def outcome(record: EvalRecord) -> tuple[float, float, bool]:
    """(Acc., nDCG, failed) of one record: strict accuracy and tie-averaged nDCG of its scores against the gold
    order; an unscored response makes both 0 and the record failed."""
    if record.n_unscored:
        return 0.0, 0.0, True
    scores = np.asarray(record.scores, dtype=float)
    gold = _gold_ranks(record)
    return float(metrics.top1_correct(scores, gold)), metrics.list_ndcg(scores, gold), False


def rubric_case(record: EvalRecord, *, shuffled: bool) -> dict[str, Any]:
    """One rubric of a row: its repeat and seed, its items (`shuffled`: in `item_order`, else as generated and
    verified; `items` numbers each as generated, from 1), its verdicts, sums and scores in gold response order,
    Acc., nDCG and failed."""
    trace = record.trace
    rubric, verdicts = trace.get("rubric") or [], trace.get("verdicts") or []
    order = item_order(len(rubric), record.seed) if shuffled else list(range(len(rubric)))
    gold = gold_order(record)
    sums = weighted_sums(trace)
    acc, ndcg, failed = outcome(record)
    return {"repeat": record.repeat, "seed": record.seed, "shuffled": shuffled,
            "items": [i + 1 for i in order],
            "rubric": [rubric[i] for i in order] if rubric else None,
            "verdicts": [[verdicts[i][j] for j in gold] if verdicts else [None] * len(gold) for i in order],
            "sums": [sums[j] for j in gold] if sums else None,
            "total_weight": sum(item["weight"] for item in rubric),
            "scores": [record.scores[j] for j in gold],
            "failures": trace.get("failures") or [],
            "acc": acc, "ndcg": ndcg, "failed": failed}


def _sd(values: Sequence[float]) -> float | None:
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def case_results(records: Sequence[EvalRecord], rows: Mapping[str, str]) -> dict[str, Any]:
    """Per row label: the item, each repeat's rubric (`rubrics`: items, verdicts and sums in gold order, Acc. and
    nDCG), rubric 0's sums and scores, and the means (`acc`, `ndcg`: the paper's numbers) and standard deviations
    (`acc_sd`, `ndcg_sd`; None for one rubric) over the rubrics."""
    out: dict[str, Any] = {}
    for label, spec in rows.items():
        mine = sorted((r for r in records if r.evaluator == spec), key=lambda r: r.repeat)
        if not mine:
            out[label] = {"evaluator": spec, "rubrics": []}
            continue
        first = mine[0]
        mode = verify_mode(spec)
        rubrics = [rubric_case(r, shuffled=mode in ORDER_FREE_MODES) for r in mine]
        out[label] = {
            "evaluator": spec,
            "benchmark": first.benchmark,
            "item": first.item,
            "kind": first.kind,
            "order": gold_order(first),
            "verify_mode": mode,
            "order_note": None if mode in ORDER_FREE_MODES else (
                f"mode={mode}: the verifier read each rubric's items in one sheet in the order generated, and "
                "another order would need it again (a report makes no model calls): the rubrics are listed as read"),
            "rubrics": rubrics,
            "sums": rubrics[0]["sums"],
            "scores": rubrics[0]["scores"],
            "total_weight": rubrics[0]["total_weight"],
            "acc": float(np.mean([x["acc"] for x in rubrics])),
            "ndcg": float(np.mean([x["ndcg"] for x in rubrics])),
            "acc_sd": _sd([x["acc"] for x in rubrics]),
            "ndcg_sd": _sd([x["ndcg"] for x in rubrics]),
            "n_failed": sum(x["failed"] for x in rubrics),
        }
    return out


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _sd_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


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
        if case.get("rubrics"):
            sums = "/".join(_num(x) for x in case["sums"]) if case["sums"] else "-"
            lines.append([row.label, sums, f"{case['ndcg']:.4f}", _sd_text(case["ndcg_sd"]), f"{case['acc']:.2f}",
                          _sd_text(case["acc_sd"]), f"{len(case['rubrics'])} ({case['n_failed']} failed)"])
        else:
            lines.append([row.label, "-", "-", "-", "-", "-", "0"])
        paper = spec.paper.get(row.paper) if row.paper else None
        if paper:
            lines.append(["*paper*", "/".join(_num(x) for x in paper["sums"]), f"{paper['ndcg']:.4f}", "-",
                          f"{paper['acc']:.2f}", "-", str(RUBRICS)])
        else:
            lines.append(["*paper*", "-", "-", "-", "-", "-", "-"])
    return lines


_HEAD = ["Generator", "Raw weighted sums (rubric 0)", "nDCG (mean over rubrics)", "nDCG sd",
         "Acc. (mean over rubrics)", "Acc. sd", "Rubrics"]


def _rubric_lines(rubric: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """One rubric as a Markdown table: its items in the order listed (numbered as generated), verdicts, sums."""
    if not rubric["rubric"]:
        why = "; ".join(f"{f['stage']}: {f.get('message', f.get('category'))}" for f in rubric["failures"])
        return [f"No rubric: {why or 'none recorded'}"]
    head = ["#", "Criterion", "Weight", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for number, item, verdicts in zip(rubric["items"], rubric["rubric"], rubric["verdicts"]):
        criterion = item["criterion"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {number} | {criterion} | {item['weight']} | " + " | ".join(map(_verdict, verdicts)) + " |")
    sums = rubric["sums"] or [None] * len(names)
    lines.append("|  | Weighted sum |  | " + " | ".join(map(_num, sums)) + " |")
    lines.append(f"|  | Score (sum / {rubric['total_weight']}) |  | "
                 + " | ".join("-" if s is None else f"{s:.3f}" for s in rubric["scores"]) + " |")
    return lines


def render_markdown(spec: TableSpec, cases: Mapping[str, Any], notes: Sequence[str]) -> str:
    some = next((c for c in cases.values() if c.get("rubrics")), None)
    lines = [f"### {spec.title}", ""]
    if some:
        lines += [f"Item `{some['item']}` of {some['benchmark']} ({some['kind']}); responses in gold order: "
                  f"{', '.join(_names(some))}.", ""]
    lines += ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    lines += ["| " + " | ".join(line) + " |" for line in _summary(spec, cases)]
    for row in spec.rows:
        case = cases.get(row.label) or {}
        if not case.get("rubrics"):
            continue
        names = _names(case)
        lines += ["", f"#### {row.label}: {len(case['rubrics'])} rubrics", "",
                  "| Rubric | Repeat | Seed | Items in order | Weighted sums | Acc. | nDCG |",
                  "|---|---|---|---|---|---|---|"]
        for n, r in enumerate(case["rubrics"]):
            shown = "/".join(map(_num, r["sums"])) if r["sums"] else "unscored"
            lines.append(f"| {n} | {r['repeat']} | {r['seed']} | {', '.join(map(str, r['items'])) or '-'} | {shown} | "
                         f"{r['acc']:.0f} | {r['ndcg']:.4f} |")
        if case["order_note"]:
            lines += ["", f"Item order: {case['order_note']}."]
        for n, r in enumerate(case["rubrics"]):
            listed = "items in a shuffled order" if r["shuffled"] else "items as verified"
            lines += ["", f"##### {row.label}, rubric {n} (repeat {r['repeat']}, seed {r['seed']}; {listed})", ""]
            lines += _rubric_lines(r, names)
    lines += ["", DESCRIPTION, ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines).rstrip() + "\n"


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(a, b)
    return text


def render_latex(spec: TableSpec, cases: Mapping[str, Any]) -> str:
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex(spec.title)}}}", r"\begin{tabular}{lcccccc}",
             r"\toprule", " & ".join(_tex(h) for h in _HEAD) + r" \\", r"\midrule"]
    for line in _summary(spec, cases):
        first = r"\quad\textit{paper}" if line[0] == "*paper*" else _tex(line[0])
        lines.append(first + " & " + " & ".join(_tex(x) for x in line[1:]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    for row in spec.rows:
        case = cases.get(row.label) or {}
        names = _names(case) if case.get("rubrics") else []
        for n, r in enumerate(case.get("rubrics") or []):
            if not r["rubric"]:
                continue
            lines += ["", r"\begin{table}[t]", r"\centering",
                      rf"\caption{{{_tex(row.label)}: rubric {n} (repeat {r['repeat']})}}",
                      rf"\begin{{tabular}}{{rp{{0.5\linewidth}}c{'c' * len(names)}}}", r"\toprule",
                      " & ".join(["\\#", "Criterion", "Weight", *names]) + r" \\", r"\midrule"]
            for number, item, verdicts in zip(r["items"], r["rubric"], r["verdicts"]):
                lines.append(f"{number} & {_tex(item['criterion'])} & {item['weight']} & "
                             + " & ".join(map(_verdict, verdicts)) + r" \\")
            sums = r["sums"] or [None] * len(names)
            lines += [r"\midrule", " & Weighted sum & & " + " & ".join(map(_num, sums)) + r" \\",
                      r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def render_csv(spec: TableSpec, cases: Mapping[str, Any]) -> str:
    """Per row: a line per rubric (`line` = `rubric`, `index` its repeat, `items` its items in the order listed,
    numbered as generated), then the mean over them (`line` = `mean`, with the standard deviations) with the
    paper's values. Sums and scores in gold order, joined by `/`."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["row", "evaluator", "benchmark", "item", "line", "index", "seed", "items", "weighted_sums",
                     "scores", "acc", "ndcg", "acc_sd", "ndcg_sd", "paper_sums", "paper_acc", "paper_ndcg"])
    for row in spec.rows:
        case = cases.get(row.label) or {}
        if not case.get("rubrics"):
            continue
        paper = (spec.paper.get(row.paper) if row.paper else None) or {}
        head = [row.label, case["evaluator"], case["benchmark"], case["item"]]
        for r in case["rubrics"]:
            writer.writerow([*head, "rubric", r["repeat"], r["seed"], "/".join(map(str, r["items"])),
                             "/".join(map(_num, r["sums"])) if r["sums"] else "", "/".join(map(str, r["scores"])),
                             r["acc"], r["ndcg"], "", "", "", "", ""])
        writer.writerow([*head, "mean", "", "", "", "", "", case["acc"], case["ndcg"],
                         "" if case["acc_sd"] is None else case["acc_sd"],
                         "" if case["ndcg_sd"] is None else case["ndcg_sd"],
                         "/".join(map(_num, paper.get("sums", ()))), paper.get("acc"), paper.get("ndcg")])
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
