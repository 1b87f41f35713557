"""`harness report RUN --explain ROW BENCHMARK`: where one table cell comes from, and how to make it again.

Everything is read from the run directory (manifest and records); no model is loaded or called.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.runstore import OutputPaths
from reports.compare import read_run
from reports.panels import panel_of_row, panels_of
from reports.results import benchmark, compute_results


def config_hash(settings: dict[str, Any]) -> str:
    """A short hash of what the run is bound to (its settings: rows, benchmarks, limit, seeds, data, models)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_id(manifest: dict[str, Any]) -> str:
    """A short id of one run: its settings and when it started."""
    blob = json.dumps([manifest.get("settings"), manifest.get("started")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def reproduce_command(row: str, spec: str, bench: str, settings: dict[str, Any], config: dict[str, Any]) -> str:
    """`harness eval` for exactly this cell: the same items, repeats and derived seeds as the run's records."""
    args = ["harness", "eval", "--evaluator", spec, "--benchmark", bench, "--label", row]
    if settings.get("limit"):
        args += ["--limit", str(settings["limit"])]
    args += ["--seeds", str(settings.get("seeds", 1)), "--seed", str(settings.get("seed", 0))]
    if config.get("data_dir"):
        args += ["--data-dir", str(config["data_dir"])]
    for key, flag in (("dtype", "--dtype"), ("base_url", "--base-url")):
        value = (config.get("backend") or {}).get(key)
        if value and value != "auto":
            args += [flag, str(value)]
    return shlex.join(args)


def explain_cell(run_dir: Path, row: str, bench: str) -> str:
    """The provenance of (row, benchmark) in `run_dir`, as lines of text.

    Raises:
        ConfigError: a folder that holds no run, or a row or benchmark the run does not have (listing those it has).
    """
    from judges import held_fixed

    if panels_of(Path(run_dir)) is not None:  # a figure of panels: the panel that has the row
        run_dir = panel_of_row(Path(run_dir), row)
    run = read_run(Path(run_dir), "RUN")
    if row not in run.rows:
        raise ConfigError(f"{run_dir}: no row {row!r}; rows: {', '.join(run.rows)}")
    settings = run.settings
    data = settings.get("data", {})
    if bench not in data:
        raise ConfigError(f"{run_dir}: no benchmark {bench!r}; benchmarks: {', '.join(data) or '(none)'}")
    spec = run.rows[row]
    policy = bool(settings.get("judge"))
    kind, subject, fixed = (None, spec, {}) if policy else held_fixed(spec)
    models = settings.get("models", {})
    cell = compute_results([r for r in run.records if r.benchmark == bench], {row: spec})[row]["benchmarks"]
    cell = cell.get(bench)
    manifest = run.manifest
    lines = [
        f"cell: row {row!r} x benchmark {bench!r} ({benchmark(bench).display})",
        f"run: {OutputPaths.run_dir(run.path).shown}  id {run_id(manifest)}  status {manifest.get('status')}  "
        f"started {manifest.get('started')}  ended {manifest.get('ended') or '-'}",
        f"config hash: {config_hash(settings)} (settings the run is bound to)",
        f"code: git {(manifest.get('git') or {}).get('commit') or '-'}"
        f"{' (dirty)' if (manifest.get('git') or {}).get('dirty') else ''}; "
        + ", ".join(f"{k} {v}" for k, v in (manifest.get("versions") or {}).items() if v),
        f"dataset: fingerprint {data[bench]}, {manifest.get('dataset_sizes', {}).get(bench, '?')} items "
        f"(limit {settings.get('limit') or 'none'})",
        f"{'policy' if policy else 'evaluator'}: {spec}",
    ]
    if policy:
        judge = manifest.get("judge") or settings["judge"]
        lines.append(f"  identity {models.get(spec, '(not recorded)')}")
        options = ", ".join(f"{k}={v}" for k, v in (judge.get("options") or {}).items())
        lines.append(f"judge: {judge['model']}{f' ({options})' if options else ''}  identity "
                     f"{judge.get('identity', '(not recorded)')}")
        lines.append(f"  settings: {(settings.get('judge_settings') or {}).get(bench, {})}")
        lines.append(f"generation: {settings.get('generation')}")
    elif subject is not None:
        lines.append(f"  under test: {subject}  identity {models.get(subject, '(not recorded)')}")
    for key, value in fixed.items():
        if value in models:
            lines.append(f"  {key}: {value}  identity {models[value]}")
    lines.append(
        f"seeds: run seed {settings.get('seed')}, {settings.get('seeds')} repeats; each record's seed is "
        "derive_seed(run seed, benchmark, item id, repeat)"
    )
    if cell is None:
        lines.append("results: no complete repeat yet")
    else:
        for metric in benchmark(bench).metrics:
            if metric.name not in cell:
                why = "; ".join(sorted({w for w in (cell.get("unavailable") or {}).get(metric.name) or () if w}))
                lines.append(f"{metric.name}: no value{f' ({why})' if why else ''}")
                continue
            m = cell[metric.name]
            lines.append(
                f"{metric.name}: {metric.format(m['value'])} (std {metric.format(m['std'])} over {m['repeats']} "
                f"repeats; 95% CI of repeat 0 [{metric.format(m['ci_low'])}, {metric.format(m['ci_high'])}]); "
                f"n {m['n']} per repeat, n_failed {m['n_failed']} over all repeats, tie rate {m['tie_rate']:.1%}"
            )
        if cell.get("incomplete_repeats"):
            lines.append(f"incomplete repeats (left out): {cell['incomplete_repeats']}")
    items = (manifest.get("config") or {}).get("items")
    if items:
        chosen = " ".join(f"--item {shlex.quote(f'{b}:{i}')}" for b, ids in items.items() for i in ids)
        lines.append(f"reproduce: harness run {settings.get('table')} {chosen} --seeds {settings.get('seeds')} --seed "
                     f"{settings.get('seed')} --config FILE, FILE holding rows: {{{row!r}: {spec!r}}} and only_rows: "
                     f"[{row!r}] (and the run's data_dir and backend: manifest.json `config`)")
    elif policy:
        table = settings.get("table")
        lines.append(f"reproduce: harness run {table} --config FILE, FILE holding the resolved config recorded in "
                     f"{OutputPaths.run_dir(run.path).shown}/manifest.json (`config`), with only_rows: [{row!r}] "
                     f"and benchmarks: [{bench}]")
    else:
        lines.append("reproduce: " + reproduce_command(row, spec, bench, settings, manifest.get("config") or {}))
    return "\n".join(lines)
