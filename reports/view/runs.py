"""One run as the page's overview shows it: its table as `table.md` renders it (the paper's numbers beside
ours; table3's Average), the counts under it, its settings and model identities from the manifest, and its
failure summary. The overview's table prints the score gap Δ_gap after each benchmark's columns wherever the
results hold one (whether or not the run's table.md was asked for it with `--gap`).

Read-only and model-free, like `harness report`: a partial run (one still being written, or killed) is shown as
far as its records go.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, FailureCategory
from harness.records import EvalRecord
from harness.runstore import Manifest, OutputPaths, RecordLog
from reports.panels import panels_of

# The cells exactly as table.md prints them (value, decimals, bold and underline marks, the paper's row), and
# the notes `harness report` writes under it.
from reports.render import (
    AVERAGE_DESCRIPTION,
    GAP_NOTE,
    average_counts,
    average_notes,
    average_text,
    best_marks,
    cell_text,
    conventions,
    paper_average,
    paper_cells,
    render_markdown,
)
from reports.report import adhoc_table, gap_wanted, policy_notes
from reports.results import compute_results, macro_average
from reports.tables import GAP, TableSpec, get_table


@dataclass(frozen=True, slots=True)
class RunData:
    """A run directory as read for the page."""

    path: Path
    manifest: dict[str, Any]
    records: list[EvalRecord]
    torn: bool
    """The last line of records.jsonl was incomplete (a run is writing it, or was killed) and is left out."""

    @property
    def rows(self) -> dict[str, str]:
        """Row label -> evaluator spec (policy tables: the policy's model spec)."""
        return self.manifest["rows"]


def read_run_dir(path: Path, what: str = "RUN") -> RunData:
    """The manifest and records of a run of `harness run` or `harness eval`.

    Raises:
        ConfigError: naming `what` and the path when it holds no such run.
    """
    path = Path(path)
    paths = OutputPaths.run_dir(path)
    figure = panels_of(path) if path.is_dir() else None
    if figure is not None:
        shown = ", ".join(f"{path / name}" for name in figure["panels"])
        raise ConfigError(f"{what} {path}: a figure of panels ({figure['table']}); each panel is a run: view one "
                          f"of {shown}")
    if path.is_file() or not paths.manifest.is_file():
        raise ConfigError(f"{what} {path}: not a run directory (no manifest.json); `harness view` takes the run "
                          "directory of `harness run` or `harness eval`")
    manifest = Manifest(paths.manifest).read()
    if manifest.get("command") not in ("run", "eval") or "rows" not in manifest:
        command = manifest.get("command", "?")
        raise ConfigError(f"{what} {path}: the manifest is of `harness {command}`, not of a run")
    log = RecordLog(paths.records, EvalRecord)
    return RunData(path, manifest, log.records(), log.torn_line)


def check_comparable(base: RunData, cand: RunData) -> list[str]:
    """What `harness compare` would say of two runs (`reports.compare.incomparable`), for the page of their
    changes: runs of which no record pairs (no row in common, or no benchmark, item and repeat of a common row)
    are refused; runs that pair in part (one still running, say) are shown, and the differences returned.

    Returns:
        The differences compare names (empty: compare would compare the runs).

    Raises:
        ConfigError: no record of one run pairs with one of the other, naming both runs and the differences.
    """
    from reports.compare import Run, incomparable

    found = incomparable(Run(base.path, base.manifest, base.records), Run(cand.path, cand.manifest, cand.records))
    specs = {(base.rows[label], cand.rows[label]) for label in base.rows if label in cand.rows}
    keys = {(r.evaluator, r.benchmark, r.item, r.repeat) for r in cand.records}
    if found and not any((c_spec, r.benchmark, r.item, r.repeat) in keys
                         for b_spec, c_spec in specs for r in base.records if r.evaluator == b_spec):
        raise ConfigError(f"runs have no record in common (BASE {base.path}, CAND {cand.path}), as `harness "
                          "compare` finds: " + "; ".join(found))
    return found


def table_spec(run: RunData) -> TableSpec:
    """The table the run renders: its registered table (rows it ran), or the ad-hoc table of `harness eval`."""
    table = (run.manifest.get("config") or {}).get("table")
    if table:
        spec = get_table(table)
        return dataclasses.replace(spec, rows=tuple(r for r in spec.rows if r.label in run.rows))
    benches = run.manifest.get("benchmark_kinds") or dict.fromkeys(r.benchmark for r in run.records)
    return adhoc_table(run.rows, list(benches))


def _notes(run: RunData, spec: TableSpec, results: dict[str, Any]) -> list[str]:
    """The notes `harness report` prints under the table."""
    manifest, config = run.manifest, run.manifest.get("config") or {}
    notes = [f"preset: {config.get('preset', '-')}; repeats: {config.get('seeds')}; records: {len(run.records)}; "
             f"status: {manifest.get('status')}"]
    if run.torn:
        notes.append("the last line of records.jsonl is incomplete (a run is writing it, or was killed): ignored")
    notes += [f"{what} unavailable: {why}" for what, why in (manifest.get("unavailable") or {}).items()]
    notes += [f"{label}: {ev}" for label, ev in run.rows.items()]
    return notes + policy_notes(manifest, results) + list(spec.notes)


def _table(spec: TableSpec, results: dict[str, Any]) -> dict[str, Any]:
    marks = best_marks(spec, results)
    averages = {r.label: average_text(results, r.label) for r in spec.rows}
    best = max((float(v) for v in averages.values() if v != "-"), default=None)
    rows = []
    for row in spec.rows:
        cells, counts = [], []
        for col in spec.shown:
            mark = marks.get((row.label, col.key), "").split()
            cells.append({"text": cell_text(results, row.label, col), "bench": col.benchmark,
                          "best": "best" in mark, "best_dynamic": "best-dynamic" in mark})
            cell = results.get(row.label, {}).get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)
            counts.append(f"{cell['n'] * cell['repeats']} ({cell['n_failed']} failed), ties {cell['tie_rate']:.0%}"
                          if cell else "-")
        paper = paper_cells(spec, row.paper)
        if spec.average:  # not a benchmark's cell: it opens no items
            text = averages[row.label]
            cells.append({"text": text, "bench": None, "best": text != "-" and float(text) == best,
                          "best_dynamic": False})
            counts.append(average_counts(spec, results, row.label))
            value = paper_average(spec, row.paper)
            paper.append("-" if value is None else f"{value:.1f}")
        rows.append({"label": row.label, "spec": results.get(row.label, {}).get("evaluator"), "cells": cells,
                     "counts": counts, "paper": paper, "paper_label": row.paper})
    descriptions = [f"{spec.header(c)}: {c.declared().description}" for c in spec.shown]
    if spec.average:
        descriptions.append(f"Average: {AVERAGE_DESCRIPTION}")
    if any(c.metric == GAP for c in spec.shown):
        descriptions.append(GAP_NOTE)
    return {"title": spec.title, "kind": spec.kind, "head": "Policy" if spec.kind == "policy" else "Evaluator",
            "columns": [spec.header(c) for c in spec.shown] + (["Average"] if spec.average else []),
            "descriptions": descriptions + average_notes(spec, results), "conventions": conventions(spec),
            "rows": rows}


