"""`harness compare BASE_RUN CAND_RUN`: the regression gate between two runs of the same table (no model calls
here; the verb's drift canary, `harness.commands.canary`, makes a few).

Matching. Rows are matched by label (so a baseline checkpoint and a candidate checkpoint in one row compare), and
within a row the records by (benchmark, item, repeat); only complete repeats count, as in the reports. Every metric
the benchmark declares (`Benchmark.metrics`) is compared.

Per cell (row, benchmark, metric):
- each item's value is its per-item contribution averaged over the repeats (weighted by the repeats' item
  weights where the metric has them); the run's value is the benchmark's aggregate of them (the weighted mean
  its metric declares: AVG@k of the table);
- the difference candidate - base with a paired percentile bootstrap interval over items (both runs resampled
  with the same items; 1,000 resamples, 95%, seed 0 by default);
- for strict accuracies (per-item values 0/1) McNemar's exact test on the discordant (item, repeat) pairs,
  pooled over repeats and unweighted (repeats of one item are not independent, and a weighted aggregate such
  as RM-Bench's weighs items unequally, so read it as a second opinion; the verdict comes from the interval);
- the verdict, in points on a 0-100 scale (1 point = 0.01 of an accuracy or of an nDCG): *regression* when the
  whole interval lies below -margin (above +margin for a lower-is-better metric), *improvement* when it lies
  beyond +margin the other way; else *underpowered* when the interval is wider than twice the margin (its
  half-width, the smallest difference this sample could detect, exceeds the margin: a drop as large as the margin
  could have gone unseen), else *no significant change*. Each cell also gives that half-width and the paired
  items it would need for the margin (the half-width shrinks as 1/sqrt(items): items x (half-width / margin)^2).

Comparable runs: both are runs of `harness run`/`harness eval` with the same rows, benchmarks, dataset
fingerprints (the items as presented: ids, prompts, responses in A/B order, gold labels) and (item, repeat) sets;
per row, the same evaluator kind and settings except the one under test (`judges.held_fixed`: a rubric
evaluator's generator, a reward model), and every other model (the verifier, a judge) with the same identity
(revision or weights hash). Policy runs (table2/6/8): the row's policy is what changes; the judge (model,
backend options, identity), the judge settings, the generation settings and the loaders' options must agree.
Anything else is reported as a difference, and the gate exits 2.

Failures are first-class. Judged policy metrics (a failed judgment or answer weighs 0) pair only the items both
runs scored; the cell says how many were dropped, and where a printed value differs from the run's own
results.json (dropped items, or upstream's aggregate where the benchmark has one) `compare.md` gives both and
why. Other metrics count a failure as its worst value on its side (wrong), so every item pairs. A cell where
either run holds a failure of the backend (the resume rule retries it: the run is unfinished) is *incomplete*;
one with no item scored on both sides is *unscored*; neither passes the gate. A metric whose value is a model
fit (AlpacaEval's length-controlled win rate) is gated through its per-item stand-in (the win rate) and not
compared itself. A run still being written is refused, naming the process that writes it.

A figure of panels (fig2: a folder with `panels.json`, `reports.panels`) is compared panel by panel: every panel's
cells, and its differences named by panel, in one comparison.

Config (`--config FILE`, YAML): `margin` (points), `margins` (per `BENCHMARK` or `BENCHMARK.METRIC`, each a
registered benchmark and a metric it declares), `n_resamples`, `alpha`, `seed`. Outputs: `compare.json` and
`compare.md`. Exit code: 2 if the runs are not comparable, else 1 if any cell regresses, else 3 if any cell is
incomplete or unscored (or underpowered, with `require_power` / `--require-power`), else 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from benchmarks import metrics
from benchmarks.scoring import Metric, Unavailable, metric_of
from harness.errors import ConfigError
from harness.lock import OutputLock
from harness.records import EvalRecord
from harness.runstore import Manifest, OutputPaths, RecordLog, write_json_atomic, write_text_atomic
from reports.panels import panels_of
from reports.results import benchmark, item_values

Verdict = Literal["regression", "improvement", "no significant change", "underpowered", "incomplete", "unscored"]
EXIT_OK, EXIT_REGRESSION, EXIT_INCOMPARABLE, EXIT_UNGATED = 0, 1, 2, 3
UNGATED: tuple[Verdict, ...] = ("incomplete", "unscored")
"""Verdicts of cells the gate could not judge; any of them makes the gate exit 3, never 0."""


class CompareConfig(BaseModel):
    """`harness compare --config FILE`: margins and the bootstrap's settings; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    margin: float = Field(1.0, ge=0, description="Points (0-100 scale) a change must clear to count.")
    margins: dict[str, float] = Field(default_factory=dict, description="Per BENCHMARK or BENCHMARK.METRIC.")
    n_resamples: int = Field(1000, ge=100)
    alpha: float = Field(0.05, gt=0, lt=1, description="Two-sided: the interval covers 1 - alpha.")
    seed: int = 0
    require_power: bool = Field(False, description="An underpowered cell makes the gate exit 3.")
    canary_min_agreement: float = Field(
        0.9, ge=0, le=1, description="The drift canary's least agreement with BASE_RUN's stored answers (below: "
        "exit 2).")

    @field_validator("margins")
    @classmethod
    def _known_cells(cls, margins: dict[str, float]) -> dict[str, float]:
        """Every key names a benchmark (and a metric it declares): a misspelt one would be ignored silently."""
        for key, value in margins.items():
            name, _, metric = key.partition(".")
            try:
                found = benchmark(name)
                if metric:
                    metric_of(found, metric)
            except (ConfigError, KeyError) as exc:
                raise ValueError(f"{key!r}: {exc.args[0]}") from None
            if value < 0:
                raise ValueError(f"{key!r}: a margin is >= 0 points, got {value}")
        return margins

    def margin_for(self, bench: str, metric: str) -> float:
        return self.margins.get(f"{bench}.{metric}", self.margins.get(bench, self.margin))


