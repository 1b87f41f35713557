"""Build the page: one self-contained HTML file (our template, script and style inlined; the data embedded as
JSON in `<script type="application/json">` blocks; no network, no server).

Layout of the embedded data. One `data` block holds what the page needs at once: per run its overview
(`reports.view.runs`), its evaluators (a spec and the row labels that share it) and its benchmarks' fingerprints;
the benchmarks (display names, metrics); the items keyed by fingerprint (shared by two runs of the same data);
the record index, one compact array per record (`INDEX_FIELDS`); and, for two runs, the records whose outcome
changed and the gate's verdict per cell (`gate`: what `harness compare` says of the two runs). Each record's
detail (scores, rubric, verdicts, answer, judgment, raw texts, failures) is in a `details` block of `CHUNK`
records, parsed only when one of its records is opened, so a run of tens of thousands of records opens at once.
Texts are cut as `reports.view.items` states.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.records import EvalRecord
from harness.runstore import write_text_atomic
from reports.results import benchmark
from reports.view.items import RAW_CHARS, TEXT_CHARS, cut, load_items
from reports.view.outcome import STATUS_CODES, Outcome, change, gold_order, outcome, score_order
from reports.view.runs import RunData, overview

CHUNK = 200
"""Records per details block."""
INDEX_FIELDS = ("run", "evaluator", "bench", "item", "repeat", "status", "flags", "value", "scores")
"""One record in the index: run index, evaluator index (in its run), benchmark index, item id, repeat, status
code (`outcome.STATUS_CODES`), flags (1 tied, 2 failed), the counted metric's per-item value, the scores."""


@dataclass(frozen=True, slots=True)
class ViewResult:
    """What `build_view` wrote."""

    path: Path
    bytes: int
    records: int
    changed: int | None
    """Two runs: records whose outcome changed (None for one run)."""
    seconds: float
    notes: tuple[str, ...] = ()
    """Two runs that pair only in part: the differences `harness compare` names (it would not compare them)."""


def _natural(text: str) -> list:
    """A sort key that puts `item:2` before `item:10`."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 4)


def _detail(record: EvalRecord, found: Outcome, *, judge: dict[str, Any] | None, has_item: bool) -> dict:
    trace = dict(record.trace)
    shown = trace.get("judge")
    if isinstance(shown, dict) and judge and shown.get("model") == judge.get("model") \
            and shown.get("identity") == judge.get("identity"):
        trace.pop("judge")  # the run's judge, shown once in the overview
    if has_item:
        trace.pop("annotation", None)  # AlpacaEval's instruction and reference: the item shows them
    answer = trace.pop("answer", None)
    gold = record.preferred if record.kind == "pairwise" else record.gold_ranks
    return {"kind": record.kind, "meta": dict(record.meta), "seed": record.seed,
            "scores": [_round(s) for s in record.scores], "gold": list(gold) if isinstance(gold, tuple) else gold,
            "order": score_order(record.scores), "gold_order": gold_order(record), "metric": found.metric,
            "values": {k: _round(v) for k, v in found.values.items()},
            "answer": cut(answer, TEXT_CHARS), "trace": cut(trace, RAW_CHARS)}


def _bench_json(name: str) -> dict[str, Any]:
    bench = benchmark(name)
    metrics = [{"name": m.name, "display": m.display, "binary": m.binary, "scale": m.scale, "digits": m.digits,
                "higher": m.higher_is_better, "description": m.description} for m in bench.metrics]
    return {"name": name, "display": bench.display, "kind": bench.kind, "metrics": metrics}


def _changes(runs: Sequence[RunData], placed: Sequence[Sequence[tuple[EvalRecord, int]]],
             benches: dict[str, Any]) -> list[dict[str, Any]]:
    """Records of the same rows (matched by label, as `harness compare` does; labels that share both specs
    once), benchmark, item and repeat whose outcome changed from the first run to the second.

    Args:
        placed: Per run, its records with their positions in the page's index.
    """
    base, cand = runs
    pairs: dict[tuple[str, str], list[str]] = {}
    for label in base.rows:
        if label in cand.rows:
            pairs.setdefault((base.rows[label], cand.rows[label]), []).append(label)
    keyed = [{(r.evaluator, r.benchmark, r.item, r.repeat): (r, i) for r, i in side} for side in placed]
    found = []
    for (b_spec, c_spec), labels in pairs.items():
        for key, (b_rec, b_at) in keyed[0].items():
            if key[0] != b_spec or (c_spec, *key[1:]) not in keyed[1]:
                continue
            c_rec, c_at = keyed[1][(c_spec, *key[1:])]
            moved = change(benches[key[1]], b_rec, c_rec)
            if moved is not None:
                found.append({"rows": labels, "bench": key[1], "item": key[2], "repeat": key[3], "change": moved,
                              "base": b_at, "cand": c_at})
    return found


def build_data(runs: Sequence[RunData], *, data_dir: Path | None = None) -> tuple[dict[str, Any], list[dict]]:
    """The page's data block and the records' details (in index order) for one or two runs. The index lists
    each run's records by benchmark, item, evaluator and repeat."""
    declared = [b for run in runs for b in (run.manifest.get("settings") or {}).get("benchmarks") or ()]
    present = {r.benchmark for run in runs for r in run.records}
    names = [b for b in dict.fromkeys([*declared, *sorted(present)]) if b in present]
    bench_objs = {name: benchmark(name) for name in names}
    bench_index = {name: i for i, name in enumerate(names)}
    items: dict[str, dict[str, Any]] = {}
    index: list[list] = []
    details: list[dict] = []
    placed: list[list[tuple[EvalRecord, int]]] = []
    run_json = []
    for n, run in enumerate(runs):
        loaded, missing = load_items(run.manifest, data_dir=data_dir)
        items.update(loaded)
        fingerprints = (run.manifest.get("settings") or {}).get("data") or {}
        judge = run.manifest.get("judge")
        specs = list(dict.fromkeys([*run.rows.values(), *(r.evaluator for r in run.records)]))
        ev_index = {spec: i for i, spec in enumerate(specs)}
        ordered = sorted(run.records, key=lambda r: (bench_index[r.benchmark], _natural(r.item),
                                                     ev_index[r.evaluator], r.repeat))
        placed.append([(r, len(index) + i) for i, r in enumerate(ordered)])
        for r in ordered:
            found = outcome(bench_objs[r.benchmark], r)
            flags = int(found.tied) | (2 * int(found.failed))
            index.append([n, ev_index[r.evaluator], bench_index[r.benchmark], r.item, r.repeat,
                          STATUS_CODES[found.status], flags, _round(found.value), [_round(s) for s in r.scores]])
            has_item = fingerprints.get(r.benchmark) in loaded
            details.append(_detail(r, found, judge=judge, has_item=has_item))
        run_json.append({"path": str(run.path), "name": run.path.name, "overview": overview(run),
                         "evaluators": [{"spec": s, "rows": [k for k, v in run.rows.items() if v == s]}
                                        for s in specs],
                         "data": fingerprints, "items_missing": missing,
                         "policy": bool(judge) or any(r.kind == "policy" for r in run.records)})
    data = {"version": 1, "runs": run_json, "benches": [_bench_json(name) for name in names], "items": items,
            "index_fields": list(INDEX_FIELDS), "index": index, "chunk": CHUNK,
            "limits": {"text": TEXT_CHARS, "raw": RAW_CHARS}}
    if len(runs) == 2:
        data["changes"] = _changes(runs, placed, bench_objs)
        data["gate"] = gate(runs[0].path, runs[1].path)
    return data, details


