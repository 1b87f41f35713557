"""Tables drawn as grouped bars with interval whiskers (PNG and PDF): Figure 3's verifiable tasks, Figure 2's two
panels.

One panel per table; in it one group per column (benchmark and metric), one bar per row, at the cell's AVG@k value;
the whiskers are the bootstrap interval of repeat 0 (the per-item uncertainty `results.json` reports), and each bar
is labelled with its value (so a bar of height 0 shows). A cell without a value has no bar; a column without any
value is left out of the panel (the table files show its dashes).
matplotlib draws it off screen (Agg), so it runs on headless machines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.runstore import write_error
from reports.tables import TableSpec


def _cell(results: Mapping[str, Any], label: str, col: Any) -> dict[str, Any] | None:
    return results.get(label, {}).get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)


def drawn_columns(spec: TableSpec, results: Mapping[str, Any]) -> list[Any]:
    """The columns a panel draws: those with a value in some row."""
    return [c for c in spec.columns if any(_cell(results, r.label, c) for r in spec.rows)]


def draw_panel(ax: Any, spec: TableSpec, results: Mapping[str, Any], *, title: str, ylabel: str) -> dict[str, int]:
    """Draw `spec`'s rows as grouped bars on `ax`; returns column header -> bars drawn in its group."""
    rows = list(spec.rows)
    cols = drawn_columns(spec, results)
    width = 0.8 / max(1, len(rows))
    bars = {spec.header(c): 0 for c in cols}
    values: list[float] = [0.0]
    for r, row in enumerate(rows):
        xs, heights, low, high = [], [], [], []
        for c, col in enumerate(cols):
            cell = _cell(results, row.label, col)
            if not cell:
                continue
            scale = cell["scale"]
            value = cell["value"] * scale
            xs.append(c + (r - (len(rows) - 1) / 2) * width)
            heights.append(value)
            low.append(max(0.0, value - cell["ci_low"] * scale))
            high.append(max(0.0, cell["ci_high"] * scale - value))
            values += [cell["ci_low"] * scale, cell["ci_high"] * scale]
            bars[spec.header(col)] += 1
        bars_drawn = ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=row.label)
        ax.bar_label(bars_drawn, fmt="%.1f", fontsize=6, padding=1)  # a bar of height 0 shows as its value
    ax.set_xticks(range(len(cols)), [spec.header(c) for c in cols], fontsize=7, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    # Percentages: 0..100, unless a score goes below 0 (WildBench's WB-Score) or beyond 100.
    ax.set_ylim(min(0.0, min(values) * 1.1), max(100.0, max(values) * 1.05))
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return bars


def render_panels(panels: Sequence[tuple[TableSpec, Mapping[str, Any], str, str]], out_dir: Path, *,
                  title: str | None = None) -> tuple[list[Path], list[dict[str, int]]]:
    """Write `figure.png` and `figure.pdf` into `out_dir`: one panel per (table, results, panel title, y label),
    side by side. Returns the paths and, per panel, column header -> bars drawn.

    Raises:
        ConfigError: when matplotlib is not installed (the `verifiable` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError('drawing the figure needs matplotlib: pip install -e ".[verifiable]"') from None
    widths = [max(4.0, 1.8 * len(drawn_columns(spec, results)) + 1.5) for spec, results, *_ in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 3.6), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    bars = [draw_panel(ax, spec, results, title=name, ylabel=ylabel)
            for ax, (spec, results, name, ylabel) in zip(axes[0], panels)]
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    paths = [Path(out_dir) / "figure.png", Path(out_dir) / "figure.pdf"]
    try:
        for path in paths:
            try:
                fig.savefig(path, dpi=150)
            except OSError as exc:  # a write error of an open file names no path: say which
                raise write_error(path, exc) from None
    finally:
        plt.close(fig)
    return paths, bars


def render_figure(spec: TableSpec, results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """One table as one panel (Figure 3): `figure.png` and `figure.pdf` in `out_dir`; returns their paths.

    Raises:
        ConfigError: when matplotlib is not installed (the `verifiable` extra).
    """
    return render_panels([(spec, results, spec.title, "AVG@k (%)")], out_dir)[0]