def failure_place(entry: dict[str, Any]) -> str:
    """Where a trace's failure happened, responses and rubric items counted from 1 as the page shows them."""
    place = str(entry.get("stage") or "?")
    if entry.get("response") is not None:
        place += f", response {entry['response'] + 1}"
    if entry.get("item") is not None:
        place += f", rubric item {entry['item'] + 1}"
    return place


def failure_summary(run: RunData) -> list[dict[str, Any]]:
    """Failures by (evaluator, benchmark, category): how many, whether a rerun retries them, one example."""
    count: Counter[tuple[str, str, str]] = Counter()
    example: dict[tuple[str, str, str], str] = {}
    for r in run.records:
        for f in r.trace.get("failures") or ():
            key = (r.evaluator, r.benchmark, str(f.get("category")))
            count[key] += 1
            example.setdefault(key, f"{failure_place(f)}: {f.get('message')}")
    labels = {spec: [label for label, s in run.rows.items() if s == spec] for spec in set(run.rows.values())}
    return [{"rows": labels.get(ev, [ev]), "evaluator": ev, "bench": bench, "category": cat, "count": n,
             "retried": not FailureCategory(cat).final, "example": example[(ev, bench, cat)]}
            for (ev, bench, cat), n in sorted(count.items())]


def _settings(run: RunData) -> list[list[Any]]:
    """[section, mapping] pairs for the settings panel, as the manifest records them."""
    m = run.manifest
    settings = m.get("settings") or {}
    run_part = {"directory": str(run.path), "command": " ".join(["harness", *(m.get("argv") or [])]),
                "status": m.get("status"), "started": m.get("started"), "ended": m.get("ended"),
                "records": len(run.records), "git": m.get("git"), "versions": m.get("versions")}
    data = {"limit": settings.get("limit"), "repeats": settings.get("seeds"), "seed": settings.get("seed"),
            "fingerprints": settings.get("data"), "items": m.get("dataset_sizes"),
            "options": settings.get("bench_options") or None, "unavailable": m.get("unavailable") or None}
    out = [["Run", run_part], ["Data", data], ["Rows", run.rows], ["Models", settings.get("models") or {}]]
    for key, title in (("evaluator_settings", "Evaluator settings"), ("judge", "Judge"),
                       ("generation", "Generation"), ("lacking", "What the backends lacked")):
        if m.get(key):
            out.append([title, m[key]])
    return out


def overview(run: RunData) -> dict[str, Any]:
    """The overview of one run (see the module docstring), with `markdown`: table.md's text as rendered now."""
    spec = table_spec(run)
    results = compute_results(run.records, run.rows)
    if spec.average and spec.layout != "case_study":
        for label, average in macro_average(spec.columns, results, run.records, run.rows).items():
            results[label]["average"] = average
    notes = _notes(run, spec, results)
    held = any(GAP in cell for row in results.values() for cell in row.get("benchmarks", {}).values())
    as_run = dataclasses.replace(spec, gap=gap_wanted(run.manifest))
    return {"table": _table(dataclasses.replace(spec, gap=held), results), "notes": notes,
            "settings": _settings(run), "failures": failure_summary(run),
            "markdown": render_markdown(as_run, results, notes)}