@dataclass(frozen=True, slots=True)
class Run:
    """One run directory as the gate reads it."""

    path: Path
    manifest: dict[str, Any]
    records: list[EvalRecord]

    @property
    def settings(self) -> dict[str, Any]:
        return self.manifest.get("settings", {})

    @property
    def rows(self) -> dict[str, str]:
        return self.manifest["rows"]


@dataclass(frozen=True, slots=True)
class Cell:
    """One (row, benchmark, metric) comparison. Values are unscaled (a fraction for accuracies) and None for an
    `unscored` cell."""

    row: str
    benchmark: str
    metric: str
    base: float | None
    """Base run's value over the paired items."""
    candidate: float | None
    diff: float | None
    """candidate - base."""
    ci_low: float | None
    ci_high: float | None
    """Paired bootstrap interval of `diff`."""
    margin: float
    """In points (0-100 scale)."""
    verdict: Verdict
    n_items: int
    repeats: int
    paired: int
    """Items scored on both sides (the values and the interval are over these)."""
    dropped: int
    """Items left out because a side could not score them (`n_items - paired`)."""
    base_failed: int
    candidate_failed: int
    """Records the metric counts in n_failed (over all repeats)."""
    base_to_retry: int
    candidate_to_retry: int
    """Records holding a failure of the backend, which a rerun of that run's command retries."""
    base_reported: float | None
    candidate_reported: float | None
    """Each run's value as its own results.json reports it (all its records of the cell; upstream's aggregate
    where the benchmark has one), None where it has none."""
    mcnemar: dict[str, Any] | None = None
    """For strict accuracies: `base_only` (right in base only), `candidate_only`, `p` (exact, two-sided)."""
    half_width: float | None = None
    """Half the interval's width (unscaled, as `diff`): the smallest difference this sample could detect."""
    items_needed: int | None = None
    """Paired items that would bring `half_width` down to the margin (None: a margin of 0)."""


