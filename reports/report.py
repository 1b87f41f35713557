"""`harness report RUN_DIR`: results.json and table.md / table.tex / table.csv from a run's records (no model calls)."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from harness.runstore import Manifest, RecordLog
from reports.render import render_csv, render_latex, render_markdown
from reports.results import NDCG_TIES, compute_results
from reports.tables import Column, Row, TableSpec, get_table


def adhoc_table(rows: dict[str, str], kinds: dict[str, str]) -> TableSpec:
    """A table for an `harness eval` run: its rows and benchmarks, no paper numbers."""
    columns = []
    for bench, kind in kinds.items():
        columns.append(Column(bench, "acc"))
        if kind == "listwise":
            columns.append(Column(bench, "ndcg"))
    return TableSpec(
        name="eval",
        title="Evaluator results",
        rows=tuple(Row(label, None, MappingProxyType({"paper": spec, "cpu": spec})) for label, spec in rows.items()),
        columns=tuple(columns),
        paper=MappingProxyType({}),
    )


def write_reports(run_dir: Path) -> dict[str, Any]:
    """Recompute results from `run_dir/records.jsonl` and write results.json and the three tables."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no manifest.json)")
    manifest = Manifest(manifest_path).read()
    rows: dict[str, str] = manifest["rows"]
    records = RecordLog(run_dir / "records.jsonl", ("evaluator", "benchmark", "item", "repeat")).records()
    table = manifest["config"].get("table")
    if table:
        spec = get_table(table)
        spec = TableSpec(spec.name, spec.title, tuple(r for r in spec.rows if r.label in rows), spec.columns,
                         spec.paper, spec.seeds)
    else:
        kinds = {r["benchmark"]: r["kind"] for r in records}
        spec = adhoc_table(rows, kinds)
    results = compute_results(records, rows)
    notes = [f"preset: {manifest['config'].get('preset', '-')}; repeats: {manifest['config'].get('seeds')}; "
             f"records: {len(records)}; status: {manifest.get('status')}"]
    notes += [f"{what} unavailable: {why}" for what, why in manifest.get("summary", {}).get("unavailable", {}).items()]
    notes += [f"{label}: {ev}" for label, ev in rows.items()]
    payload = {"table": spec.name, "rows": rows, "results": results, "notes": notes,
               "conventions": {"ndcg_ties": NDCG_TIES, "strict": "ties and unscorable items count as wrong"}}
    (run_dir / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (run_dir / "table.md").write_text(render_markdown(spec, results, notes))
    (run_dir / "table.tex").write_text(render_latex(spec, results))
    (run_dir / "table.csv").write_text(render_csv(spec, results))
    return payload
