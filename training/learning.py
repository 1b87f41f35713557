"""Does training learn? Trained runs against a shuffled-reward control, paired over fixed held-out prompts.

`harness train generator|policy --config FILE --eval-every K --seeds N --control shuffled` runs, per seed `S`
(`grpo.seed` + 0..N-1), each in a child process of its own (`compare`):

- **trained**: the job, into `OUTPUT/seed<S>/`;
- **shuffled** (`--control shuffled`): the same job at the same learning rate with each training batch's rewards
  permuted before the advantages (`training.rewards.ShuffledReward`), into `OUTPUT/seed<S>-shuffled/`: the same
  data, batches and step sizes, no signal from the reward; what it moves by is drift;
- **lr0** (`--control lr0`, with `shuffled`: `--control shuffled,lr0`): the same job at learning rate 0, into
  `OUTPUT/seed<S>-lr0/`: the loop runs, the weights never move. Its evaluations must equal the base arm's prompt by
  prompt (`replay`): the check that the base arm replays what a run that does not update would have measured;
- **base**: the starting weights evaluated, no step taken, on the evaluation stream of every step the runs
  evaluated (`training.job.evaluate_base`; the same held-out prompts and sampling seeds as the runs' evaluation at
  that step: `training.trainer`), into `OUTPUT/seed<S>-base/`. Not a training run. Step 0's stream is not
  evaluated again: the trained run's step-0 evaluation is the base weights on it, and its lines are copied.

Every run evaluates the held-out split at step 0, every K steps and at the end (`training.fit`), and keeps one line
per prompt and evaluation in `eval_scores.jsonl` (`training.heldout`). A policy's held-out prompts are scored
against **fixed rubrics**: one per prompt, generated once from the base policy's completions (the step-0
evaluation) and only verified afterwards; the controls and the base evaluation reuse the trained run's file
(`heldout_rubrics.jsonl`). The number of completions per held-out prompt is TRL's `num_generations_eval`
(`grpo.extra`). A generator's held-out score is the mean discriminability reward of its rubrics for the prompt.
With `data.eval_train: N` the first N training prompts are evaluated the same way (split `seen`), and the same
paired difference is reported for them (`paired_seen`): whether the policy climbs its own objective on prompts it
trains on, apart from whether that carries over to prompts it never saw. The verdict reads the held-out split only.

**The rule (pre-registered).** Per seed and held-out prompt `p`: `gain_p = score_p(trained, end) - score_p(base,
end's stream)`, `gain'_p` the same for the shuffled run, and the paired difference `d_p = gain_p - gain'_p`. The
job *learned* when, for every trained seed, the 95% paired bootstrap interval of the mean of `d` over the prompts
(`paired_bootstrap`: prompts resampled with replacement, percentile interval) lies above 0. A prompt unscored in any
of the four numbers is left out of that seed's pairs and counted (`n_dropped`). Without the shuffled control, or with
a seed none of whose prompts pairs up, or with arms that ran different code (each arm's commit is read from its
manifest, `code`), the verdict stays open (`learned` None) and `why` says so. (When the trained and shuffled runs
end at the same step, as they do, the base terms are the same stream and cancel in `d`; they are kept so that
`gain` alone reads as the rise over the base weights.)

**Power** (`power`): the rule passes a seed when its interval's lower end is above 0, a one-sided test at 2.5%; at a
true mean difference `delta` a seed passes with probability about `Phi(delta / se - 1.96)`, `se` the standard error
of its mean `d` (SD over the prompts / sqrt(n)). Per seed the minimum detectable effect at 80% power is
`(1.96 + 0.84) se`; requiring every seed to pass multiplies the seeds' probabilities, so the all-seeds effect at
80% (`all_seeds`) is larger: two seeds at 80% each pass together 64% of the time.

`OUTPUT/learning.json` (`summarise`, `write`) holds per arm the held-out curves (mean over prompts, then mean, min and max
over seeds, at each evaluated step), per seed the mean and interval of `d` (and of each gain), the verdict, each
run's `dr/length_corr` (the correlation of completion length with the training reward, over its steps: a length
hack shows as a rising one) and the peak resident memory (`peak_rss_mib`: each run's own, this process's while
the runs ran, and the most the comparison held at once, a run's peak plus this process beside it; the checks run
in a child too, so this process never imports torch); `OUTPUT/learning.png` draws the curves with their bands and
the intervals (`training.plots.plot_learning`).

`noise_pilot` measures what the rule has to beat when nothing learns: the base weights evaluated on two steps'
streams against one set of fixed rubrics (`OUTPUT/noise-pilot/noise.json`: the per-prompt differences' mean,
interval and spread, and the wall time).

The held-out split is only measured, never tuned on: its rows are the last `data.heldout` rows that pass the
rules, after the training rows. Under `accelerate launch` a comparison is refused: each of its runs is a process
of its own; launch the runs one at a time instead.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from harness.errors import ConfigError, HarnessError
from training.grpo import TrainConfig

log = logging.getLogger("harness.train")
Control = Literal["shuffled", "lr0"]
CONTROLS = ("shuffled", "lr0")
ARMS = ("trained", "shuffled", "lr0", "base")
LEVEL = 0.95
POWER = 0.8
"""The power the minimum detectable effects are stated at."""
ROUNDS = 10_000
"""Bootstrap resamples of the prompts."""


@dataclass(frozen=True, slots=True)
class Run:
    """One training run of a comparison."""

    arm: Literal["trained", "shuffled", "lr0"]
    seed: int
    config: TrainConfig


def parse_controls(control: str | None) -> tuple[str, ...]:
    """`--control shuffled,lr0` as its controls, in `CONTROLS` order.

    Raises:
        ConfigError: for a control that is not one of `CONTROLS`, or `lr0` without `shuffled` (the rule needs it).
    """
    if control is None:
        return ()
    given = {c.strip() for c in control.split(",") if c.strip()}
    unknown = sorted(given - set(CONTROLS))
    if unknown or not given:
        raise ConfigError(f"--control {control}: expected {', '.join(CONTROLS)} or both, comma-separated")
    if "shuffled" not in given:
        raise ConfigError("--control lr0: the rule compares the trained run with the shuffled control; "
                          "write --control shuffled,lr0")
    return tuple(c for c in CONTROLS if c in given)


def plan_runs(config: TrainConfig, *, seeds: int, control: str | None) -> list[Run]:
    """Every training run: `trained` per seed, then each control's (`shuffled`, `lr0`) per seed.

    Raises:
        ConfigError: for an unknown control (`parse_controls`), or a config that evaluates nothing (no
            `eval_every` or no `data.heldout`).
    """
    controls = parse_controls(control)
    if config.eval_every is None or not config.data.heldout:
        raise ConfigError("a learning comparison (--seeds, --control) needs --eval-every K and data.heldout > 0")
    from training.heldout import RUBRICS

    out = Path(config.output_dir)
    runs = []
    for arm in ("trained", *controls):
        for i in range(seeds):
            seed = config.grpo.seed + i
            update: dict[str, Any] = {"seed": seed}
            if arm == "lr0":
                update["learning_rate"] = 0.0
            grpo = config.grpo.model_copy(update=update)
            rubrics = out / run_name("trained", seed) / RUBRICS if arm != "trained" else config.heldout_rubrics
            runs.append(Run(arm, seed, config.model_copy(update={  # type: ignore[arg-type]
                "grpo": grpo, "output_dir": out / run_name(arm, seed), "shuffle_rewards": arm == "shuffled",
                "heldout_rubrics": rubrics})))
    return runs


def run_name(arm: str, seed: int) -> str:
    """The dir of `arm`'s run of `seed` in the comparison's output dir."""
    return f"seed{seed}" if arm == "trained" else f"seed{seed}-{arm}"


def compare(kind: str, config: TrainConfig, *, seeds: int, control: str | None, overwrite: bool = False,
            report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Check every run, then per seed train it and its control and evaluate the base weights, each in a child
    process (finished runs of the same settings are kept), and write `learning.json` and `learning.png` into
    `config.output_dir`; returns the summary.

    Raises:
        ConfigError: as `training.job.prepare` and `run` do, naming the run; under several processes.
        HarnessError: when a child process fails otherwise.
    """
    from training import ranks
    from training.heldout import RUBRICS, SCORES, read_eval_scores
    from training.job import copy_rubrics

    if ranks.current().world > 1:
        raise ConfigError("a learning comparison runs each run in a process of its own: start it without "
                          "accelerate launch (or launch its runs one at a time)")
    runs = plan_runs(config, seeds=seeds, control=control)
    # Every run is checked before any trains, in a child too: this process never imports torch or TRL, so the
    # comparison holds one run's memory and little more.
    in_child(_prepare_all, kind, runs)
    say = report or (lambda line: None)
    out = Path(config.output_dir)
    memory: dict[str, dict[str, float]] = {}
    dirs: dict[tuple[str, int], Path] = {}
    for seed in sorted({run.seed for run in runs}):
        trained = next(r for r in runs if r.seed == seed and r.arm == "trained")
        for run in [r for r in runs if r.seed == seed]:
            where = Path(run.config.output_dir)
            kept = not overwrite and _finished(where)
            measured = _measured(_train_one, kind, run.config, overwrite)  # a kept run's settings are checked
            dirs[(run.arm, seed)] = where
            if kept:  # its child only checked it: that process's memory is not the run's
                say(f"{run.arm} seed {seed}: {where} finished before; kept")
                continue
            memory[where.name] = measured
            say(f"{run.arm} seed {seed}: {where} (peak RSS {memory[where.name]['child']:.0f} MiB)")
        steps = sorted({step for arm in ("trained", *CONTROLS) if (arm, seed) in dirs
                        for step in read_eval_scores(dirs[(arm, seed)] / SCORES)})
        base = out / run_name("base", seed)
        dirs[("base", seed)] = base
        if not overwrite and (base / SCORES).is_file() and set(steps) <= set(read_eval_scores(base / SCORES)):
            say(f"base seed {seed}: {base} holds every step's evaluation; kept")
            continue
        copy_rubrics(Path(trained.config.output_dir) / RUBRICS, base)  # the trained run's fixed rubrics
        # Step 0's stream the trained run evaluated with the base weights already: its lines are the base's.
        later = [t for t in steps if t != 0]
        if later:
            memory[base.name] = _measured(_evaluate_base, kind, trained.config, later, base)
        else:
            (base / SCORES).unlink(missing_ok=True)
        _copy_step(Path(trained.config.output_dir) / SCORES, base / SCORES, step=0)
        _write_base_manifest(base, steps)
        say(f"base seed {seed}: {base}, steps {', '.join(map(str, steps))} (step 0: the trained run's)"
            + (f" (peak RSS {memory[base.name]['child']:.0f} MiB)" if later else ""))
    summary = summarise(kind, dirs, learning_rate=config.grpo.learning_rate, memory=_memory(memory),
                        title=f"{kind} {config.model}, eval every {config.eval_every} steps, "
                              f"{config.data.heldout} held-out prompts")
    write(summary, out)
    return summary


