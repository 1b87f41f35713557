"""Table 9, the case study: one item scored by each generator row (the paper's G0 and G2), read from the run's
records (no model calls).

The paper's protocol: each generator writes one rubric for the item, and its nDCG and Acc. are the means over 5
seeds, each seed shuffling the order of the rubric's items. Here the rubric is repeat 0's (the table runs one
repeat unless `--seeds` says more), and each row's `ORDER_SEEDS` item orders are drawn from
`derive_seed(record seed, "rubric_order", s)`. Under `per_item` verification (the paper's, the rows' default) and
`logprob`, each verdict is asked about one item alone, so an item's position in the rubric cannot change it:
every order's verdicts are repeat 0's, permuted, and are computed here rather than asked again (asking would send
the very requests the call cache already holds). The sums, and so nDCG and Acc., then come out the same under
every order; the orders are listed so that this shows. Under `batched` verification (our addition: one answer
sheet per response, the items in rubric order) the order can change the verdicts, and re-verifying in other
orders takes model calls, which a report never makes: such a row reports its rubric's own order only, and says so.

Per row: the rubric (criteria and weights), its verdict matrix over the responses, the raw weighted sums
`sum_m w_m v_m(y)` and the scores (the sums over the total weight), each order's sums, nDCG and Acc., and their
means beside the paper's (`reports.paper.TABLE9`). The responses are listed in gold order: a pair as preferred
then other, a list by its gold rank. Acc. is strict (a pair's preferred response scores higher; a list's
gold-best has the unique top score) and nDCG is the benchmark's (relevance K - rank, tied scores averaged: a tied
pair gives 0.8155); a rubric left unscored counts 0 for both under every order, each counted failed.

Ours beyond the paper: with `--seeds K > 1`, each further repeat is a new rubric, the candidates shown to the
generator in the repeat's shuffled order (Table 1's AVG@k protocol); they are listed as rubric samples with their
mean nDCG and Acc. (`resampled`), apart from the paper's numbers.
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

ORDER_SEEDS = 5
"""Seeds of the rubric's item order per row, as the paper's case study averages over."""
ORDER_FREE_MODES = ("per_item", "logprob")
"""Verification modes whose verdicts do not depend on the order of the rubric's items (one item per question)."""
DESCRIPTION = (
    "One rubric per generator (repeat 0); nDCG and Acc. are means over its items shuffled into 5 orders, as the "
    "paper's case study. Verified item by item (per_item, logprob), a verdict cannot depend on where its item "
    "sits, so every order gives the rubric's own sums; a batched verifier's row reports its rubric's order only. "
    "Acc. is strict (a tie is wrong), nDCG the benchmark's (relevance K - rank, tied scores averaged: a tied pair "
    "gives 0.8155); an unscored rubric counts 0 under every order and is counted failed. Further repeats (--seeds) "
    "are new rubrics, listed as samples of ours."
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


def rubric_orders(n_items: int, seed: int, *, n: int = ORDER_SEEDS) -> list[list[int]]:
    """`n` orders of a rubric's items (indices), each shuffled by `derive_seed(seed, "rubric_order", s)`."""
    orders = []
    for s in range(n):
        order = list(range(n_items))
        random.Random(derive_seed(seed, "rubric_order", s)).shuffle(order)
        orders.append(order)
    return orders


def verify_mode(spec: str) -> str:
    """The verification mode an evaluator spec names (`mode=`; default `per_item`)."""
    from judges.base import parse_evaluator_spec

    return parse_evaluator_spec(spec)[1].get("mode", "per_item")


def _ranked(scores: Sequence[float | None], record: EvalRecord) -> tuple[float, float, bool]:
    if any(s is None for s in scores):
        return 0.0, 0.0, True
    values = np.asarray(scores, dtype=float)
    gold = _gold_ranks(record)
    return float(metrics.top1_correct(values, gold)), metrics.list_ndcg(values, gold), False


def order_outcomes(record: EvalRecord, order_free: bool) -> list[dict[str, Any]] | None:
    """The rubric of `record` under each of its `rubric_orders`: the order (items numbered from 1), the sums and
    scores (response order) and Acc., nDCG and failed, the verdicts permuted with their items (see the module
    docstring); None where the order can change the verdicts (`order_free` False) and a rubric came back."""
    rubric, verdicts = record.trace.get("rubric") or [], record.trace.get("verdicts") or []
    if rubric and not order_free:
        return None
    total = sum(item["weight"] for item in rubric)
    out = []
    for s, order in enumerate(rubric_orders(len(rubric), record.seed)):
        sums = weighted_sums({"rubric": [rubric[i] for i in order], "verdicts": [verdicts[i] for i in order]})
        scores = [None if x is None else x / total for x in sums] if sums else [None] * len(record.scores)
        acc, ndcg, failed = _ranked(scores, record)
        out.append({"seed": derive_seed(record.seed, "rubric_order", s), "order": [i + 1 for i in order],
                    "sums": sums or None, "scores": scores, "acc": acc, "ndcg": ndcg, "failed": failed})
    return out


def outcome(record: EvalRecord) -> tuple[float, float, bool]:
    """(Acc., nDCG, failed) of one record: strict accuracy and tie-averaged nDCG of its scores against the gold
    order; an unscored response makes both 0 and the record failed."""
    if record.n_unscored:
        return 0.0, 0.0, True
    scores = np.asarray(record.scores, dtype=float)
    gold = _gold_ranks(record)
    return float(metrics.top1_correct(scores, gold)), metrics.list_ndcg(scores, gold), False


def case_results(records: Sequence[EvalRecord], rows: Mapping[str, str]) -> dict[str, Any]:
    """Per row label: the item, repeat 0's rubric, verdicts (in gold order), sums and scores; per rubric order and
    on average (`acc`, `ndcg`: the paper's numbers) Acc. and nDCG; and per repeat and on average over the
    repeats (`resampled`, None for one repeat)."""
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
        mode = verify_mode(spec)
        orders = order_outcomes(first, mode in ORDER_FREE_MODES)
        for o in orders or ():  # in gold order, as everything shown
            o["sums"] = [o["sums"][j] for j in order] if o["sums"] else None
            o["scores"] = [o["scores"][j] for j in order]
        counted = orders if orders is not None else repeats[:1]
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
            "verify_mode": mode,
            "orders": orders,
            "orders_note": None if orders is not None else (
                f"mode={mode}: the verifier read the items in one sheet in the rubric's order, and other orders "
                "would need it again (a report makes no model calls): Acc. and nDCG are of the rubric's own order"),
            "acc": float(np.mean([x["acc"] for x in counted])),
            "ndcg": float(np.mean([x["ndcg"] for x in counted])),
            "n_failed": sum(x["failed"] for x in counted),
            "repeats": repeats,
            "resampled": None if len(repeats) < 2 else {
                "acc": float(np.mean([x["acc"] for x in repeats])),
                "ndcg": float(np.mean([x["ndcg"] for x in repeats])),
                "n_failed": sum(x["failed"] for x in repeats)},
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
            counted = len(case["orders"]) if case["orders"] is not None else 1
            lines.append([row.label, sums, f"{case['ndcg']:.4f}", f"{case['acc']:.2f}",
                          f"{counted} ({case['n_failed']} failed)"])
        else:
            lines.append([row.label, "-", "-", "-", "0"])
        paper = spec.paper.get(row.paper) if row.paper else None
        if paper:
            lines.append(["*paper*", "/".join(_num(x) for x in paper["sums"]), f"{paper['ndcg']:.4f}",
                          f"{paper['acc']:.2f}", "5"])
        else:
            lines.append(["*paper*", "-", "-", "-", "-"])
    return lines


_HEAD = ["Generator", "Raw weighted sums", "nDCG (mean over rubric orders)", "Acc. (mean over rubric orders)",
         "Rubric orders"]


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
        if case["orders"] is None:
            lines += ["", f"Rubric orders: {case['orders_note']}."]
        else:
            lines += ["", "| Order | Seed | Items in order | Weighted sums | Acc. | nDCG |", "|---|---|---|---|---|---|"]
            for s, o in enumerate(case["orders"]):
                shown = "/".join(map(_num, o["sums"])) if o["sums"] else "unscored"
                lines.append(f"| {s} | {o['seed']} | {', '.join(map(str, o['order'])) or '-'} | {shown} | "
                             f"{o['acc']:.0f} | {o['ndcg']:.4f} |")
        if case["resampled"]:
            again = case["resampled"]
            lines += ["", f"Rubric samples (ours, not the paper's protocol): each repeat a new rubric; mean nDCG "
                      f"{again['ndcg']:.4f}, Acc. {again['acc']:.2f} over {len(case['repeats'])} ({again['n_failed']} "
                      "failed).", "", "| Repeat | Seed | Weighted sums | Acc. | nDCG |", "|---|---|---|---|---|"]
            for r in case["repeats"]:
                shown = "/".join(map(_num, r["sums"])) if r["sums"] else "unscored"
                lines.append(f"| {r['repeat']} | {r['seed']} | {shown} | {r['acc']:.0f} | {r['ndcg']:.4f} |")
    lines += ["", DESCRIPTION, ""]
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
    """Per row: a line per rubric order (`line` = `order`, `index` its number, `items` the order), the mean over
    them (`line` = `mean`) with the paper's values, and a line per repeat (`line` = `repeat`: each a rubric sample,
    ours). Sums and scores in gold order, joined by `/`."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["row", "evaluator", "benchmark", "item", "line", "index", "seed", "items", "weighted_sums",
                     "scores", "acc", "ndcg", "paper_sums", "paper_acc", "paper_ndcg"])
    for row in spec.rows:
        case = cases.get(row.label) or {}
        if not case.get("repeats"):
            continue
        paper = (spec.paper.get(row.paper) if row.paper else None) or {}
        head = [row.label, case["evaluator"], case["benchmark"], case["item"]]
        for s, o in enumerate(case["orders"] or []):
            writer.writerow([*head, "order", s, o["seed"], "/".join(map(str, o["order"])),
                             "/".join(map(_num, o["sums"])) if o["sums"] else "", "/".join(map(str, o["scores"])),
                             o["acc"], o["ndcg"], "", "", ""])
        writer.writerow([*head, "mean", "", "", "", "", "", case["acc"], case["ndcg"],
                         "/".join(map(_num, paper.get("sums", ()))), paper.get("acc"), paper.get("ndcg")])
        for r in case["repeats"]:
            writer.writerow([*head, "repeat", r["repeat"], r["seed"], "", "/".join(map(_num, r["sums"]))
                             if r["sums"] else "", "/".join(map(str, r["scores"])), r["acc"], r["ndcg"], "", "", ""])
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
