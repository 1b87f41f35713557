"""A table drawn as grouped bars with interval whiskers (PNG and PDF): Figure 3's verifiable tasks.

One group per column (benchmark and metric), one bar per row (policy), at the cell's AVG@k value; the whiskers are
the bootstrap interval of repeat 0 (the per-item uncertainty `results.json` reports). A cell without a value has no
bar. matplotlib draws it off screen (Agg), so it runs on headless machines.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.runstore import write_error
from reports.tables import TableSpec


def render_figure(spec: TableSpec, results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write `figure.png` and `figure.pdf` into `out_dir`; returns their paths.

    Raises:
        ConfigError: when matplotlib is not installed (the `verifiable` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError('drawing the figure needs matplotlib: pip install -e ".[verifiable]"') from None
    rows, cols = list(spec.rows), list(spec.columns)
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.8 * len(cols) + 1.5), 3.2))
    for r, row in enumerate(rows):
        xs, heights, low, high = [], [], [], []
        for c, col in enumerate(cols):
            cell = results.get(row.label, {}).get("benchmarks", {}).get(col.benchmark, {}).get(col.metric)
            if not cell:
                continue
            scale = col.declared().scale
            value = cell["value"] * scale
            xs.append(c + (r - (len(rows) - 1) / 2) * width)
            heights.append(value)
            low.append(max(0.0, value - cell["ci_low"] * scale))
            high.append(max(0.0, cell["ci_high"] * scale - value))
        ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=row.label)
    ax.set_xticks(range(len(cols)), [spec.header(c) for c in cols])
    ax.set_ylabel("AVG@k (%)")
    ax.set_ylim(0, 100)
    ax.set_title(spec.title, fontsize=9)
    ax.legend(fontsize=7)
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
    return paths
