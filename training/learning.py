"""Learning, shown: trained runs against control runs on the held-out split, in one command.

`harness train generator|policy --config FILE --eval-every K --seeds N --control` trains the job N times (seeds
`grpo.seed` + 0..N-1) into `OUTPUT/seed<S>/` and, with `--control`, once more per seed with learning rate 0 into
`OUTPUT/seed<S>-control/`: the same data, sets, batches and held-out samples (the evaluation draws from a random
stream seeded by the seed and the step: `training.trainer`), every step taken, nothing moved. Each run evaluates
the held-out split at step 0, every K steps and at the end (`training.fit`). `summarise` reads the runs' logs and
writes `OUTPUT/learning.json` and `OUTPUT/learning.png` (`training.plots.plot_learning`):

- per metric (generator: held-out discriminability `disc_mean` and anchor order accuracy `anchor_pair_acc`;
  policy: the mean rubric score `reward_mean`) and arm, the mean over seeds at each evaluated step and the
  lowest and highest seed;
- for the first metric (the headline): each trained seed's rise (end minus step 0), the control's spread (the
  largest distance of any control evaluation from its own step 0, over every step and seed: what sampling noise
  alone moves the number by), and whether every trained seed rose by more than that spread. A run whose held-out
  evaluation scored nothing (no rubric parsed, say) leaves the verdict open, and the verdict says which arm and
  seeds, at which steps, with their parse rate and unscored counts.

The held-out split is only measured, never tuned on: its rows are the last `data.heldout` rows that pass the
rules, after the training rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import ConfigError
from training.grpo import TrainConfig

log = logging.getLogger("harness.train")
METRICS = {"generator": ("disc_mean", "anchor_pair_acc"), "policy": ("reward_mean",)}
"""The held-out metrics compared, per kind; the first is the headline."""


def plan_runs(config: TrainConfig, *, seeds: int, control: bool) -> list[tuple[str, int, TrainConfig]]:
    """(arm, seed, config) of every run: `trained` per seed, then `control` (learning rate 0) per seed.

    Raises:
        ConfigError: when the config evaluates nothing (no `eval_every` or no `data.heldout`).
    """
    if config.eval_every is None or not config.data.heldout:
        raise ConfigError("a learning comparison (--seeds, --control) needs --eval-every K and data.heldout > 0")
    out = Path(config.output_dir)
    runs = []
    for arm in ("trained", "control") if control else ("trained",):
        for i in range(seeds):
            seed = config.grpo.seed + i
            grpo = config.grpo.model_copy(update={"seed": seed, **({"learning_rate": 0.0} if arm == "control"
                                                                   else {})})
            name = f"seed{seed}" + ("-control" if arm == "control" else "")
            runs.append((arm, seed, config.model_copy(update={"grpo": grpo, "output_dir": out / name})))
    return runs


def compare(kind: str, config: TrainConfig, *, seeds: int, control: bool, overwrite: bool = False,
            report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Check every run, train them in turn (finished ones of the same settings are kept), and write
    `learning.json` and `learning.png` into `config.output_dir` (main process); returns the summary.

    Raises:
        ConfigError: as `training.job.prepare` and `run` do, naming the run.
    """
    from training import ranks
    from training.job import prepare, run

    runs = plan_runs(config, seeds=seeds, control=control)
    jobs = []
    for arm, seed, job_config in runs:
        try:
            jobs.append((arm, seed, prepare(kind, job_config)))  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"{arm} run, seed {seed}: {exc}") from None
    for arm, seed, job in jobs:
        run(job, overwrite=overwrite)
        if report is not None and ranks.current().main:
            report(f"{arm} seed {seed}: {job.config.output_dir}")
    logs = {(arm, seed): Path(job.config.output_dir) / "train_log.jsonl" for arm, seed, job in jobs}
    summary = summarise(kind, logs, learning_rate={"trained": config.grpo.learning_rate, "control": 0.0},
                        title=f"{kind} {config.model}, eval every {config.eval_every} steps, "
                              f"{config.data.heldout} held-out rows")
    if ranks.current().main:
        write(summary, Path(config.output_dir))
    ranks.barrier()
    return summary