def _copy_step(source: Path, target: Path, *, step: int) -> None:
    """Append `source`'s per-prompt score lines of `step` to `target`."""
    import json

    found = [line for line in source.read_text(encoding="utf-8").splitlines() if json.loads(line)["step"] == step]
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in found))


BASE_MANIFEST = "base_manifest.json"
"""A base arm's record: the steps whose streams it evaluated and the code it ran (`harness.runstore.git_commit`)."""


def _write_base_manifest(base: Path, steps: Sequence[int]) -> None:
    from harness.runstore import git_commit, write_json_atomic

    write_json_atomic(base / BASE_MANIFEST, {"steps": list(steps), "git": git_commit()})


def code_version(arm: str, where: Path) -> dict[str, Any] | None:
    """The code an arm ran: its manifest's `git` (`{"commit", "dirty"}`; a training run's `dr_manifest.json`, the
    base arm's `base_manifest.json`), or None where it records none (outside a git checkout, or a run from before
    this was recorded)."""
    from training.checkpoint import MANIFEST

    try:
        found = json.loads((Path(where) / (BASE_MANIFEST if arm == "base" else MANIFEST)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    git = found.get("git") if isinstance(found, dict) else None
    return git if isinstance(git, dict) and git.get("commit") else None


def _rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory in MiB: now (`VmRSS`) or at its peak (`VmHWM`), from `/proc/self/status`
    (Linux; these are the process's own since its exec, where `getrusage`'s peak also counts the process it was
    forked from); elsewhere `getrusage`'s peak."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measured(target: Callable[..., None], *args: Any) -> dict[str, float]:
    """`in_child(target, *args)` with the memory held meanwhile: the child's peak and this process's resident
    memory while it waited (it allocates nothing then)."""
    parent = _rss_mib()
    return {"child": in_child(target, *args), "parent": parent}


def _finished(out: Path) -> bool:
    """Whether `out` holds a finished run (its manifest says so); a rerun keeps it."""
    try:
        from training.checkpoint import MANIFEST

        return json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("status") == "finished"
    except (OSError, ValueError):
        return False


def _memory(measured: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Peak resident memory in MiB: each child's, this process's while each ran, the most held at once (a child's
    peak plus this process beside it), and that against the largest run alone."""
    runs = {name: m["child"] for name, m in measured.items()}
    largest = max(runs.values(), default=0.0)
    together = max((m["child"] + m["parent"] for m in measured.values()), default=0.0)
    return {"runs": runs, "parent_while_running": max((m["parent"] for m in measured.values()), default=0.0),
            "parent_peak": _rss_mib("VmHWM"), "largest_run": largest,
            "comparison": together, "comparison_over_largest_run": together / largest if largest else None}


def in_child(target: Callable[..., None], *args: Any) -> float:
    """Run `target(*args)` in a fresh (spawned) process and wait for it; returns the child's peak resident memory in
    MiB. Every model it loads is gone with it, so runs in turn never hold more than one run's memory.

    Raises:
        ConfigError: re-raised from the child, with its message.
        HarnessError: when the child fails otherwise (its exception's type and message), or dies.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, target, args))
    child.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:
        result = None
    child.join()
    if result is None:
        raise HarnessError(f"the comparison's child process {child.pid} died (exit code {child.exitcode})")
    if "error" in result:
        kind, message = result["error"]
        raise (ConfigError(message) if kind == "ConfigError" else HarnessError(f"{kind}: {message}"))
    return result["peak_rss_mib"]


def _child(send: Any, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    try:
        target(*args)
    except Exception as exc:  # noqa: BLE001 - any failure goes to the parent, which re-raises it
        send.send({"error": (type(exc).__name__, str(exc))})
    else:
        send.send({"peak_rss_mib": _rss_mib("VmHWM")})
    finally:
        send.close()


def _prepare_all(kind: str, runs: Sequence[Run]) -> None:
    from training.job import prepare

    for run in runs:
        try:
            prepare(kind, run.config)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"{run.arm} run, seed {run.seed}: {exc}") from None


def _train_one(kind: str, config: TrainConfig, overwrite: bool) -> None:
    from training.job import prepare, run

    run(prepare(kind, config), overwrite=overwrite)  # type: ignore[arg-type]


def _evaluate_base(kind: str, config: TrainConfig, steps: list[int], out: Path) -> None:
    from training.job import evaluate_base, prepare

    evaluate_base(prepare(kind, config), steps=steps, out=out,  # type: ignore[arg-type]
                  sets_from=Path(config.output_dir))


def noise_pilot(kind: str, config: TrainConfig, *, steps: Sequence[int] = (0, 1)) -> dict[str, Any]:
    """The evaluation's own noise: the base weights evaluated (in a child process) on the streams of two steps,
    into `OUTPUT/noise-pilot/`, scored against one set of fixed rubrics (made at the first). Returns the per-prompt
    differences' mean and 95% paired bootstrap interval, their standard deviation, each stream's mean score, the
    prompts paired and the wall time: what the rule's interval has to beat when nothing learned.

    Raises:
        ConfigError: for a config that evaluates nothing, or as the base evaluation does.
    """
    import time

    from training.heldout import read_eval_scores

    if not config.data.heldout:
        raise ConfigError("the noise pilot evaluates the held-out split: set data.heldout > 0")
    first, second = steps
    out = Path(config.output_dir) / "noise-pilot"
    started = time.perf_counter()
    peak = in_child(_evaluate_base, kind, config.model_copy(update={"eval_every": config.eval_every or 1}),
                    [first, second], out)
    scores = read_eval_scores(out / "eval_scores.jsonl")
    d = [scores[second][row] - s for row, s in scores[first].items()  # type: ignore[operator]
         if s is not None and scores[second].get(row) is not None]
    found: dict[str, Any] = {"steps": [first, second], "n_prompts": len(d), "n_dropped": len(scores[first]) - len(d),
                             "stream_means": [_mean(scores[t].values()) for t in (first, second)],
                             "wall_seconds": time.perf_counter() - started, "peak_rss_mib": peak}
    if d:
        mean, low, high = paired_bootstrap(d)
        found.update(mean=mean, low=low, high=high, sd=float(np.std(d, ddof=1)) if len(d) > 1 else 0.0)
    from harness.runstore import write_json_atomic

    write_json_atomic(out / "noise.json", found)
    return found


def paired_bootstrap(differences: Sequence[float], *, rounds: int = ROUNDS, level: float = LEVEL,
                     seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of paired differences: the mean over the prompts and its percentile bootstrap interval
    (`rounds` resamples of the prompts with replacement, drawn by `numpy.random.default_rng(seed)`; the interval
    is the `(1 - level) / 2` and `(1 + level) / 2` quantiles of the resampled means, numpy's linear quantile).

    Raises:
        ValueError: for no differences.
    """
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or not len(d):
        raise ValueError("a paired bootstrap needs at least one difference")
    index = np.random.default_rng(seed).integers(0, len(d), size=(rounds, len(d)))
    means = d[index].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(d.mean()), float(low), float(high)


def summarise(kind: str, dirs: Mapping[tuple[str, int], Path], *, learning_rate: float,
              memory: Mapping[str, Any] | None = None, title: str = "") -> dict[str, Any]:
    """The comparison of the runs in `dirs` ((arm, seed) -> dir holding `eval_scores.jsonl` and, for training
    runs, `train_log.jsonl`), with the verdict of the module docstring's rule.

    Raises:
        ConfigError: for a missing or malformed per-prompt score file or log.
    """
    from training.heldout import read_eval_scores
    from training.plots import read_log, series

    scores = {key: read_eval_scores(Path(d) / "eval_scores.jsonl") for key, d in dirs.items()}
    seen = {key: read_eval_scores(Path(d) / "eval_scores.jsonl", split="seen") for key, d in dirs.items()}
    seeds = sorted(seed for arm, seed in dirs if arm == "trained")
    paired = {str(seed): _paired(scores, seed) for seed in seeds}
    logged: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for (arm, seed), d in sorted(dirs.items()):
        if arm != "base" and (Path(d) / "train_log.jsonl").is_file():
            lines = read_log(Path(d) / "train_log.jsonl")
            for name, key in (("length_corr", "dr/length_corr"), ("clipped", "completions/clipped_ratio"),
                              ("eval_clipped", "eval_completions/clipped_ratio")):
                _, values = series(lines, key)
                logged.setdefault(name, {}).setdefault(arm, {})[str(seed)] = {
                    "mean": float(np.mean(values)) if values else None, "last": values[-1] if values else None,
                    "steps": len(values)}
    code = {f"{arm} seed {seed}": code_version(arm, d) for (arm, seed), d in sorted(dirs.items())}
    summary = {"kind": kind, "title": title, "learning_rate": learning_rate, "rule": RULE,
               "curves": _curves(scores), "paired": paired, "power": power(paired),
               "verdict": verdict(paired, code=code), "code": code,
               "replay": {str(seed): replay(scores, seen, seed) for seed in seeds if ("lr0", seed) in dirs},
               "length_corr": logged.get("length_corr", {}), "clipped": logged.get("clipped", {}),
               "eval_clipped": logged.get("eval_clipped", {}), "peak_rss_mib": dict(memory or {})}
    if any(seen.values()):
        summary["curves_seen"] = _curves(seen)
        summary["paired_seen"] = {str(seed): _paired(seen, seed) for seed in seeds}
    return summary


def _curves(scores: Mapping[tuple[str, int], Mapping[int, Mapping[str, float | None]]]) -> dict[str, Any]:
    """Per arm, the mean score over the prompts at each step, then its mean, min and max over the seeds."""
    curves = {}
    for arm in ARMS:
        by_seed = {seed: {step: _mean(rows.values()) for step, rows in found.items()}
                   for (a, seed), found in scores.items() if a == arm}
        by_seed = {seed: {t: v for t, v in steps.items() if v is not None} for seed, steps in by_seed.items()}
        by_seed = {seed: steps for seed, steps in by_seed.items() if steps}
        if by_seed:
            curves[arm] = _curve(by_seed)
    return curves


def replay(scores: Mapping[tuple[str, int], Mapping[int, Mapping[str, float | None]]],
           seen: Mapping[tuple[str, int], Mapping[int, Mapping[str, float | None]]], seed: int) -> dict[str, Any]:
    """Whether the lr0 run's evaluations equal the base arm's, prompt by prompt, at every step both evaluated (both
    splits): `equal` when every shared (step, prompt) score is the same; the count and the largest difference."""
    pairs = []
    for split in (scores, seen):
        lr0, base = split.get(("lr0", seed), {}), split.get(("base", seed), {})
        for step in sorted(set(lr0) & set(base)):
            for row in sorted(set(lr0[step]) & set(base[step])):
                pairs.append((lr0[step][row], base[step][row]))
    differ = [(a, b) for a, b in pairs if a != b]
    largest = max((abs(a - b) for a, b in differ if a is not None and b is not None), default=0.0)
    return {"compared": len(pairs), "differ": len(differ), "max_abs_diff": largest,
            "equal": bool(pairs) and not differ}


def power(paired: Mapping[str, Mapping[str, Any]], *, level: float = LEVEL, target: float = POWER
          ) -> dict[str, Any]:
    """The rule's minimum detectable effects at `target` power (module docstring): per seed `(z + z_power) se`,
    and for all seeds together the effect at which every seed passes with probability `target`."""
    from statistics import NormalDist

    normal = NormalDist()
    z, z_power = normal.inv_cdf(1 - (1 - level) / 2), normal.inv_cdf(target)
    errors = {}
    for seed, p in paired.items():
        d = list((p.get("differences") or {}).values())
        if len(d) > 1:
            errors[seed] = float(np.std(d, ddof=1)) / math.sqrt(len(d))
    per_seed = {seed: {"se": se, "mde": (z + z_power) * se} for seed, se in errors.items()}
    if not errors:
        return {"target": target, "per_seed": per_seed, "all_seeds": None}

    def passes(delta: float, se: float) -> float:  # one seed's chance to pass at a true mean difference delta
        return normal.cdf(delta / se - z) if se > 0 else float(delta > 0)

    def together(delta: float) -> float:
        return math.prod(passes(delta, se) for se in errors.values())

    low, high = 0.0, max(v["mde"] for v in per_seed.values()) * 4 + 1e-12
    for _ in range(100):  # bisection: `together` rises with delta
        mid = (low + high) / 2
        low, high = (mid, high) if together(mid) < target else (low, mid)
    return {"target": target, "per_seed": per_seed, "all_seeds": high,
            "per_seed_power_at_all_seeds_mde": {seed: passes(high, se) for seed, se in errors.items()}}


RULE = ("learned iff for every trained seed the 95% paired bootstrap interval over held-out prompts of "
        "(trained gain - shuffled-control gain) lies above 0; gain = score at the end minus the base weights' score "
        "on the same evaluation stream, per prompt")


def _mean(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return float(np.mean(found)) if found else None


def _curve(by_seed: Mapping[int, Mapping[int, float]]) -> dict[str, Any]:
    """Mean, min and max over seeds at each step every seed evaluated."""
    steps = sorted(set.intersection(*(set(v) for v in by_seed.values())))
    table = np.array([[by_seed[s][t] for t in steps] for s in sorted(by_seed)], dtype=float).reshape(len(by_seed), -1)
    return {"steps": steps, "seeds": sorted(by_seed), "mean": table.mean(axis=0).tolist(),
            "min": table.min(axis=0).tolist(), "max": table.max(axis=0).tolist(),
            "by_seed": {str(s): [by_seed[s][t] for t in steps] for s in sorted(by_seed)}}


def _paired(scores: Mapping[tuple[str, int], Mapping[int, Mapping[str, float | None]]], seed: int
            ) -> dict[str, Any]:
    """One seed's paired differences over the held-out prompts (see the module docstring), or why there are none."""
    def gains(arm: str) -> tuple[int, dict[str, float | None]] | None:
        found, base = scores.get((arm, seed)), scores.get(("base", seed))
        if not found:
            return None
        end = max(found)
        if base is None or end not in base:
            return end, {}
        return end, {row: None if s is None or base[end].get(row) is None else s - base[end][row]
                     for row, s in found[end].items()}

    trained, shuffled = gains("trained"), gains("shuffled")
    if trained is None:
        return {"why": f"seed {seed}: the trained run has no held-out score"}
    if ("base", seed) not in scores or trained[0] not in scores[("base", seed)]:
        return {"why": f"seed {seed}: the base weights were not evaluated on step {trained[0]}'s stream"}
    out: dict[str, Any] = {"end_step": trained[0], "gain": _interval(list(trained[1].values()))}
    if shuffled is None:
        return {**out, "why": f"seed {seed}: no shuffled control (--control shuffled)"}
    rows = sorted(set(trained[1]) | set(shuffled[1]))
    d = {row: trained[1][row] - shuffled[1][row] for row in rows  # type: ignore[operator]
         if trained[1].get(row) is not None and shuffled[1].get(row) is not None}
    out.update(control_end_step=shuffled[0], control_gain=_interval(list(shuffled[1].values())),
               n_prompts=len(d), n_dropped=len(rows) - len(d), differences=d)
    if not d:
        return {**out, "why": f"seed {seed}: no held-out prompt was scored in all of trained, shuffled and base"}
    mean, low, high = paired_bootstrap(list(d.values()), seed=seed)
    return {**out, "mean": mean, "low": low, "high": high}


def _interval(values: Sequence[float | None]) -> dict[str, float] | None:
    found = [v for v in values if v is not None]
    if not found:
        return None
    mean, low, high = paired_bootstrap(found)
    return {"mean": mean, "low": low, "high": high, "n": len(found)}


def verdict(paired: Mapping[str, Mapping[str, Any]], *, code: Mapping[str, Mapping[str, Any] | None] | None = None
            ) -> dict[str, Any]:
    """`learned`: every trained seed's interval of `d` above 0 (True), one not (False), or open (None, with `why`
    naming the seeds whose pairs are missing, or the arms whose code differs: `code`, arm -> its `code_version`)."""
    if not paired:
        return {"learned": None, "why": "no trained run"}
    open_ = [p["why"] for p in paired.values() if "low" not in p]
    versions = {json.dumps(v, sort_keys=True) for v in (code or {}).values()}
    if len(versions) > 1:
        shown = ", ".join(f"{arm}: {_version(v)}" for arm, v in (code or {}).items())
        open_.append(f"the arms ran different code ({shown}); rerun them at one commit (--overwrite)")
    if open_:
        return {"learned": None, "why": "; ".join(open_)}
    return {"learned": all(p["low"] > 0 for p in paired.values()),
            "lowest_low": min(p["low"] for p in paired.values())}


def _version(git: Mapping[str, Any] | None) -> str:
    if not git:
        return "unrecorded"
    return str(git["commit"])[:12] + (" with local changes" if git.get("dirty") else "")


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
    for split, name, prompts in (("", "held-out score", "held-out prompts"),
                                 ("_seen", "training prompts' score", "training prompts")):
        for arm, curve in summary.get(f"curves{split}", {}).items():
            shown = ", ".join(f"step {t}: {m:.4f} [{lo:.4f}, {hi:.4f}]"
                              for t, m, lo, hi in zip(curve["steps"], curve["mean"], curve["min"], curve["max"]))
            out.append(f"{name}, {arm} (mean [min, max] over seeds {curve['seeds']}): {shown}")
        for seed, p in summary.get(f"paired{split}", {}).items():
            if "low" in p:
                out.append(f"seed {seed}, {prompts}: gain - shuffled gain {p['mean']:+.4f} "
                           f"[{p['low']:+.4f}, {p['high']:+.4f}] over {p['n_prompts']} prompts "
                           f"({p['n_dropped']} unscored); gain over the base weights {_shown(p.get('gain'))}, "
                           f"shuffled {_shown(p.get('control_gain'))}")
    found = summary.get("power", {})
    if found.get("per_seed"):
        per = ", ".join(f"seed {s} {v['mde']:.4f}" for s, v in found["per_seed"].items())
        out.append(f"minimum detectable effect at {found['target']:.0%} power: {per}; every seed passing: "
                   f"{found['all_seeds']:.4f}")
    for seed, r in summary.get("replay", {}).items():
        out.append(f"seed {seed}: lr0 run vs base weights: {r['compared'] - r['differ']} of {r['compared']} "
                   f"prompt scores equal" + ("" if r["equal"] else f", largest difference {r['max_abs_diff']:.4g}"))
    for name, title in (("length_corr", "dr/length_corr"), ("clipped", "clipped completions, training"),
                        ("eval_clipped", "clipped completions, evaluations")):
        for arm, by_seed in summary.get(name, {}).items():
            shown = ", ".join(f"seed {s} {v['mean']:+.3f}" if name == "length_corr" else f"seed {s} {v['mean']:.0%}"
                              for s, v in by_seed.items() if v["mean"] is not None)
            out.append(f"{title}, {arm} (mean over steps): {shown or '-'}")
    versions = {_version(v) for v in summary.get("code", {}).values()}
    if versions:
        out.append(f"code: {', '.join(sorted(versions))}"
                   + (" (every arm)" if len(versions) == 1 else " (the arms differ)"))
    rss = summary["peak_rss_mib"]
    if rss.get("runs"):  # none when every run was kept from before
        out.append(f"peak RSS: largest run {rss['largest_run']:.0f} MiB, this process beside it "
                   f"{rss['parent_while_running']:.0f} MiB, the comparison at most {rss['comparison']:.0f} MiB "
                   f"({rss['comparison_over_largest_run']:.2f} x the largest run)")
    v = summary["verdict"]
    if v["learned"] is None:
        out.append(f"verdict: open: {v['why']}")
    else:
        out.append(f"verdict: {'learned' if v['learned'] else 'NOT learned'} ({summary['rule']})")
    return out


def _shown(interval: Mapping[str, float] | None) -> str:
    return "-" if not interval else f"{interval['mean']:+.4f} [{interval['low']:+.4f}, {interval['high']:+.4f}]"
