"""`harness compare BASE_RUN CAND_RUN`: the regression gate between two runs of the same table (no model calls).

Matching. Rows are matched by label (so a baseline checkpoint and a candidate checkpoint in one row compare), and
within a row the records by (benchmark, item, repeat); only complete repeats count, as in the reports. Every metric
the benchmark declares (`Benchmark.metrics`) is compared.

Per cell (row, benchmark, metric):
- each item's value is its per-item contribution averaged over the repeats; the run's value is the benchmark's
  aggregate of them (the weighted mean its metric declares: AVG@k of the table);
- the difference candidate - base with a paired percentile bootstrap interval over items (both runs resampled
  with the same items; 1,000 resamples, 95%, seed 0 by default);
- for strict accuracies (per-item values 0/1) McNemar's exact test on the discordant (item, repeat) pairs,
  pooled over repeats and unweighted (repeats of one item are not independent, and a weighted aggregate such
  as RM-Bench's weighs items unequally, so read it as a second opinion; the verdict comes from the interval);
- the verdict, in points on a 0-100 scale (1 point = 0.01 of an accuracy or of an nDCG): *regression* when the
  whole interval lies below -margin (above +margin for a lower-is-better metric), *improvement* when it lies
  beyond +margin the other way, else *no significant change*.

Comparable runs: both are runs of `harness run`/`harness eval` with the same rows, benchmarks, dataset
fingerprints (the items as presented: ids, prompts, responses in A/B order, gold labels) and (item, repeat) sets;
per row, the same evaluator kind and settings except the one under test (`judges.held_fixed`: a rubric
evaluator's generator, a reward model), and every other model (the verifier, a judge) with the same identity
(revision or weights hash). Policy runs (table2/6/8): the row's policy is what changes; the judge (model,
backend options, identity), the judge settings, the generation settings and the loaders' options must agree.
Anything else is reported as a difference, and the gate exits 2.

Judged policy metrics compare their per-item values where both runs judged the item (a failed judgment weighs
0); a metric whose value is a model fit (AlpacaEval's length-controlled win rate) is gated through its per-item
stand-in (the win rate) and not compared itself.

Config (`--config FILE`, YAML): `margin` (points), `margins` (per `BENCHMARK` or `BENCHMARK.METRIC`),
`n_resamples`, `alpha`, `seed`. Outputs: `compare.json` and `compare.md`. Exit code: 1 if any cell regresses, 2 if
the runs are not comparable, else 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from benchmarks import metrics
from benchmarks.scoring import Metric
from harness.errors import ConfigError
from harness.records import EvalRecord
from harness.runstore import Manifest, OutputPaths, RecordLog, write_json_atomic, write_text_atomic
from reports.results import benchmark

Verdict = Literal["regression", "improvement", "no significant change"]
EXIT_OK, EXIT_REGRESSION, EXIT_INCOMPARABLE = 0, 1, 2


class CompareConfig(BaseModel):
    """`harness compare --config FILE`: margins and the bootstrap's settings; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    margin: float = Field(1.0, ge=0, description="Points (0-100 scale) a change must clear to count.")
    margins: dict[str, float] = Field(default_factory=dict, description="Per BENCHMARK or BENCHMARK.METRIC.")
    n_resamples: int = Field(1000, ge=100)
    alpha: float = Field(0.05, gt=0, lt=1, description="Two-sided: the interval covers 1 - alpha.")
    seed: int = 0

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
    """One (row, benchmark, metric) comparison."""

    row: str
    benchmark: str
    metric: str
    base: float
    """Base run's value (unscaled: a fraction for accuracies)."""
    candidate: float
    diff: float
    """candidate - base."""
    ci_low: float
    ci_high: float
    """Paired bootstrap interval of `diff`."""
    margin: float
    """In points (0-100 scale)."""
    verdict: Verdict
    n_items: int
    repeats: int
    base_failed: int
    candidate_failed: int
    """Records that could not be scored (over all repeats)."""
    mcnemar: dict[str, Any] | None = None
    """For strict accuracies: `base_only` (right in base only), `candidate_only`, `p` (exact, two-sided)."""


@dataclass(slots=True)
class Comparison:
    """The gate's result: cells, differences that make the runs incomparable, the exit code."""

    base: str
    candidate: str
    config: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not self.differences

    @property
    def exit_code(self) -> int:
        if self.differences:
            return EXIT_INCOMPARABLE
        return EXIT_REGRESSION if any(c.verdict == "regression" for c in self.cells) else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "candidate": self.candidate,
            "comparable": self.comparable,
            "differences": self.differences,
            "exit_code": self.exit_code,
            "regressions": sum(c.verdict == "regression" for c in self.cells),
            "improvements": sum(c.verdict == "improvement" for c in self.cells),
            "config": self.config,
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
    return "regression" if worse else "improvement" if better else "no significant change"


