"""`harness train`: a generator or policy job, a learning comparison (`--seeds`, `--control`), a co-evolution, or
the figure of a finished run (`plot DIR`). Under `accelerate launch --num_processes N` every process runs this and
only the main process prints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.commands.options import TrainRun
from harness.commands.setup import served_models
from harness.errors import ConfigError

KINDS = ("generator", "policy", "coevolve", "plot")


def run_train(what: str, target: Path | None, args: TrainRun, *, endpoints: Path | None, overwrite: bool,
              echo: Callable[[str], None]) -> None:
    """Do what `harness train WHAT` asks, saying where the outputs are through `echo` (main process).

    Raises:
        ConfigError: for a bad verb, config, data or output dir (exit code 2).
    """
    if what == "plot":
        from training.plots import plot_run

        if target is None:
            raise ConfigError("harness train plot DIR: name the run's output dir")
        echo(f"curves: {plot_run(target)}")
        return
    if what not in KINDS:
        raise ConfigError(f"harness train {what!r}: expected generator, policy, coevolve or plot")
    if target is not None or args.config is None:
        raise ConfigError(f"harness train {what}: takes --config FILE and no DIR argument")
    import importlib.util

    if importlib.util.find_spec("trl") is None:  # found, not imported: a comparison's parent process stays light
        raise ConfigError('training needs TRL: pip install -e ".[hf,train]"')
    from training.ranks import current

    say = echo if current().main else (lambda line: None)
    if what == "coevolve":
        _coevolve(args, endpoints=endpoints, overwrite=overwrite, echo=say)
    else:
        _job(what, args, endpoints=endpoints, overwrite=overwrite, echo=say)


def _coevolve(args: TrainRun, *, endpoints: Path | None, overwrite: bool, echo: Callable[[str], None]) -> None:
    from training.coevolve import coevolve, load_coevolve_config, stage_line

    if (args.eval_every is not None or args.seeds != 1 or args.control is not None or args.dry_run
            or args.noise_pilot):
        raise ConfigError("--eval-every, --seeds, --control, --noise-pilot and --dry-run are for "
                          "`harness train generator|policy`")
    co = load_coevolve_config(args.config, rounds=args.rounds, output_dir=args.output_dir, data_dir=args.data_dir,
                              max_steps=args.max_steps)
    co = co.model_copy(update={"models": served_models(co.models, endpoints)})
    coevolve(co, overwrite=overwrite, report=lambda entry: echo(stage_line(entry)))
    echo(f"manifest: {co.output_dir}/coevolve.json")


def _job(what: str, args: TrainRun, *, endpoints: Path | None, overwrite: bool, echo: Callable[[str], None]) -> None:
    from training.grpo import load_train_config

    if args.rounds is not None:
        raise ConfigError("--rounds is for `harness train coevolve`")
    cfg = load_train_config(args.config, output_dir=args.output_dir, data_dir=args.data_dir,
                            max_steps=args.max_steps, eval_every=args.eval_every)
    cfg = cfg.model_copy(update={"models": served_models(cfg.models, endpoints)})
    if args.dry_run:
        from training.job import dry_run
        from training.learning import plan_runs

        comparing = args.seeds > 1 or args.control is not None
        runs = plan_runs(cfg, seeds=args.seeds, control=args.control) if comparing else []
        for line in dry_run(what, cfg):  # type: ignore[arg-type]
            echo(line)
        if runs:
            echo(f"learning comparison: {len(runs)} runs, each as above, in a process of its own: "
                 + ", ".join(f"{run.arm} seed {run.seed} -> {run.config.output_dir}" for run in runs)
                 + "; then the base weights evaluated per seed")
        return
    if args.noise_pilot:
        if args.seeds > 1 or args.control is not None:
            raise ConfigError("--noise-pilot evaluates the base weights alone: drop --seeds and --control")
        from training.learning import noise_pilot

        found = noise_pilot(what, cfg)
        means = ", ".join("-" if m is None else f"{m:.4f}" for m in found["stream_means"])
        shown = (f"mean {found['mean']:+.4f} [{found['low']:+.4f}, {found['high']:+.4f}], SD {found['sd']:.4f}"
                 if "mean" in found else "no prompt scored on both streams")
        echo(f"noise pilot: base weights on the streams of steps {found['steps'][0]} and {found['steps'][1]} "
             f"(held-out means {means}): per-prompt difference {shown} over {found['n_prompts']} prompts "
             f"({found['n_dropped']} unscored), {found['wall_seconds']:.0f} s -> "
             f"{cfg.output_dir}/noise-pilot/noise.json")
        return
    if args.seeds > 1 or args.control is not None:
        from training.learning import compare, lines

        summary = compare(what, cfg, seeds=args.seeds, control=args.control, overwrite=overwrite, report=echo)
        for line in lines(summary):
            echo(line)
        echo(f"comparison: {cfg.output_dir}/learning.json, {cfg.output_dir}/learning.png")
        return
    from training.job import train

    manifest = train(what, cfg, overwrite=overwrite)  # type: ignore[arg-type]
    echo(f"{what} checkpoint: {manifest['checkpoint']} ({manifest['data']['rows']} training rows; "
         f"manifest {manifest['checkpoint']}/dr_manifest.json)")
    for step in manifest["reward_history"]:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in step.items() if isinstance(v, float))
        echo(f"  reward: {shown}")
