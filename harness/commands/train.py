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
    try:
        import trl  # noqa: F401
    except ImportError:
        raise ConfigError('training needs TRL: pip install -e ".[hf,train]"') from None
    from training.ranks import current

    say = echo if current().main else (lambda line: None)
    if what == "coevolve":
        _coevolve(args, endpoints=endpoints, overwrite=overwrite, echo=say)
    else:
        _job(what, args, endpoints=endpoints, overwrite=overwrite, echo=say)


def _coevolve(args: TrainRun, *, endpoints: Path | None, overwrite: bool, echo: Callable[[str], None]) -> None:
    from training.coevolve import coevolve, load_coevolve_config, stage_line

    if args.eval_every is not None or args.seeds != 1 or args.control or args.dry_run:
        raise ConfigError("--eval-every, --seeds, --control and --dry-run are for `harness train generator|policy`")
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

        runs = plan_runs(cfg, seeds=args.seeds, control=args.control) if args.seeds > 1 or args.control else []
        for line in dry_run(what, cfg):  # type: ignore[arg-type]
            echo(line)
        if runs:
            echo(f"learning comparison: {len(runs)} runs, each as above: "
                 + ", ".join(f"{arm} seed {seed} -> {run.output_dir}" for arm, seed, run in runs))
        return
    if args.seeds > 1 or args.control:
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
