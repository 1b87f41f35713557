"""`harness report RUN_DIR`: results.json and table.md / table.tex / table.csv from a run's records (no model calls).

A table with an Average (table3) gets it in results.json per row (`average`); with `gap` (`harness run|report
--gap`, recorded in the run's manifest as config `gap`) an evaluator table also prints Δ_gap beside each
benchmark's accuracy (results.json holds it either way); a case study (table9) is written by `reports.case_study`.
A figure of panels (fig2's folder, `reports.panels`) re-renders each panel's run, then draws the figure and writes
the tables of all panels (`write_panel_reports`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from harness.records import EvalRecord
from harness.runstore import Manifest, OutputPaths, RecordLog, write_json_atomic, write_text_atomic
from reports.figure import render_figure, render_panels
from reports.panels import PANELS_FILE, panels_of
from reports.render import render_csv, render_latex, render_markdown
from reports.results import NDCG_TIES, benchmark, compute_results, macro_average
from reports.tables import Column, PolicySetup, Preset, Row, TableSpec, get_table

PRESETS = typing.get_args(Preset)


def adhoc_table(rows: dict[str, str], benchmarks: list[str], judge: dict[str, Any] | None = None) -> TableSpec:
    """A table for an `harness eval` run: its rows, and every metric its benchmarks declare; no paper numbers.
    `judge`: a policy run's (its manifest's), which makes it a policy table."""
    columns = [Column(name, m.name) for name in benchmarks for m in benchmark(name).metrics]
    setups = None if judge is None else MappingProxyType({p: PolicySetup(judge.get("model")) for p in PRESETS})
    return TableSpec(
        name="eval",
        title="Evaluator results" if judge is None else "Policy results",
        rows=tuple(Row(label, None, MappingProxyType({p: spec for p in PRESETS})) for label, spec in rows.items()),
        columns=tuple(columns),
        paper=MappingProxyType({}),
        setups=setups,
    )


def report_spec(spec: TableSpec, rows: dict[str, str]) -> TableSpec:
    """The table as a run of it has its rows: the run's row labels in the run's order, each the table's row of
    that label, or (a row a run config made: table5's grid, a config's own) a row without paper numbers."""
    known = {r.label: r for r in spec.rows}
    made = [known.get(label) or Row(label, None, MappingProxyType({"paper": ev, "cpu": ev}))
            for label, ev in rows.items()]
    return dataclasses.replace(spec, rows=tuple(made))


def policy_notes(manifest: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """A policy run's judge (model, options, identity), generation settings, and why cells have no value."""
    judge = manifest.get("judge")
    if not judge:
        return []
    options = ", ".join(f"{k}={v}" for k, v in judge.get("options", {}).items())
    identity = ", ".join(f"{k}={v}" for k, v in judge.get("identity", {}).items())
    if judge.get("model") is None:
        notes = ["judge: none (deterministic checkers)"]
    else:
        notes = [f"judge: {judge['model']}" + (f" ({options})" if options else "")
                 + (f"; {identity}" if identity else "")]
    notes += [f"judge settings, {b}: " + ", ".join(f"{k}={v}" for k, v in s.items())
              for b, s in judge.get("settings", {}).items()]
    gen = manifest.get("generation") or {}
    notes.append("generation: " + ", ".join(f"{k}={v}" for k, v in gen.items()))
    for label, row in results.items():
        for bench, cell in row.get("benchmarks", {}).items():
            for metric, why in (cell.get("unavailable") or {}).items():
                reasons = sorted({w for w in why if w})
                if reasons:
                    notes.append(f"{label}, {bench}.{metric}: no value: {'; '.join(reasons)}")
    return notes


def gap_wanted(manifest: dict[str, Any], gap: bool | None = None) -> bool:
    """Whether the tables print the Δ_gap columns: `gap` where given, else what the run recorded (config `gap`,
    `harness run --gap`), else not."""
    return bool((manifest.get("config") or {}).get("gap")) if gap is None else gap


