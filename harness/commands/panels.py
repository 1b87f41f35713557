"""`harness run FIGURE` for a figure of panels (fig2): each panel is an ordinary `harness run` of its own table
into OUT/PANEL, then the figure and the tables of both panels are drawn into OUT (`reports.report.write_panel_reports`).

Every panel gets the command line as given, less what belongs to the others: a judge (`--judge` and its options)
only reaches a policy panel, a `--bench-option` only the panel with that benchmark (the config file's keys are
split the same way by `reports.tables.TableSpec.resolve`). A panel whose records hold failures does not stop the
next; the command exits with the worst panel's code once the figure is drawn. Bad input stops it at once (exit 2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from harness.errors import ConfigError


def panels_of(table: str) -> tuple[str, ...]:
    """The panels of a registered figure (`TableSpec.panels`); () for a table of its own."""
    from reports.tables import get_table

    return get_table(table).panels


def run_panels(table: str, args: Any, run_one: Callable[[str, Any], None]) -> None:
    """Run every panel of `table` with `run_one(panel, panel_args)` (`panel_args`: the `TableRun` options `args`
    as that panel takes them), then write the figure's reports into OUT.

    Raises:
        ConfigError: for a `--bench-option` of a benchmark no panel has.
        typer.Exit: with the worst panel's exit code, after the figure is drawn, when a panel's records hold
            failures.
    """
    from harness.config import load_run_config
    from reports.panels import mark_panels
    from reports.report import write_panel_reports
    from reports.tables import get_table

    figure = get_table(table)
    cfg = load_run_config(args.config, {"preset": args.preset, "out": args.out})
    folder = cfg.out or Path("runs") / f"{table}-{cfg.preset}"
    specs = [get_table(name) for name in figure.panels]
    given = args.bench_option or []
    mine = {spec.name: [o for o in given if o.partition(".")[0] in spec.benchmarks] for spec in specs}
    stray = [o for o in given if not any(o in v for v in mine.values())]
    if stray:
        names = sorted({b for spec in specs for b in spec.benchmarks})
        raise ConfigError(f"--bench-option {stray[0]!r}: no panel of {table} has that benchmark; its benchmarks: "
                          f"{', '.join(names)}")
    mark_panels(folder, figure)
    codes = []
    for spec in specs:
        changes: dict[str, Any] = {"out": folder / spec.name, "bench_option": mine[spec.name] or None}
        if spec.kind != "policy":
            changes.update(judge=None, judge_base_url=None, judge_api_key_env=None)
        typer.echo(f"--- {table}: panel {spec.name} ({spec.title}) into {folder / spec.name}")
        try:
            run_one(spec.name, dataclasses.replace(args, **changes))
        except typer.Exit as exc:
            if exc.exit_code:
                codes.append(exc.exit_code)
    write_panel_reports(folder)
    typer.echo((folder / "table.md").read_text(encoding="utf-8"))
    typer.echo(f"figure: {folder / 'figure.png'}, {folder / 'figure.pdf'}")
    if codes:
        raise typer.Exit(max(codes))
