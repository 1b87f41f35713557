"""`harness view RUN [RUN2]`: a run you can look at, as one static HTML page (no network, no server).

The page has an overview (the run's table as `table.md` renders it, with the paper's numbers, its settings and
model identities, its failure summary; each cell opens its items), an item list with filters (benchmark,
evaluator or policy, wrong only, failed only, ties, free text; `j`/`k` step through it) and an item view:
for evaluator runs the prompt, the candidates, the gold preference or ranking and, per evaluator and repeat,
the rubric with its weights, the item x response verdict matrix, the scores, the predicted order against the
gold one and whether the record counted right, wrong or tied (raw model texts behind a toggle; a reward model's
scores; a pairwise judge's games in both orders); for policy runs the prompt, the answer with its reasoning
folded and the judgment (Arena-Hard's two games; a checker's extracted answer against the gold one). With two
runs, a third tab lists the records whose outcome changed, side by side: the drill-down behind
`harness compare`, and the overview opens on compare's verdict per cell (`reports.view.page.gate`) or its
differences. Two runs of which no record pairs are refused with compare's differences; runs that pair in part
(one still running) are shown, and the differences compare names are returned as notes.

Outcomes come from the benchmarks' declared metrics (`reports.view.outcome`), computed here; the page's script
only shows them. Every record text is set as text, never parsed as HTML.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from reports.view.page import ViewResult, build_view
from reports.view.runs import check_comparable, read_run_dir

__all__ = ["ViewResult", "default_out", "view_runs"]


def default_out(run: Path, run2: Path | None = None) -> Path:
    """Where the page goes unless `--out` says: `RUN/view.html`, or `RUN2/compare.html` beside compare.md."""
    return Path(run2) / "compare.html" if run2 is not None else Path(run) / "view.html"


def view_runs(run: Path, run2: Path | None = None, *, out: Path | None = None,
              data_dir: Path | None = None) -> ViewResult:
    """Write the page for `run` (and `run2`, compared with it) and say what was written.

    Raises:
        ConfigError: a path that holds no run of `harness run` or `harness eval`, or two runs of which no
            record pairs.
    """
    runs = [read_run_dir(run, "RUN")]
    notes: list[str] = []
    if run2 is not None:
        runs.append(read_run_dir(run2, "RUN2"))
        notes = check_comparable(*runs)
    result = build_view(runs, out=out or default_out(run, run2), data_dir=data_dir)
    return dataclasses.replace(result, notes=tuple(notes))