def write_reports(run_dir: Path, *, gap: bool | None = None) -> dict[str, Any]:
    """Recompute results from `run_dir/records.jsonl` and write results.json and the three tables.

    Reads the records without touching them, so it is safe while a run writes them (a last line still being
    written is ignored, and a note says so). `gap`: print the Δ_gap columns (None: as the run recorded,
    `gap_wanted`).

    Raises:
        ConfigError: for a folder that holds no run (or another verb's output), or unreadable records.
    """
    run_dir = Path(run_dir)
    if panels_of(run_dir) is not None:
        return write_panel_reports(run_dir, gap=gap)
    paths = OutputPaths.run_dir(run_dir)
    if run_dir.is_file():
        raise ConfigError(
            f"{run_dir} is a file; `harness report` takes the run directory of `harness run` or `harness eval`"
        )
    if not paths.manifest.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no manifest.json)")
    manifest = Manifest(paths.manifest).read()
    if manifest.get("command") not in ("run", "eval") or "rows" not in manifest:
        raise ConfigError(
            f"{run_dir}: the manifest is of `harness {manifest.get('command', '?')}`, not of a run; "
            "`harness report` renders the run directories of `harness run` and `harness eval`"
        )
    rows: dict[str, str] = manifest["rows"]
    log = RecordLog(paths.records, EvalRecord)
    records = log.records()
    config = manifest.get("config", {})
    table = config.get("table")
    if table:
        spec = dataclasses.replace(report_spec(get_table(table), rows), gap=gap_wanted(manifest, gap))
    else:
        spec = adhoc_table(rows, list(manifest.get("benchmark_kinds") or dict.fromkeys(r.benchmark for r in records)),
                           manifest.get("judge"))
    results = compute_results(records, rows)
    notes = [f"preset: {config.get('preset', '-')}; repeats: {config.get('seeds')}; "
             f"records: {len(records)}; status: {manifest.get('status')}"]
    if log.torn_line:
        notes.append("the last line of records.jsonl is incomplete (a run is writing it, or was killed): ignored")
    notes += [f"{what} unavailable: {why}" for what, why in (manifest.get("unavailable") or {}).items()]
    notes += [f"{label}: {ev}" for label, ev in rows.items()]
    notes += policy_notes(manifest, results) + list(spec.notes)
    payload = {"table": spec.name, "kind": spec.kind, "gap": spec.gap, "rows": rows, "results": results,
               "notes": notes,
               "conventions": {"ndcg_ties": NDCG_TIES, "strict": "ties and unscorable items count as wrong"}}
    if spec.layout == "case_study":
        from reports.case_study import write_case_study

        return write_case_study(run_dir, spec, payload, records)
    if spec.average:
        for label, average in macro_average(spec.columns, results, records, rows).items():
            results[label]["average"] = average
    write_json_atomic(run_dir / "results.json", payload)
    write_text_atomic(run_dir / "table.md", render_markdown(spec, results, notes))
    write_text_atomic(run_dir / "table.tex", render_latex(spec, results))
    write_text_atomic(run_dir / "table.csv", render_csv(spec, results))
    if spec.figure:
        render_figure(spec, results, run_dir)
    return payload


def write_panel_reports(folder: Path, *, gap: bool | None = None) -> dict[str, Any]:
    """Re-render every panel's run (no model calls), then the figure and the tables of all panels in `folder`;
    `gap` as `write_reports` takes it.

    Raises:
        ConfigError: for a folder without panels.json, or a panel that holds no run yet.
    """
    found = panels_of(folder)
    if found is None:
        raise ConfigError(f"{folder}: not a figure of panels (no {PANELS_FILE})")
    figure = get_table(found["table"])
    done = []
    for name in found["panels"]:
        run = Path(folder) / name
        if not (run / "manifest.json").is_file():
            raise ConfigError(f"{folder}: panel {name} has no run yet ({run}); rerun `harness run {figure.name}`")
        payload = write_reports(run, gap=gap)
        spec = dataclasses.replace(report_spec(get_table(name), payload["rows"]), gap=payload.get("gap", False))
        done.append((spec, payload))
    drawn = [(spec, payload["results"], spec.panel_title or spec.name,
              "accuracy, AVG@k (%)" if spec.kind == "evaluator" else "score (Table 2's scales)")
             for spec, payload in done]
    _, bars = render_panels(drawn, Path(folder), title=figure.title)
    md = [f"## {figure.title}", ""]
    tex, rows = [], []
    for spec, payload in done:
        md.append(render_markdown(spec, payload["results"], payload["notes"]))
        tex.append(render_latex(spec, payload["results"]))
        rows += [[spec.name, *line] for line in csv.reader(io.StringIO(render_csv(spec, payload["results"])))]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["panel", *rows[0][1:]])
    writer.writerows(r for r in rows if r[1] != "row")
    payload = {"table": figure.name, "kind": "figure",
               "panels": {spec.name: p for spec, p in done},
               "figure": {"files": ["figure.png", "figure.pdf"],
                          "bars": {spec.name: b for (spec, _), b in zip(done, bars)}}}
    write_json_atomic(Path(folder) / "results.json", payload)
    write_text_atomic(Path(folder) / "table.md", "\n".join(md))
    write_text_atomic(Path(folder) / "table.tex", "\n".join(tex))
    write_text_atomic(Path(folder) / "table.csv", buf.getvalue())
    return payload