@dataclass(slots=True)
class Comparison:
    """The gate's result: cells, differences that make the runs incomparable, the exit code."""

    base: str
    candidate: str
    config: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    canary: dict[str, Any] | None = None
    """The drift canary's findings (`harness.commands.canary`), None where it did not run."""

    @property
    def comparable(self) -> bool:
        return not self.differences

    @property
    def exit_code(self) -> int:
        if self.differences:
            return EXIT_INCOMPARABLE
        if any(c.verdict == "regression" for c in self.cells):
            return EXIT_REGRESSION
        ungated = UNGATED + (("underpowered",) if self.config.get("require_power") else ())
        return EXIT_UNGATED if any(c.verdict in ungated for c in self.cells) else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "candidate": self.candidate,
            "comparable": self.comparable,
            "differences": self.differences,
            "exit_code": self.exit_code,
            "regressions": sum(c.verdict == "regression" for c in self.cells),
            "improvements": sum(c.verdict == "improvement" for c in self.cells),
            "ungated": sum(c.verdict in UNGATED for c in self.cells),
            "underpowered": sum(c.verdict == "underpowered" for c in self.cells),
            "config": self.config,
            "canary": self.canary,
            "cells": [asdict(c) for c in self.cells],
        }


def read_run(path: Path, what: str) -> Run:
    """A run directory's manifest and records.

    Raises:
        ConfigError: naming `what` (BASE_RUN / CAND_RUN) and the path when it holds no run of `harness run` or
            `harness eval`.
    """
    path = Path(path)
    paths = OutputPaths.run_dir(path)
    if not paths.manifest.is_file():
        raise ConfigError(f"{what} {path}: not a run directory (no manifest.json)")
    holder = OutputLock(paths.lock, what=str(path)).live_holder()
    if holder is not None:
        raise ConfigError(f"{what} {path} is being written by another harness process ({holder}); compare it "
                          "when that run has finished")
    manifest = Manifest(paths.manifest).read()
    if manifest.get("command") not in ("run", "eval") or "rows" not in manifest:
        raise ConfigError(f"{what} {path}: the manifest is of `harness {manifest.get('command', '?')}`, not of a run")
    return Run(path, manifest, RecordLog(paths.records, EvalRecord).records())