def summarise(kind: str, logs: Mapping[tuple[str, int], Path], *, learning_rate: Mapping[str, float],
              title: str = "") -> dict[str, Any]:
    """The held-out curves of the runs whose logs `logs` names ((arm, seed) -> train_log.jsonl), with the verdict
    on the headline metric (see the module docstring).

    Raises:
        ConfigError: for a missing or malformed log (`training.plots.read_log`).
    """
    from training.plots import read_log, series

    read = {key: read_log(path) for key, path in logs.items()}
    headline = METRICS[kind][0]
    metrics: dict[str, dict[str, Any]] = {}
    for metric in METRICS[kind]:
        metrics[metric] = {}
        for arm in ("trained", "control"):
            by_seed = {}
            for (found_arm, seed), lines in read.items():
                if found_arm == arm:
                    steps, values = series(lines, f"eval_dr/{metric}")
                    if steps:  # a run none of whose held-out rubrics could be scored has no value to show
                        by_seed[seed] = dict(zip(steps, values))
            curve = _curve(by_seed) if by_seed else None
            if curve is not None and curve["steps"]:
                metrics[metric][arm] = curve
    evaluated: dict[str, dict[int, dict[str, Any]]] = {"trained": {}, "control": {}}
    for (arm, seed), lines in read.items():
        found = _evaluations(lines)
        if found is not None and arm in evaluated:
            evaluated[arm][seed] = found
    return {"kind": kind, "title": title, "learning_rate": dict(learning_rate), "metrics": metrics,
            "headline": headline, "verdict": verdict(metrics[headline], evaluated=evaluated)}