GATE_FIELDS = ("row", "benchmark", "metric", "base", "candidate", "diff", "ci_low", "ci_high", "margin",
               "half_width", "items_needed", "paired", "n_items", "verdict")
"""What the page keeps of each of compare's cells (`reports.compare.Cell`); values unscaled, as there."""


def gate(base: Path, cand: Path) -> dict[str, Any]:
    """`harness compare`'s verdicts for the page of two runs, with its default config (`CompareConfig`): per cell
    the fields `GATE_FIELDS` (numbers rounded), the exit code and the differences that make the runs not
    comparable. A run compare refuses to read (one still being written) gives its reason as the one difference:
    the page still pairs what it can."""
    from reports.compare import EXIT_INCOMPARABLE, compare_runs

    try:
        found = compare_runs(base, cand).to_json()
    except ConfigError as exc:
        return {"cells": [], "exit_code": EXIT_INCOMPARABLE, "differences": [str(exc)], "alpha": None}
    cells = [{k: _round(v) if isinstance(v, float) else v for k, v in cell.items() if k in GATE_FIELDS}
             for cell in found["cells"]]
    return {"cells": cells, "exit_code": found["exit_code"], "differences": found["differences"],
            "alpha": found["config"]["alpha"]}


def embed(value: Any) -> str:
    """JSON safe inside a `<script type="application/json">` element: `<`, `>` and `&` escaped (they occur only
    inside strings, where the escapes mean the same characters), so no text can close the element."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a non-finite number somewhere in a trace: JSON has none, the page shows null
        text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _asset(name: str) -> str:
    return resources.files("reports.view").joinpath(name).read_text(encoding="utf-8")


def render_page(data: dict[str, Any], details: Sequence[dict], *, title: str) -> str:
    """The HTML text of the page."""
    blocks = [f'<script type="application/json" id="details-{i // CHUNK}">{embed(list(details[i:i + CHUNK]))}'
              "</script>" for i in range(0, len(details), CHUNK)]
    parts = {"TITLE": html.escape(title), "STYLE": _asset("view.css"), "DATA": embed(data),
             "DETAILS": "\n".join(blocks), "SCRIPT": _asset("view.js")}
    # One pass over the template, so a marker inside the data is never substituted.
    return re.sub(r"@@([A-Z]+)@@", lambda m: parts[m.group(1)], _asset("template.html"))


def build_view(runs: Sequence[RunData], *, out: Path, data_dir: Path | None = None) -> ViewResult:
    """Write the page for one run, or two (the second compared with the first), to `out`."""
    start = time.perf_counter()
    data, details = build_data(runs, data_dir=data_dir)
    names = " vs ".join(run.path.name or str(run.path) for run in runs)
    text = render_page(data, details, title=f"harness view: {names}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, text)
    changed = len(data["changes"]) if "changes" in data else None
    return ViewResult(out, len(text.encode()), len(details), changed, time.perf_counter() - start)