def _complete(records: Sequence[EvalRecord]) -> dict[tuple[str, str], dict[tuple[str, int], EvalRecord]]:
    """(evaluator spec, benchmark) -> (item, repeat) -> record, complete repeats only."""
    grouped: dict[tuple[str, str], dict[int, list[EvalRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        grouped[(r.evaluator, r.benchmark)][r.repeat].append(r)
    out = {}
    for key, repeats in grouped.items():
        size = max(len(v) for v in repeats.values())
        out[key] = {(r.item, r.repeat): r for v in repeats.values() if len(v) == size for r in v}
    return out


def _differences(base: Run, cand: Run) -> list[str]:
    """Everything that makes the two runs incomparable, each as one line naming what differs."""
    from judges import held_fixed

    out = []
    b_rows, c_rows = base.rows, cand.rows
    for label in sorted(set(b_rows) ^ set(c_rows)):
        out.append(f"row {label!r} is only in {'BASE' if label in b_rows else 'CAND'}")
    b_data, c_data = base.settings.get("data", {}), cand.settings.get("data", {})
    for bench in sorted(set(b_data) | set(c_data)):
        if bench not in b_data or bench not in c_data:
            out.append(f"benchmark {bench!r} is only in {'BASE' if bench in b_data else 'CAND'}")
        elif b_data[bench] != c_data[bench]:
            out.append(
                f"benchmark {bench!r}: dataset fingerprints differ (BASE {b_data[bench]}, CAND {c_data[bench]}): "
                "other items, or the same items presented differently (--limit, --seed, data files)"
            )
    if base.settings.get("judge") or cand.settings.get("judge"):
        return out + _policy_differences(base, cand)
    b_models, c_models = base.settings.get("models", {}), cand.settings.get("models", {})
    for label in sorted(set(b_rows) & set(c_rows)):
        b_kind, _, b_fixed = held_fixed(b_rows[label])
        c_kind, _, c_fixed = held_fixed(c_rows[label])
        if b_kind != c_kind:
            out.append(f"row {label!r}: evaluator kinds differ (BASE {b_kind}, CAND {c_kind})")
            continue
        for key in sorted(set(b_fixed) | set(c_fixed)):
            if b_fixed.get(key) != c_fixed.get(key):
                out.append(
                    f"row {label!r}: setting {key!r} differs (BASE {b_fixed.get(key, '(default)')}, "
                    f"CAND {c_fixed.get(key, '(default)')}); only the model under test may change"
                )
            elif b_fixed[key] in b_models and b_models.get(b_fixed[key]) != c_models.get(c_fixed[key]):
                out.append(
                    f"row {label!r}: {key} {b_fixed[key]!r} is not the same model in both runs "
                    f"(BASE {b_models.get(b_fixed[key])}, CAND {c_models.get(c_fixed[key])})"
                )
    return out


def _policy_differences(base: Run, cand: Run) -> list[str]:
    """Policy runs compare only when judged alike: the same judge model (and identity), judge settings and
    generation settings; the policy of a row is what may change."""
    b, c = base.settings, cand.settings
    if not b.get("judge") or not c.get("judge"):
        return [f"only {'BASE' if b.get('judge') else 'CAND'} is a policy run (judged answers); the other scores "
                "evaluators"]
    out = []
    b_judge, c_judge = b["judge"], c["judge"]
    if b_judge.get("model") != c_judge.get("model") or b_judge.get("options") != c_judge.get("options"):
        def shown(judge: dict) -> str:
            options = ", ".join(f"{k}={v}" for k, v in (judge.get("options") or {}).items())
            return f"{judge.get('model')}" + (f" ({options})" if options else "")

        out.append(f"judged by different judges (BASE {shown(b_judge)}, CAND {shown(c_judge)})")
    else:
        b_id = (base.manifest.get("judge") or {}).get("identity")
        c_id = (cand.manifest.get("judge") or {}).get("identity")
        if b_id != c_id:
            out.append(f"the judge {b_judge.get('model')!r} is not the same model in both runs (BASE {b_id}, "
                       f"CAND {c_id})")
    for key, what in (("judge_settings", "judge settings"), ("generation", "generation settings"),
                      ("bench_options", "benchmark options")):
        if b.get(key) != c.get(key):
            for name in sorted(set(b.get(key) or {}) | set(c.get(key) or {})):
                bv, cv = (b.get(key) or {}).get(name), (c.get(key) or {}).get(name)
                if bv != cv:
                    out.append(f"{what} differ: {name} (BASE {bv}, CAND {cv})")
    return out


def _key_differences(label: str, bench: str, b: Mapping, c: Mapping) -> list[str]:
    only_b, only_c = sorted(set(b) - set(c)), sorted(set(c) - set(b))
    if not only_b and not only_c:
        return []

    def show(keys: list) -> str:
        return ", ".join(f"{item}#{repeat}" for item, repeat in keys[:3]) + (" ..." if len(keys) > 3 else "")

    parts = [f"{len(keys)} only in {who} ({show(keys)})" for who, keys in (("BASE", only_b), ("CAND", only_c)) if keys]
    return [f"row {label!r}, benchmark {bench!r}: (item, repeat) sets differ: " + "; ".join(parts)]


def _verdict(lo: float, hi: float, margin: float, higher_is_better: bool) -> Verdict:
    lo, hi = lo * 100, hi * 100
    worse, better = (hi < -margin, lo > margin) if higher_is_better else (lo > margin, hi < -margin)
    if worse or better:
        return "regression" if worse else "improvement"
    return "underpowered" if hi - lo > 2 * margin else "no significant change"


def items_needed(paired: int, half_width: float, margin: float) -> int | None:
    """Paired items for an interval of half-width `margin` points, from `paired` items that gave `half_width`
    (unscaled): the half-width shrinks as 1/sqrt(items). None for a margin of 0 (no sample is enough)."""
    if margin <= 0:
        return None
    return max(1, math.ceil(paired * (half_width * 100 / margin) ** 2))


@dataclass(frozen=True, slots=True)
class _Side:
    """One run's records of a cell, as the gate pairs them: per item its value over the repeats and its weight
    (None: every item counts the same, a failure as its worst value)."""

    values: np.ndarray
    weights: np.ndarray | None
    failed: int
    """Records the metric counts in `n_failed`."""
    to_retry: int
    """Records holding a failure of the backend: the run is unfinished, its rerun retries them."""
    reported: float | None
    """The metric as the run's own results.json reports it over all of its records of the cell."""


def _side(metric: Metric, records: Mapping, items: list[str], repeats: list[int]) -> _Side:
    from harness.loop import settled

    per_repeat = [[records[(i, r)] for i in items] for r in repeats]
    values, weights = item_values(metric, per_repeat)
    return _Side(
        values, weights,
        failed=sum(metric.failed(r) for r in records.values()),
        to_retry=sum(not settled(r) for r in records.values()),
        reported=_reported(metric, per_repeat),
    )


def _reported(metric: Metric, per_repeat: list[list[EvalRecord]]) -> float | None:
    """AVG@k of the metric as `reports.results` computes it for results.json (None: it has no value there)."""
    try:
        return float(np.mean([metric.result(recs, seed=0).value for recs in per_repeat]))
    except (ValueError, Unavailable):
        return None


def compare_cell(
    label: str, bench: str, metric: Metric, base: Mapping, cand: Mapping, cfg: CompareConfig
) -> Cell:
    """One cell from the two runs' records keyed by (item, repeat) (the same keys on both sides).

    Items pair where both sides scored them: for a metric that weighs a failure 0 (a judged policy metric), an
    item failed on either side is dropped from both and counted in `dropped`; elsewhere a failure is its worst
    value on its side (counted wrong) and every item pairs. A side with records a rerun would retry makes the
    cell `incomplete`; a cell with no item scored on both sides is `unscored`: neither passes the gate.
    """
    keys = sorted(base)
    items = sorted({item for item, _ in keys})
    repeats = sorted({repeat for _, repeat in keys})
    b, c = _side(metric, base, items, repeats), _side(metric, cand, items, repeats)
    weights = None
    if b.weights is not None and c.weights is not None:
        weights = np.where(c.weights > 0, b.weights, 0.0)
    paired = len(items) if weights is None else int(np.count_nonzero(weights > 0))
    margin = cfg.margin_for(bench, metric.name)
    counts = dict(n_items=len(items), repeats=len(repeats), paired=paired, dropped=len(items) - paired,
                  base_failed=b.failed, candidate_failed=c.failed, base_to_retry=b.to_retry,
                  candidate_to_retry=c.to_retry, base_reported=b.reported, candidate_reported=c.reported)
    if not paired:
        verdict: Verdict = "incomplete" if b.to_retry or c.to_retry else "unscored"
        return Cell(label, bench, metric.name, None, None, None, None, None, margin, verdict, **counts)
    b_agg, c_agg = metrics.weighted_mean(b.values, weights), metrics.weighted_mean(c.values, weights)
    lo, hi = metrics.paired_bootstrap_ci(
        b.values, c.values, weights=weights, n_resamples=cfg.n_resamples, alpha=cfg.alpha, seed=cfg.seed
    )
    verdict = "incomplete" if b.to_retry or c.to_retry else _verdict(lo, hi, margin, metric.higher_is_better)
    test = None
    if metric.binary:
        b_val = {k: metric.per_item(base[k]) for k in keys}
        c_val = {k: metric.per_item(cand[k]) for k in keys}
        base_only = sum(b_val[k] > c_val[k] for k in keys)
        cand_only = sum(c_val[k] > b_val[k] for k in keys)
        test = {"base_only": base_only, "candidate_only": cand_only, "p": metrics.mcnemar_exact(base_only, cand_only)}
    half = (hi - lo) / 2
    return Cell(label, bench, metric.name, b_agg, c_agg, c_agg - b_agg, lo, hi, margin, verdict, mcnemar=test,
                half_width=half, items_needed=items_needed(paired, half, margin), **counts)


def compare_runs(base_dir: Path, cand_dir: Path, cfg: CompareConfig | None = None) -> Comparison:
    """Compare two run directories (see the module docstring); never raises for incomparable runs, it says why.

    Raises:
        ConfigError: a path that holds no run.
    """
    cfg = cfg or CompareConfig()
    b_panels, c_panels = panels_of(base_dir), panels_of(cand_dir)
    if b_panels is not None or c_panels is not None:
        return _compare_panels(Path(base_dir), Path(cand_dir), b_panels, c_panels, cfg)
    base, cand = read_run(base_dir, "BASE_RUN"), read_run(cand_dir, "CAND_RUN")
    result = Comparison(str(base.path), str(cand.path), cfg.model_dump(), differences=_differences(base, cand))
    for label, bench, b, c, problems in _matched(base, cand):
        if problems:
            result.differences += problems
            continue
        for metric in benchmark(bench).metrics:
            if not metric.gated:
                continue
            b_in = {k: r for k, r in b.items() if metric.applies is None or metric.applies(r)}
            c_in = {k: r for k, r in c.items() if k in b_in}
            if b_in:
                result.cells.append(compare_cell(label, bench, metric, b_in, c_in, cfg))
    return result


def _matched(base: Run, cand: Run) -> Iterator[tuple[str, str, dict, dict, list[str]]]:
    """(row, benchmark, base records, candidate records, differences) of every row both runs have and benchmark
    either ran it on: the records keyed by (item, repeat), complete repeats only; the differences name the keys
    only one side has."""
    b_cells, c_cells = _complete(base.records), _complete(cand.records)
    for label in [r for r in base.rows if r in cand.rows]:
        b_spec, c_spec = base.rows[label], cand.rows[label]
        benches = sorted({b for s, b in b_cells if s == b_spec} | {b for s, b in c_cells if s == c_spec})
        for bench in benches:
            b, c = b_cells.get((b_spec, bench), {}), c_cells.get((c_spec, bench), {})
            yield label, bench, b, c, _key_differences(label, bench, b, c)


def incomparable(base: Run, cand: Run) -> list[str]:
    """Why the gate refuses to compare two runs (empty: it compares them): the module docstring's rule, each
    difference one line naming what differs, BASE and CAND for the two sides."""
    return _differences(base, cand) + [p for *_, problems in _matched(base, cand) for p in problems]


def _compare_panels(base_dir: Path, cand_dir: Path, b_panels: dict[str, Any] | None,
                    c_panels: dict[str, Any] | None, cfg: CompareConfig) -> Comparison:
    """Two figures of panels (`reports.panels`), compared panel by panel: every panel's cells and differences (named
    by panel) in one comparison."""
    result = Comparison(str(base_dir), str(cand_dir), cfg.model_dump())
    if b_panels is None or c_panels is None or b_panels != c_panels:
        shown = {"BASE": b_panels, "CAND": c_panels}
        result.differences.append("not the same figure of panels (" + ", ".join(
            f"{who} {p['table'] + ': ' + ', '.join(p['panels']) if p else 'a single run'}" for who, p in shown.items())
            + ")")
        return result
    for name in b_panels["panels"]:
        part = compare_runs(base_dir / name, cand_dir / name, cfg)
        result.cells += part.cells
        result.differences += [f"panel {name}: {d}" for d in part.differences]
    return result


def render_markdown(result: Comparison) -> str:
    lines = [f"### Comparison: {result.candidate} against {result.base}", ""]
    if result.differences:
        lines += ["**Not comparable** (exit 2):", ""] + [f"- {d}" for d in result.differences] + [""]
    count = {v: sum(c.verdict == v for c in result.cells) for v in ("regression", "improvement")}
    ungated = sum(c.verdict in UNGATED for c in result.cells)
    weak = sum(c.verdict == "underpowered" for c in result.cells)
    lines.append(
        f"{len(result.cells)} cells: {count['regression']} regressions, {count['improvement']} improvements, "
        f"{weak} underpowered, {ungated} not gated (incomplete or unscored); exit code {result.exit_code}."
    )
    lines += [
        "",
        "| Row | Benchmark | Metric | Base | Cand | Diff (points) | 95% CI (points) | Margin | Detectable (points) | "
        "Items for margin | McNemar p | Items paired | Failed (B/C) | Verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for c in result.cells:
        bench = benchmark(c.benchmark)
        metric = next(m for m in bench.metrics if m.name == c.metric)
        p = f"{c.mcnemar['p']:.3g} ({c.mcnemar['base_only']}/{c.mcnemar['candidate_only']})" if c.mcnemar else "-"
        verdict = f"**{c.verdict}**" if c.verdict != "no significant change" else c.verdict
        diff, ci, half = "-", "-", "-"
        if c.diff is not None:
            diff, ci = f"{c.diff * 100:+.2f}", f"[{c.ci_low * 100:+.2f}, {c.ci_high * 100:+.2f}]"  # type: ignore
        if c.half_width is not None:
            half = f"±{c.half_width * 100:.2f}"
        needed = "-" if c.items_needed is None else str(c.items_needed)
        lines.append(
            f"| {c.row} | {bench.display} | {metric.display} | {metric.format(c.base)} | "
            f"{metric.format(c.candidate)} | {diff} | {ci} | {c.margin:g} | {half} | {needed} | {p} | "
            f"{c.paired}/{c.n_items} | {c.base_failed}/{c.candidate_failed} | {verdict} |"
        )
        notes += _cell_notes(c, metric, f"{c.row} / {bench.display} {metric.display}")
    if notes:
        lines += ["", "Failures and differences from the runs' own results:", ""] + [f"- {n}" for n in notes]
    if result.canary is not None:
        lines += ["", *canary_lines(result.canary)]
    cfg = result.config
    lines += [
        "",
        f"Paired bootstrap over items ({cfg['n_resamples']} resamples, {1 - cfg['alpha']:.0%}, seed {cfg['seed']}); "
        "repeats averaged per item first; a metric that weighs a failed judgment 0 pairs only the items both runs "
        "scored, others count a failure wrong on its side. Points: differences x 100 (accuracy points; nDCG x "
        "100). McNemar: exact two-sided, discordant (item, repeat) pairs as base-only/candidate-only right. Failed: "
        "records counted in n_failed (all repeats). Detectable: the interval's half-width, the smallest difference "
        "this sample could detect; a cell whose interval is wider than twice its margin is underpowered (a change "
        "as large as the margin could go unseen), and Items for margin is the paired items that would narrow it to "
        "the margin (items x (half-width / margin)^2). Exit 3: a cell is incomplete (a run holds failures of the "
        "backend: rerun its command to retry them) or unscored (no item scored on both sides), or underpowered "
        f"with --require-power (here {'on' if cfg.get('require_power') else 'off'}).",
    ]
    return "\n".join(lines) + "\n"


def canary_lines(canary: Mapping[str, Any]) -> list[str]:
    """What compare.md says of the drift canary (`harness.commands.canary`)."""
    lines = [f"Drift canary: {canary.get('calls', 0)} call(s) re-asked without the cache"
             + (f", threshold {canary['threshold']:.0%}:" if "threshold" in canary else ":")]
    for m in canary.get("models", []):
        agreement = "-" if m.get("agreement") is None else f"{m['agreement']:.0%}"
        diff = "" if m.get("logprob_diff") is None else f", mean |Δ logprob| {m['logprob_diff']:.3f}"
        failed = f", {m['failed']} not answered" if m.get("failed") else ""
        lines.append(f"- {m['spec']}: {m['agreed']}/{m['asked'] - m['failed']} agree ({agreement}){diff}{failed}")
    return (lines + [f"- {why}" for why in canary.get("skipped", [])]
            + [f"- not re-asked: {why}" for why in canary.get("unreached", [])])


def _cell_notes(c: Cell, metric: Metric, where: str) -> list[str]:
    """What a reader of one cell must know besides its numbers: failures to retry, dropped items, and where a
    printed value is not the run's own results.json value (and why)."""
    notes = []
    for side, to_retry in (("BASE", c.base_to_retry), ("CAND", c.candidate_to_retry)):
        if to_retry:
            notes.append(f"{where}: {side} holds {to_retry} record(s) with a failure of the backend: incomplete; "
                         "rerun its command to retry them")
    if not c.paired:
        notes.append(f"{where}: no item was scored on both sides ({c.base_failed} failed in BASE, "
                     f"{c.candidate_failed} in CAND)")
        return notes
    dropped = f"{c.dropped} of {c.n_items} item(s) dropped, not scored on both sides" if c.dropped else ""
    for side, shown, reported in (("BASE", c.base, c.base_reported), ("CAND", c.candidate, c.candidate_reported)):
        if reported is None or metric.format(shown) == metric.format(reported):
            continue
        why = dropped or "its results.json gives upstream's aggregate, the gate the weighted mean of the items"
        notes.append(f"{where}: {side} is {metric.format(shown)} over the paired items and "
                     f"{metric.format(reported)} in its results.json ({why})")
        dropped = ""
    if dropped:
        notes.append(f"{where}: {dropped}")
    return notes


def write_comparison(result: Comparison, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "compare.json", result.to_json())
    write_text_atomic(out_dir / "compare.md", render_markdown(result))


def load_config(path: Path | None, *, margin: float | None, require_power: bool = False) -> CompareConfig:
    """The config file (if any) with `--margin` on top.

    Raises:
        ConfigError: an unreadable file or an invalid key, naming the file.
    """
    from pydantic import ValidationError

    from harness.config import read_yaml_mapping, validation_problems

    data = read_yaml_mapping(path, what="compare config") if path is not None else {}
    if margin is not None:
        data["margin"] = margin
    if require_power:
        data["require_power"] = True
    try:
        return CompareConfig(**data)
    except ValidationError as exc:
        raise ConfigError(f"{path or '--margin'}: {validation_problems(exc)}") from None


def verdict_lines(result: Comparison, base_run: Path, cand_run: Path, out: Path) -> list[tuple[str, bool]]:
    """What `harness compare` prints, as (line, to stderr): the table; why the runs are not comparable, or the
    cells that could not be gated and the command that shows the changed items side by side."""
    import shlex

    lines = [(render_markdown(result), False)]
    if result.differences:
        return lines + [("error: runs are not comparable: " + "; ".join(result.differences), True)]
    ungated = [f"{c.row} / {c.benchmark} {c.metric} ({c.verdict})" for c in result.cells if c.verdict in UNGATED]
    if ungated:
        shown = "; ".join(ungated[:5]) + (" ..." if len(ungated) > 5 else "")
        lines.append((f"not gated: {len(ungated)} cell(s): {shown}; finish the runs (rerun their commands) and "
                      "compare again", True))
    for why in (result.canary or {}).get("unreached", []):
        lines.append((f"drift canary: not re-asked: {why}", True))
    weak = [f"{c.row} / {c.benchmark} {c.metric} (±{(c.half_width or 0) * 100:.1f} points against a margin of "
            f"{c.margin:g}; {c.items_needed or '-'} items would do)"
            for c in result.cells if c.verdict == "underpowered"]
    if weak:
        shown = "; ".join(weak[:5]) + (" ..." if len(weak) > 5 else "")
        lines.append((f"underpowered: {len(weak)} cell(s) could not have seen a change of their margin: {shown}; "
                      "run more items or seeds" + ("" if result.config.get("require_power") else
                                                   " (--require-power makes this exit 3)"), True))

    figure = panels_of(base_run)
    pairs = ([(Path(base_run) / p, Path(cand_run) / p, out / f"compare-{p}.html") for p in figure["panels"]]
             if figure else [(Path(base_run), Path(cand_run), out / "compare.html")])
    for base, cand, page in pairs:
        drill = shlex.join(["harness", "view", str(base), str(cand), "--out", str(page), "--open"])
        lines.append((f"items that changed, side by side: {drill}", False))
    return lines
