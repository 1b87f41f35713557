"""From a verb's options to what it runs: backend options, endpoints, a table's plan, a policy table's judge.

Every verb that builds models reads its options the same way: the command line's values (`harness.commands.options`)
over the config file's, over the defaults.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from harness.commands.options import Backend, Devices, TableRun


def backend_options(given: Backend, config: dict[str, Any] | None = None, *, where: str = "command line"):
    """`BackendOptions`: the command line's values over the config's `backend:` (every key and type checked)."""
    from harness.config import backend_options as checked

    return checked({**(config or {}), **given}, where=where)


def endpoints(config_models: dict | None, path: Path | None, *, where: str) -> dict:
    """Model spec -> Endpoint: the config's `models:`, with the endpoints file's entries on top."""
    from harness.endpoints import parse_endpoints, read_endpoints

    found = parse_endpoints(config_models or {}, where=where)
    if path is not None:
        found.update(read_endpoints(path))
    return found


def served_models(config_models: dict, path: Path | None) -> dict:
    """A training config's `models:` with an endpoints file's entries on top (as plain mappings)."""
    from harness.config import read_yaml_mapping

    if path is None:
        return config_models
    found = read_yaml_mapping(path, what="endpoints file").get("models") or {}
    return {**config_models, **found}


def drive(pool, coroutine_fn):
    """Run `coroutine_fn()` in an event loop and close the pool's backends however it ends."""
    import asyncio

    async def main():
        try:
            return await coroutine_fn()
        finally:
            await pool.close()

    return asyncio.run(main())


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def as_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def bench_options(values: list[str], current: dict) -> dict:
    """`--bench-option BENCH.KEY=VALUE` values (VALUE read as YAML: `true`, `3`, `skip`) on top of `current`."""
    import yaml

    from harness.config import load_yaml, yaml_problem
    from harness.errors import TOO_DEEP, ConfigError

    out = {k: dict(v) for k, v in current.items()}
    for text in values:
        key, sep, value = text.partition("=")
        bench, dot, name = key.partition(".")
        if not sep or not dot or not bench or not name:
            raise ConfigError(f"--bench-option {text!r}: expected BENCH.KEY=VALUE, e.g. writingbench.subset=length")
        try:
            out.setdefault(bench, {})[name] = load_yaml(value) if value else value
        except (yaml.YAMLError, RecursionError) as exc:
            problem = yaml_problem(exc) if isinstance(exc, yaml.YAMLError) else TOO_DEEP
            raise ConfigError(f"--bench-option {text!r}: the value is not YAML: {problem}") from None
    return out


def table_plan(table: str, args: TableRun, backend: Backend, devices: Devices, served: Path | None = None):
    """(RunPlan, BackendOptions, resolved RunConfig, endpoints) of a table from its config file and the command
    line's values (`served`: an endpoints file), as `run`, `plan` and `serve` read them."""
    from harness.commands.runner import RunPlan
    from harness.config import load_run_config
    from harness.errors import ConfigError
    from harness.plan import resolve_devices
    from reports.tables import get_table

    cfg = load_run_config(args.config, args.overrides(table))
    spec, cfg = get_table(table).resolve(cfg)
    cfg = with_cli_judge(cfg, spec, **args.judge_given())
    if args.bench_option:
        cfg = cfg.model_copy(update={"bench_options": bench_options(args.bench_option, cfg.bench_options)})
    defaults = {"seeds": spec.default_seeds, "parallel": 32 if spec.kind == "policy" else 8}
    cfg = cfg.model_copy(update={k: v for k, v in defaults.items() if getattr(cfg, k) is None})
    rows = {r.label: cfg.rows.get(r.label, r.spec(cfg.preset)) for r in spec.rows}
    unknown = sorted(set(cfg.rows) - set(rows))
    if unknown:
        raise ConfigError(f"config rows name unknown row(s) {unknown}; valid: {list(rows)}")
    if cfg.only_rows:
        missing = [label for label in cfg.only_rows if label not in rows]
        if missing:
            raise ConfigError(f"only_rows names unknown row(s) {missing}; valid: {list(rows)}")
        rows = {k: v for k, v in rows.items() if k in cfg.only_rows}
    where = str(args.config) if args.config else "command line"
    options = backend_options(backend, cfg.backend, where=where)
    judge_spec, generation = policy_setup(spec, cfg)
    plan = RunPlan(rows=rows, benchmarks=tuple(cfg.benchmarks or spec.benchmarks), table=table, seeds=cfg.seeds,
                   seed=cfg.seed, limit=cfg.limit, data_dir=cfg.data_dir, skip_unavailable=args.skip_unavailable,
                   judge=judge_spec, generation=generation, bench_options=cfg.bench_options,
                   devices=resolve_devices(cfg.devices, gpus=devices.gpus, gpu_memory=devices.gpu_memory),
                   items=cfg.items)
    return plan, options, cfg, endpoints(cfg.models, served, where=where)