def compare_cell(
    label: str, bench: str, metric: Metric, base: Mapping, cand: Mapping, cfg: CompareConfig
) -> Cell:
    """One cell from the two runs' records keyed by (item, repeat) (the same keys on both sides)."""
    keys = sorted(base)
    items = sorted({item for item, _ in keys})
    repeats = sorted({repeat for _, repeat in keys})
    b_val = {k: metric.per_item(base[k]) for k in keys}
    c_val = {k: metric.per_item(cand[k]) for k in keys}
    b_items = np.array([np.mean([b_val[(i, r)] for r in repeats]) for i in items])
    c_items = np.array([np.mean([c_val[(i, r)] for r in repeats]) for i in items])
    weights = metric.item_weights([base[(i, repeats[0])] for i in items])
    c_weights = metric.item_weights([cand[(i, repeats[0])] for i in items])
    if weights is not None and c_weights is not None:
        # Judged policy metrics weigh a failed judgment 0: an item counts where both runs could judge it.
        weights = np.where(c_weights > 0, weights, 0.0)
    b_agg, c_agg = metrics.weighted_mean(b_items, weights), metrics.weighted_mean(c_items, weights)
    lo, hi = metrics.paired_bootstrap_ci(
        b_items, c_items, weights=weights, n_resamples=cfg.n_resamples, alpha=cfg.alpha, seed=cfg.seed
    )
    margin = cfg.margin_for(bench, metric.name)
    test = None
    if metric.binary:
        base_only = sum(b_val[k] > c_val[k] for k in keys)
        cand_only = sum(c_val[k] > b_val[k] for k in keys)
        test = {"base_only": base_only, "candidate_only": cand_only, "p": metrics.mcnemar_exact(base_only, cand_only)}
    return Cell(
        row=label,
        benchmark=bench,
        metric=metric.name,
        base=b_agg,
        candidate=c_agg,
        diff=c_agg - b_agg,
        ci_low=lo,
        ci_high=hi,
        margin=margin,
        verdict=_verdict(lo, hi, margin, metric.higher_is_better),
        n_items=len(items),
        repeats=len(repeats),
        base_failed=sum(metric.failed(r) for r in base.values()),
        candidate_failed=sum(metric.failed(r) for r in cand.values()),
        mcnemar=test,
    )


def compare_runs(base_dir: Path, cand_dir: Path, cfg: CompareConfig | None = None) -> Comparison:
    """Compare two run directories (see the module docstring); never raises for incomparable runs, it says why.

    Raises:
        ConfigError: a path that holds no run.
    """
    cfg = cfg or CompareConfig()
    base, cand = read_run(base_dir, "BASE_RUN"), read_run(cand_dir, "CAND_RUN")
    result = Comparison(str(base.path), str(cand.path), cfg.model_dump(), differences=_differences(base, cand))
    b_cells, c_cells = _complete(base.records), _complete(cand.records)
    for label in [r for r in base.rows if r in cand.rows]:
        b_spec, c_spec = base.rows[label], cand.rows[label]
        benches = sorted({b for s, b in b_cells if s == b_spec} | {b for s, b in c_cells if s == c_spec})
        for bench in benches:
            b, c = b_cells.get((b_spec, bench), {}), c_cells.get((c_spec, bench), {})
            problems = _key_differences(label, bench, b, c)
            if problems:
                result.differences += problems
                continue
            for metric in benchmark(bench).metrics:
                if not metric.gated:
                    continue
                b_in = {k: r for k, r in b.items() if metric.applies is None or metric.applies(r)}
                c_in = {k: r for k, r in c.items() if k in b_in}
                if not b_in:
                    continue
                weights = metric.item_weights(list(b_in.values()))
                if weights is not None and not weights.sum() > 0:
                    continue  # nothing judged in BASE: no value to compare
                result.cells.append(compare_cell(label, bench, metric, b_in, c_in, cfg))
    return result


def render_markdown(result: Comparison) -> str:
    lines = [f"### Comparison: {result.candidate} against {result.base}", ""]
    if result.differences:
        lines += ["**Not comparable** (exit 2):", ""] + [f"- {d}" for d in result.differences] + [""]
    regressions = [c for c in result.cells if c.verdict == "regression"]
    lines.append(
        f"{len(result.cells)} cells: {len(regressions)} regressions, "
        f"{sum(c.verdict == 'improvement' for c in result.cells)} improvements; exit code {result.exit_code}."
    )
    lines += [
        "",
        "| Row | Benchmark | Metric | Base | Cand | Diff (points) | 95% CI (points) | Margin | McNemar p | Verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.cells:
        bench = benchmark(c.benchmark)
        metric = next(m for m in bench.metrics if m.name == c.metric)
        p = f"{c.mcnemar['p']:.3g} ({c.mcnemar['base_only']}/{c.mcnemar['candidate_only']})" if c.mcnemar else "-"
        verdict = f"**{c.verdict}**" if c.verdict != "no significant change" else c.verdict
        lines.append(
            f"| {c.row} | {bench.display} | {metric.display} | {metric.format(c.base)} | "
            f"{metric.format(c.candidate)} | {c.diff * 100:+.2f} | [{c.ci_low * 100:+.2f}, {c.ci_high * 100:+.2f}] | "
            f"{c.margin:g} | {p} | {verdict} |"
        )
    cfg = result.config
    lines += [
        "",
        f"Paired bootstrap over items ({cfg['n_resamples']} resamples, {1 - cfg['alpha']:.0%}, seed {cfg['seed']}); "
        "repeats averaged per item first. Points: differences x 100 (accuracy points; nDCG x 100). McNemar: exact "
        "two-sided, discordant (item, repeat) pairs as base-only/candidate-only right.",
    ]
    return "\n".join(lines) + "\n"


def write_comparison(result: Comparison, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "compare.json", result.to_json())
    write_text_atomic(out_dir / "compare.md", render_markdown(result))


def load_config(path: Path | None, *, margin: float | None) -> CompareConfig:
    """The config file (if any) with `--margin` on top.

    Raises:
        ConfigError: an unreadable file or an invalid key, naming the file.
    """
    import yaml
    from pydantic import ValidationError

    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read the compare config: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a compare config is a mapping (margin, margins, n_resamples, alpha, seed)")
    if margin is not None:
        data["margin"] = margin
    try:
        return CompareConfig(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{path or '--margin'}: {where}: {err['msg']}") from None