def _curve(by_seed: Mapping[int, Mapping[int, float]]) -> dict[str, Any]:
    """Mean, min and max over seeds at each step every seed evaluated."""
    steps = sorted(set.intersection(*(set(v) for v in by_seed.values())))
    table = np.array([[by_seed[s][t] for t in steps] for s in sorted(by_seed)], dtype=float).reshape(len(by_seed), -1)
    return {"steps": steps, "seeds": sorted(by_seed), "mean": table.mean(axis=0).tolist(),
            "min": table.min(axis=0).tolist(), "max": table.max(axis=0).tolist(),
            "by_seed": {str(s): [by_seed[s][t] for t in steps] for s in sorted(by_seed)}}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _evaluations(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What one run's held-out evaluations did, from its log's `eval_dr/*` lines: the steps evaluated, their
    parse rates and the responses they left unscored, by cause (None: the log holds no evaluation)."""
    found = [line for line in lines if any(str(k).startswith("eval_dr/") for k in line)]
    if not found:
        return None

    def total(key: str) -> float:
        return sum(line[key] for line in found if _number(line.get(key)))

    return {"steps": [line["step"] for line in found],
            "parse_rates": [line["eval_dr/parse_rate"] for line in found if _number(line.get("eval_dr/parse_rate"))],
            "unscored_parse": total("eval_dr/unscored_parse"), "unscored_verify": total("eval_dr/unscored_verify")}


def _scored_nothing(arm: str, runs: Mapping[int, Mapping[str, Any]]) -> str:
    """The verdict's words for `arm`'s runs (seed -> `_evaluations`) whose held-out evaluations gave no number."""
    steps = sorted({t for found in runs.values() for t in found["steps"]})
    rates = sorted({round(r, 4) for found in runs.values() for r in found["parse_rates"]})
    rate = "-" if not rates else str(rates[0]) if len(rates) == 1 else f"{rates[0]} to {rates[-1]}"
    parse = round(sum(found["unscored_parse"] for found in runs.values()))
    verify = round(sum(found["unscored_verify"] for found in runs.values()))
    seeds = ("seeds " if len(runs) > 1 else "seed ") + ", ".join(str(s) for s in sorted(runs))
    return (f"the {arm} runs' held-out evaluation ({seeds}) ran at steps {', '.join(map(str, steps))} but scored "
            f"nothing: parse rate {rate}, {parse} unscored (parse), {verify} unscored (verify)")


def verdict(curves: Mapping[str, Any], *, evaluated: Mapping[str, Mapping[int, Mapping[str, Any]]] | None = None
            ) -> dict[str, Any]:
    """Each trained seed's rise (last minus first evaluation), the control's spread (the largest distance of any
    control evaluation from the same seed's first one), and whether every trained seed rose by more.

    `evaluated`: arm -> seed -> what that run's held-out evaluations did (`_evaluations`). A run that evaluated
    but scored nothing leaves the verdict open (`rises` None), and `why` says so with its parse rate and unscored
    counts; so does a trained run with no evaluation at all, or no control run."""
    evaluated = evaluated or {}

    def blank(arm: str) -> dict[int, Mapping[str, Any]]:
        """`arm`'s runs that evaluated but have no value on the curve."""
        shown = set((curves.get(arm) or {}).get("seeds") or ())
        return {seed: found for seed, found in (evaluated.get(arm) or {}).items() if seed not in shown}

    trained = curves.get("trained")
    if not trained or not trained["steps"]:
        silent = blank("trained")
        return {"rises": None, "why": _scored_nothing("trained", silent) if silent
                else "no held-out evaluation in the trained runs' logs"}
    rise = {seed: values[-1] - values[0] for seed, values in trained["by_seed"].items()}
    out: dict[str, Any] = {"start_mean": trained["mean"][0], "end_mean": trained["mean"][-1],
                           "end_seed_spread": trained["max"][-1] - trained["min"][-1], "trained_rise": rise}
    for arm in ("trained", "control"):
        silent = blank(arm)
        if silent:
            return {**out, "rises": None, "why": _scored_nothing(arm, silent)}
    control = curves.get("control")
    if not control or not control["steps"]:
        return {**out, "rises": None, "why": "no control run"}
    spread = max(abs(v - values[0]) for values in control["by_seed"].values() for v in values)
    out.update(control_start_mean=control["mean"][0], control_end_mean=control["mean"][-1],
               control_rise={seed: values[-1] - values[0] for seed, values in control["by_seed"].items()},
               control_spread=spread, rises=min(rise.values()) > spread)
    return out


def write(summary: Mapping[str, Any], out: Path) -> tuple[Path, Path | None]:
    """`learning.json` and (where matplotlib is installed) `learning.png` in `out`."""
    from harness.runstore import write_json_atomic
    from training.plots import plot_learning

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "learning.json", dict(summary))
    try:
        png = plot_learning(summary, out / "learning.png")
    except ConfigError as exc:
        log.warning("no learning figure: %s", exc)
        png = None
    return out / "learning.json", png


def lines(summary: Mapping[str, Any]) -> list[str]:
    """The comparison in words, for the terminal and the log."""
    out = []
    for metric, arms in summary["metrics"].items():
        for arm, curve in arms.items():
            shown = ", ".join(f"step {t}: {m:.4f} [{lo:.4f}, {hi:.4f}]"
                              for t, m, lo, hi in zip(curve["steps"], curve["mean"], curve["min"], curve["max"]))
            out.append(f"held-out {metric}, {arm} (mean [min, max] over seeds {curve['seeds']}): {shown}")
    v = summary["verdict"]
    if v.get("rises") is None:
        out.append(f"verdict: {v.get('why')}")
    else:
        rises = ", ".join(f"seed {s} {r:+.4f}" for s, r in v["trained_rise"].items())
        out.append(f"{summary['headline']}: trained rise {rises}; control spread {v['control_spread']:.4f}; "
                   f"{'rises beyond the control' if v['rises'] else 'does NOT rise beyond the control'}")
    return out