def with_cli_judge(cfg, spec, *, judge: str | None, base_url: str | None, api_key_env: str | None):
    """The run config with --judge, --judge-base-url and --judge-api-key-env on top of its `judge:`."""
    from harness.config import JudgeConfig
    from harness.errors import ConfigError

    given = {k: v for k, v in (("base_url", base_url), ("api_key_env", api_key_env)) if v is not None}
    if judge is None and not given:
        return cfg
    if spec.kind != "policy":
        raise ConfigError(f"--judge and its options are for policy tables; {spec.name} scores evaluators")
    current = cfg.judge if isinstance(cfg.judge, JudgeConfig) else JudgeConfig(model=cfg.judge) if cfg.judge else None
    if judge is not None and (current is None or judge != current.model):
        current = JudgeConfig(model=judge)  # another judge: the config's options were for the one it named
    if spec.setups[cfg.preset].judge is None:
        raise ConfigError(f"{spec.name}'s tasks are checked without a judge model; --judge does not apply")
    if current is None:
        current = JudgeConfig(model=spec.setups[cfg.preset].judge, **spec.setups[cfg.preset].judge_options)
    return cfg.model_copy(update={"judge": JudgeConfig(**{**current.model_dump(), **given})})


def policy_setup(spec, cfg):
    """(judge, generation) of a policy table: the preset's, with the run config's `judge`, `judge_settings` and
    `generation` on top; (None, default generation) for an evaluator table.

    Raises:
        ConfigError: for policy settings given to an evaluator table, or judge options `BackendOptions` lacks.
    """
    from harness.commands.runner import Generation, JudgeSpec
    from harness.config import JudgeConfig
    from harness.config import backend_options as checked
    from harness.errors import ConfigError
    from judges.policy import judge_options

    given = [k for k in ("judge", "judge_settings") if getattr(cfg, k)]
    given += ["generation"] if cfg.generation.model_dump(exclude_none=True) else []
    if spec.kind != "policy":
        if given:
            raise ConfigError(f"{', '.join(given)}: for policy tables; {spec.name} scores evaluators")
        return None, Generation()
    setup = spec.setups[cfg.preset]
    if cfg.judge is None:
        model, options = setup.judge, dict(setup.judge_options)
    else:
        judge = cfg.judge if isinstance(cfg.judge, JudgeConfig) else JudgeConfig(model=cfg.judge)
        model, options = judge.model, judge.model_dump(exclude={"model"})
    checked(options, where="judge")  # every key a BackendOptions field, of the right type
    settings = {b: dict(v) for b, v in setup.judge_settings.items()}
    for bench, values in cfg.judge_settings.items():
        settings[bench] = {**settings.get(bench, {}), **values}
    for bench, values in settings.items():  # before any data or model is loaded
        valid = judge_options(bench)
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ConfigError(f"judge_settings.{bench}: unknown setting(s) {', '.join(unknown)}; valid: "
                              f"{', '.join(valid)}")
    fields = {**setup.generation, **cfg.generation.model_dump(exclude_none=True)}
    if "stop" in fields:
        fields["stop"] = tuple(fields["stop"])
    return JudgeSpec(model, options, settings), Generation(**fields)


def eval_plan(benchmark: str, evaluator: str | None, policy, *, label: str | None, **how: Any):
    """`harness eval`'s plan of one cell and the spec its default output dir is named by: `evaluator` on an
    evaluator benchmark, or `policy.policy` answering a policy benchmark, judged by `policy.judge` (none for a
    benchmark checked without a model), with `policy`'s generation settings. `how`: `RunPlan` fields.

    Raises:
        ConfigError: for an unknown benchmark, neither or both of an evaluator and a policy, options of the
            other kind of benchmark, a judged benchmark without --judge, or --judge for a checked one.
    """
    from harness.commands.runner import Generation, JudgeSpec, RunPlan
    from harness.config import backend_options as checked
    from harness.errors import ConfigError
    from harness.registry import lookup
    from judges.policy import judge_needs_model

    kind = lookup("benchmark", benchmark).kind
    given = [f"--{name.replace('_', '-')}" for name, value in dataclasses.asdict(policy).items() if value is not None]
    if kind != "policy":
        if given:
            raise ConfigError(f"benchmark {benchmark!r} is a {kind} evaluator benchmark: give --evaluator SPEC; "
                              f"{', '.join(given)}: for policy benchmarks only")
        if evaluator is None:
            raise ConfigError(f"benchmark {benchmark!r} is a {kind} evaluator benchmark: give --evaluator SPEC "
                              "(harness list evaluators)")
        return RunPlan(rows={label or evaluator: evaluator}, benchmarks=(benchmark,), **how), evaluator
    if evaluator is not None or policy.policy is None:
        raise ConfigError(f"benchmark {benchmark!r} is a policy benchmark: give --policy SPEC (the model that "
                          "answers) and --judge SPEC instead of --evaluator")
    needs = judge_needs_model(benchmark)
    if needs and policy.judge is None:
        raise ConfigError(f"benchmark {benchmark!r} is judged by a model: give --judge SPEC (e.g. openai:gpt-4.1, "
                          "or a local model spec)")
    if not needs and (policy.judge is not None or policy.judge_options()):
        raise ConfigError(f"benchmark {benchmark!r} is checked without a model: --judge does not apply")
    checked(policy.judge_options(), where="--judge options")
    judge = JudgeSpec(policy.judge, policy.judge_options())
    plan = RunPlan(rows={label or policy.policy: policy.policy}, benchmarks=(benchmark,), judge=judge,
                   generation=Generation(**policy.generation()), **how)
    return plan, f"{policy.policy} judged by {policy.judge}"
