"""Figure 2, co-evolution: (a) evaluator accuracy of the generators G1, G2 and the stale G2~ on Table 1's
benchmarks, (b) policy scores of P1, P2 and the stale P2~ on Table 2's benchmarks.

`harness run fig2` runs its two panels, each an ordinary run of its own table (`fig2a`: evaluators, `fig2b`:
policies judged as Table 2) into OUT/fig2a and OUT/fig2b, then draws both panels as grouped bars with bootstrap
whiskers (OUT/figure.png, OUT/figure.pdf) and writes the numbers of both as OUT/table.md, table.tex, table.csv and
results.json. OUT/panels.json marks the folder as a figure of panels: `harness report OUT` re-renders it, `--explain
ROW BENCHMARK` finds the panel of the row, `harness compare` compares two figures panel by panel.

Rows are named after the stages of `harness train coevolve` (`--coevolve DIR`: its coevolve.json names every
checkpoint and the frozen verifier), or given by `rows:` in a config. The paper's values are not in our sources:
its paper rows print dashes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from harness.runstore import write_json_atomic, write_text_atomic
from reports.evaluator_tables import ACC_COLUMNS
from reports.paper import FIG2
from reports.rows import coevolve_shape
from reports.tables import (
    CPU_DR,
    CPU_SETUP,
    DEEPSEEK_SETUP,
    QWEN3_VERIFIER,
    TABLE2_SPEC,
    TableSpec,
    get_table,
    make_row,
    policy_row,
)

_PANEL_TITLES = {"fig2a": "(a) evaluators: G1, G2 and the stale G2~", "fig2b": "(b) policies: P1, P2 and the stale P2~"}

PANELS_FILE = "panels.json"
"""Marks a folder as a figure of panels: {"table": NAME, "panels": [panel table names]}."""

_HEADLINES = ("alpaca_eval2.lc_win_rate", "alpaca_eval2.win_rate", "arena_hard_v2.hard_prompt", "wildbench.score",
              "writingbench.overall")
"""Table 2's headline of each benchmark, and AlpacaEval 2's plain win rate (its LC needs all 805 instructions)."""


def _generator(stage: str) -> str:
    return f"dynamic-rubric:generator=vllm:checkpoints/coevolve/{stage},verifier={QWEN3_VERIFIER}"


FIG2A_SPEC = TableSpec(
    name="fig2a",
    title="Figure 2 (a): evaluator accuracy of the co-evolved generators (AVG@k)",
    rows=tuple(make_row(s, s, _generator(s), CPU_DR, dynamic=True) for s in ("G1", "G2", "G2-stale")),
    columns=ACC_COLUMNS,
    paper=FIG2,
    panel_of="fig2",
    reads=("coevolve",),
    shape=coevolve_shape,
    notes=("G2-stale: G1 trained again on the sets of P0 (the policy it already saw), the control for G2.",),
)
FIG2B_SPEC = TableSpec(
    name="fig2b",
    title="Figure 2 (b): policy quality of the co-evolved policies (the paper's judge: DeepSeek-V4-Flash)",
    rows=tuple(policy_row(s, f"vllm:checkpoints/coevolve/{s}") for s in ("P1", "P2", "P2-stale")),
    columns=tuple(c for c in TABLE2_SPEC.columns if c.key in _HEADLINES),
    paper=FIG2,
    setups=MappingProxyType({"paper": DEEPSEEK_SETUP, "cpu": CPU_SETUP}),
    default_seeds=1,
    panel_of="fig2",
    reads=("coevolve",),
    shape=coevolve_shape,
    notes=("P2-stale: P1 trained again with G1's rubrics (the generator that did not co-evolve), the control for "
           "P2.",),
)
FIG2_SPEC = TableSpec(
    name="fig2",
    title="Figure 2: co-evolution of the generator and the policy, against stale controls",
    rows=(),
    columns=(),
    paper=FIG2,
    panels=("fig2a", "fig2b"),
    figure=True,
)


def panels_of(folder: Path) -> dict[str, Any] | None:
    """A figure folder's panels.json ({"table", "panels"}), or None for any other folder."""
    path = Path(folder) / PANELS_FILE
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        return {"table": str(found["table"]), "panels": [str(p) for p in found["panels"]]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a figure's panels file ({exc!r})") from None


def mark_panels(folder: Path, spec: TableSpec) -> None:
    """Write `folder`/panels.json for the figure `spec` (before its panels run, so a partial figure reports)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(folder) / PANELS_FILE, {"table": spec.name, "panels": list(spec.panels)})


def write_panel_reports(folder: Path, *, gap: bool | None = None) -> dict[str, Any]:
    """Re-render every panel's run (no model calls), then the figure and the tables of both panels in `folder`;
    `gap` as `reports.report.write_reports` takes it.

    Raises:
        ConfigError: for a folder without panels.json, or a panel that holds no run yet.
    """
    from reports.figure import render_panels
    from reports.render import render_csv, render_latex, render_markdown
    from reports.report import report_spec, write_reports

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
    drawn = [(spec, payload["results"], _PANEL_TITLES.get(spec.name, spec.name),
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


def panel_of_row(folder: Path, row: str) -> Path:
    """The panel run of a figure folder that holds row `row`.

    Raises:
        ConfigError: when no panel has it (listing the rows they have).
    """
    found = panels_of(folder)
    assert found is not None
    labels = {}
    for name in found["panels"]:
        manifest = Path(folder) / name / "manifest.json"
        rows = json.loads(manifest.read_text(encoding="utf-8")).get("rows", {}) if manifest.is_file() else {}
        labels.update(dict.fromkeys(rows, name))
    if row not in labels:
        raise ConfigError(f"{folder}: no row {row!r} in its panels; rows: {', '.join(labels) or '(none yet)'}")
    return Path(folder) / labels[row]
