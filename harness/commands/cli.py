"""The `harness` command line.

One command per verb; heavy libraries (torch, transformers, vllm) are imported inside command bodies so that
`harness --help` stays instant. A `HarnessError` becomes one line on stderr and a non-zero exit code; `--debug` shows
the traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from harness.errors import HarnessError, Interrupted, NotImplementedYetError
from harness.redact import RedactingStream, redact_text

app = typer.Typer(
    help="Evaluate and train LLM evaluators and policies with DynamicRubric.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
list_app = typer.Typer(help="List what exists: tables, benchmarks, evaluators, models.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect or clear the call cache.", no_args_is_help=True)
bench_app = typer.Typer(help="Micro-benchmarks that print measured ratios.", no_args_is_help=True)
app.add_typer(list_app, name="list")
app.add_typer(cache_app, name="cache")
app.add_typer(bench_app, name="bench")

_state = {"debug": False}


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
) -> None:
    _state["debug"] = debug
    import logging
    import os

    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # Our own notes (e.g. a one-time model conversion) are worth a line; library chatter is not.
    logging.getLogger("harness").setLevel(logging.DEBUG if debug else logging.INFO)
    if not debug:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF conversion's own bars
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs its engine start to stdout otherwise


def _not_yet(verb: str) -> None:
    raise NotImplementedYetError(f"'harness {verb}' is not implemented yet")


# ---------------------------------------------------------------------------------------------------- options

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Model spec KIND:NAME or alias (harness list models).")
]
BaseUrlOpt = Annotated[
    Optional[str], typer.Option("--base-url", help="OpenAI-compatible server URL (default $OPENAI_BASE_URL).")
]
ApiKeyEnvOpt = Annotated[
    Optional[str],
    typer.Option("--api-key-env", help="Environment variable that holds the API key (default OPENAI_API_KEY)."),
]
ConcurrencyOpt = Annotated[
    Optional[int], typer.Option("--concurrency", min=1, help="Max requests in flight (openai; default 32).")
]
TimeoutOpt = Annotated[
    Optional[float], typer.Option("--timeout", min=0.1, help="Per-request timeout in seconds (openai; default 120).")
]
AttemptsOpt = Annotated[
    Optional[int],
    typer.Option("--max-attempts", min=1, help="Attempts per request before recording a failure (openai; default 6)."),
]
BatchOpt = Annotated[
    Optional[int], typer.Option("--batch-size", min=1, help="Sequences per forward pass (hf; default 8).")
]
TpOpt = Annotated[Optional[int], typer.Option("--tensor-parallel", min=1, help="vLLM tensor parallel size.")]
DpOpt = Annotated[Optional[int], typer.Option("--data-parallel", min=1, help="vLLM data parallel size.")]
DtypeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--dtype",
        help="Local models' dtype: auto, bfloat16, float16, float32 (hf auto: float32 on CPU, bf16 on GPU; vllm "
        "auto: the checkpoint's, bf16 for most). Use float32 where vllm must agree with hf on the CPU.",
    ),
]
EagerOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--enforce-eager/--no-enforce-eager",
        help="vLLM: no torch.compile or CUDA graphs (the engine starts ~3x faster, decodes slower).",
        show_default=False,
    ),
]
NoCacheOpt = Annotated[
    bool, typer.Option("--no-cache", help="Bypass the call cache (nothing read or written).")
]


OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Discard an existing output (e.g. one made with other settings).")
]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="If another process is writing the output, wait for it instead of failing.")
]
RetryFailedOpt = Annotated[
    bool,
    typer.Option(
        "--retry-failed", help="Also redo records with parse failures (cached outputs are re-read, not re-asked)."
    ),
]
ParallelOpt = Annotated[Optional[int], typer.Option("--parallel", min=1, help="Sets scored concurrently.")]
GpusOpt = Annotated[
    Optional[int],
    typer.Option("--gpus", min=1, help="GPUs the local models share (default: the config's devices:, else what "
                 "nvidia-smi lists; none on a CPU machine). With --gpu-memory the run is planned to fit."),
]
GpuMemoryOpt = Annotated[Optional[float], typer.Option("--gpu-memory", min=1, help="GiB of one GPU (with --gpus).")]
EndpointsOpt = Annotated[
    Optional[Path],
    typer.Option("--endpoints", help="YAML/JSON `models:` file (harness serve writes one): each model spec named "
                 "there is served by its own OpenAI-compatible server(s) instead of loading here."),
]


def _served_models(config_models: dict, path: Path | None) -> dict:
    """A training config's `models:` with an endpoints file's entries on top (as plain mappings)."""
    from harness.config import read_yaml_mapping

    if path is None:
        return config_models
    found = read_yaml_mapping(path, what="endpoints file").get("models") or {}
    return {**config_models, **found}


def _endpoints(config_models: dict | None, path: Path | None, *, where: str) -> dict:
    """Model spec -> Endpoint: the config's `models:`, with the endpoints file's entries on top."""
    from harness.endpoints import parse_endpoints, read_endpoints

    found = parse_endpoints(config_models or {}, where=where)
    if path is not None:
        found.update(read_endpoints(path))
    return found


def _backend_options(**given):
    """BackendOptions from CLI values; None means "not given" (the default, or the config file's value)."""
    from harness.config import backend_options

    return backend_options({k: v for k, v in given.items() if v is not None}, where="command line")


def _finish(summary, out: str) -> None:
    """Print the loop's summary; exit 1 when some records could not be evaluated (the one exit-code rule)."""
    typer.echo(summary.line(out))
    spent = summary.spent_lines()
    if spent:
        typer.echo("spent (tokens as the backends report them):")
        for line in spent:
            typer.echo(f"  {line}")
    replicas = summary.replica_lines()
    if replicas:
        typer.echo("replicas:")
        for line in replicas:
            typer.echo(f"  {line}")
    lacking = summary.lacking_lines()
    if lacking:
        typer.echo("what the backends lack (recorded in the manifest):")
        for line in lacking:
            typer.echo(redact_text(f"  {line}"))
    for line in summary.failure_lines(out):
        typer.echo(redact_text(line), err=True)
    if summary.with_failures or summary.missing:
        raise typer.Exit(1)


def _drive(pool, coroutine_fn):
    """Run `coroutine_fn()` in an event loop and close the pool's backends however it ends."""
    import asyncio

    async def main():
        try:
            return await coroutine_fn()
        finally:
            await pool.close()

    return asyncio.run(main())


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


@app.command()
def generate(
    model: ModelOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL, one line per (prompt id, sample).")],
    prompts: Annotated[
        Optional[Path], typer.Option("--prompts", help="JSONL of {id, prompt | instruction | messages}.")
    ] = None,
    benchmark: Annotated[
        Optional[str], typer.Option("--benchmark", help="A policy benchmark's prompts: alpaca_eval2, arena_hard_v2, wildbench, writingbench.")
    ] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Local benchmark files.")] = None,
    limit: Annotated[
        Optional[int], typer.Option("--limit", min=1, help="Use only the first N prompts.")
    ] = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Samples per prompt.")] = 1,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 1.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 512,
    stop: Annotated[
        Optional[list[str]], typer.Option("--stop", help="A stop string: the text ends before it (repeatable).")
    ] = None,
    bench_option: Annotated[
        Optional[list[str]],
        typer.Option("--bench-option", metavar="KEY=VALUE",
                     help="An option of the benchmark's loader, e.g. subset=length (writingbench) or "
                     "missing_baseline=skip (arena_hard_v2); repeatable."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Run seed; per-prompt seeds derive from it.")] = 0,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
    tensor_parallel: TpOpt = None,
    data_parallel: DpOpt = None,
    no_cache: NoCacheOpt = False,
    overwrite: OverwriteOpt = False,
    wait: WaitOpt = False,
    retry_failed: RetryFailedOpt = False,
    show: Annotated[int, typer.Option("--show", min=0, help="Print the first N generated texts.")] = 0,
) -> None:
    """Sample responses from a model for a prompt file or a benchmark; resumable, cached.

    Exit code 0 when every sample was answered, 1 when some failed (rerun to retry them), 2 for bad input.
    """
    from harness.cache import CallCache
    from harness.errors import ConfigError
    from harness.generation import GenerateConfig, run_generate
    from harness.pool import BackendPool
    from harness.commands.prompts import benchmark_prompts, read_prompts_file

    if (prompts is None) == (benchmark is None):
        raise ConfigError("give exactly one of --prompts FILE or --benchmark NAME")
    if prompts is not None and _same_file(prompts, out):
        raise ConfigError(f"--out {out} is the prompts file itself; choose another output file")
    if bench_option and benchmark is None:
        raise ConfigError("--bench-option goes with --benchmark")
    if prompts is not None:
        records = read_prompts_file(prompts)[:limit]
    else:
        options = _bench_options([f"{benchmark}.{o}" for o in bench_option or ()], {}).get(benchmark)
        records = benchmark_prompts(benchmark, data_dir=data_dir, limit=limit, options=options)
    options = _backend_options(
        base_url=base_url, api_key_env=api_key_env, concurrency=concurrency, timeout=timeout,
        max_attempts=max_attempts, batch_size=batch_size, tensor_parallel_size=tensor_parallel,
        data_parallel_size=data_parallel, dtype=dtype, enforce_eager=enforce_eager,
    )
    config = GenerateConfig(model=model, source=str(prompts or benchmark), n=n, temperature=temperature,
                            top_p=top_p, max_tokens=max_tokens, seed=seed, limit=limit, stop=tuple(stop or ()))
    pool = BackendPool(options=options, cache=None if no_cache else CallCache())
    backend = pool.get(model)
    pool.preflight()
    summary = _drive(pool, lambda: run_generate(
        backend, records, config, out, parallel=max(64, 4 * options.concurrency),
        runtime={"backend": _asdict(options), "no_cache": no_cache},
        overwrite=overwrite, wait=wait, retry_failed=retry_failed,
    ))
    if show:
        _show_generations(out, show)
    _finish(summary, str(out))


def _asdict(obj) -> dict:
    import dataclasses

    return dataclasses.asdict(obj)


def _show_generations(out: Path, limit: int) -> None:
    from harness.records import GenerationRecord
    from harness.runstore import RecordLog

    for record in RecordLog(out, GenerationRecord).records()[:limit]:
        text = record.text if record.error is None else f"[failed: {record.error.message}]"
        typer.echo(f"--- {record.id} #{record.sample}\n{(text or '').strip()}")


@app.command()
def run(
    table: Annotated[str, typer.Argument(help="Table to reproduce (harness list tables).")],
    preset: Annotated[Optional[str], typer.Option("--preset", help="paper (default) | cpu (smollm2-135m everywhere).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="YAML settings; unknown keys are errors.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="First N items per benchmark.")] = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", min=1, help="Repeats per item, AVG@k (default 5).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Upstream benchmark files (else the Hub).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Run directory (rerun into it to resume).")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Run seed.")] = None,
    parallel: ParallelOpt = None,
    judge: Annotated[
        Optional[str],
        typer.Option("--judge", help="Policy tables: the judge's model spec (default the table's; `judge:` in "
                     "--config gives base_url and api_key_env too)."),
    ] = None,
    judge_base_url: Annotated[
        Optional[str], typer.Option("--judge-base-url", help="Policy tables: the judge's OpenAI-compatible server.")
    ] = None,
    judge_api_key_env: Annotated[
        Optional[str],
        typer.Option("--judge-api-key-env", help="Policy tables: the variable holding the judge server's key."),
    ] = None,
    bench_option: Annotated[
        Optional[list[str]],
        typer.Option("--bench-option", metavar="BENCH.KEY=VALUE",
                     help="A benchmark loader's option, e.g. writingbench.subset=length or "
                     "arena_hard_v2.missing_baseline=skip (repeatable)."),
    ] = None,
    skip_unavailable: Annotated[
        bool,
        typer.Option(
            "--skip-unavailable",
            help="Leave out benchmarks that cannot be loaded and rows that cannot be built (shown as dashes) "
            "instead of stopping.",
        ),
    ] = False,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
    gpus: GpusOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    endpoints: EndpointsOpt = None,
    no_cache: NoCacheOpt = False,
    overwrite: OverwriteOpt = False,
    wait: WaitOpt = False,
    retry_failed: RetryFailedOpt = False,
) -> None:
    """Reproduce a paper table: rows (evaluators, or policies) x columns (benchmarks) into a run directory.

    Policy tables (table2, table6, table8): each policy answers each benchmark's prompts and the table's judge
    judges the answers (AlpacaEval 2 against the reference, Arena-Hard v2.0 against the category baseline,
    WildBench by checklist, WritingBench per criterion). Writes records.jsonl, results.json, table.md, table.tex
    and table.csv (with the paper's numbers) and resumes when rerun into the same --out. Local models are planned
    onto the devices before any loads (`harness plan` shows the plan). Exit code 0 when every cell was evaluated,
    1 when some records hold failures, 2 for bad input (a benchmark that cannot be loaded, an evaluator, policy or
    judge that cannot be built, other settings, models that cannot fit the devices).
    """
    plan, options, cfg, served = _table_plan(
        table, config, {"table": table, "preset": preset, "limit": limit, "seeds": seeds, "data_dir": data_dir,
                        "out": out, "seed": seed, "parallel": parallel},
        judge={"judge": judge, "base_url": judge_base_url, "api_key_env": judge_api_key_env},
        bench_option=bench_option, skip_unavailable=skip_unavailable, devices={"gpus": gpus, "gpu_memory": gpu_memory},
        backend={"base_url": base_url, "api_key_env": api_key_env, "concurrency": concurrency, "timeout": timeout,
                 "max_attempts": max_attempts, "batch_size": batch_size, "dtype": dtype,
                 "enforce_eager": enforce_eager},
        endpoints=endpoints,
    )
    out_dir = cfg.out or Path("runs") / f"{table}-{cfg.preset}"
    _run_and_report(plan, out_dir, options=options, config=cfg.model_dump(mode="json"), parallel=cfg.parallel,
                    command="run", no_cache=no_cache, overwrite=overwrite, wait=wait, retry_failed=retry_failed,
                    endpoints=served)


def _table_plan(table: str, config: Path | None, overrides: dict, *, judge: dict, bench_option: list[str] | None,
                skip_unavailable: bool, devices: dict, backend: dict, endpoints: Path | None):
    """(RunPlan, BackendOptions, resolved RunConfig, endpoints) of a table from its config file and the CLI's
    values, as `run` and `plan` read them."""
    from harness.commands.runner import RunPlan
    from harness.config import backend_options, load_run_config
    from harness.errors import ConfigError
    from harness.plan import resolve_devices
    from reports.tables import get_table

    cfg = load_run_config(config, overrides)
    spec = get_table(table)
    cfg = _with_cli_judge(cfg, spec, judge=judge["judge"], base_url=judge["base_url"],
                          api_key_env=judge["api_key_env"])
    if bench_option:
        cfg = cfg.model_copy(update={"bench_options": _bench_options(bench_option, cfg.bench_options)})
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
    options = backend_options(
        {**cfg.backend, **{k: v for k, v in backend.items() if v is not None}},
        where=str(config) if config else "command line",
    )
    judge_spec, generation = policy_setup(spec, cfg)
    plan = RunPlan(rows=rows, benchmarks=tuple(cfg.benchmarks or spec.benchmarks), table=table, seeds=cfg.seeds,
                   seed=cfg.seed, limit=cfg.limit, data_dir=cfg.data_dir, skip_unavailable=skip_unavailable,
                   judge=judge_spec, generation=generation, bench_options=cfg.bench_options,
                   devices=resolve_devices(cfg.devices, **devices))
    return plan, options, cfg, _endpoints(cfg.models, endpoints, where=str(config or "command line"))


@app.command("plan")
def plan_(
    table: Annotated[Optional[str], typer.Argument(help="Table to plan (harness list tables); or --train.")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="paper (default) | cpu.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="The run's (or training job's) YAML.")] = None,
    train: Annotated[
        Optional[str], typer.Option("--train", help="Plan a training job instead: generator | policy (--config).")
    ] = None,
    processes: Annotated[
        Optional[int], typer.Option("--processes", min=1, help="--train: training processes (default: --gpus).")
    ] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="First N items per benchmark.")] = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", min=1, help="Repeats per item.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Upstream benchmark files.")] = None,
    gpus: GpusOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    dtype: DtypeOpt = None,
    endpoints: EndpointsOpt = None,
) -> None:
    """Plan a run before any model loads: each row's models; each local model's weight memory (from its
    config.json: parameters x dtype bytes, an MoE model counted whole) and the devices it spans; the phases the
    run goes through, what is resident in each and each vLLM engine's share of a device; the requests and tokens
    to expect per model. With --train generator|policy --config FILE: what one training process puts on its GPU
    (the trained model's ZeRO-3 share of weights, gradients and Adam state, TRL's colocated vLLM, the frozen
    models it loads). Exit code 2 when the models cannot fit the devices, with the numbers and the ways out
    (`harness run` and `harness train` make the same check before their first model call).
    """
    if train is not None:
        from harness.commands.plan import show_train_plan

        typer.echo("\n".join(show_train_plan(train, config, gpus=gpus, gpu_memory=gpu_memory, processes=processes,
                                               endpoints=endpoints)))
        return
    from harness.commands.plan import show_plan
    from harness.errors import ConfigError

    if table is None:
        raise ConfigError("harness plan: name a table (harness list tables), or --train generator|policy --config")
    plan, options, _, served = _table_plan(
        table, config, {"table": table, "preset": preset, "limit": limit, "seeds": seeds, "data_dir": data_dir},
        judge={"judge": None, "base_url": None, "api_key_env": None}, bench_option=None, skip_unavailable=True,
        devices={"gpus": gpus, "gpu_memory": gpu_memory}, backend={"dtype": dtype}, endpoints=endpoints,
    )
    typer.echo("\n".join(show_plan(plan, options, served)))


@app.command("serve")
def serve_(
    table: Annotated[str, typer.Argument(help="Table whose local models to serve (harness list tables).")],
    endpoints: Annotated[Path, typer.Option("--endpoints", help="The endpoints file to write (for run|eval|"
                                            "plan --endpoints); the servers' logs go to FILE.logs/.")],
    preset: Annotated[Optional[str], typer.Option("--preset", help="paper (default) | cpu.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="The run's YAML (with serve:).")] = None,
    gpus: GpusOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    dtype: DtypeOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address the servers listen on.")] = "127.0.0.1",
    start_timeout: Annotated[float, typer.Option("--start-timeout", min=1, help="Seconds every server has to "
                                                 "answer GET /v1/models.")] = 900.0,
) -> None:
    """Start the vLLM servers a run needs and write the endpoints file that run|eval|plan --endpoints read.

    Every local model of the plan gets a vLLM OpenAI server per replica (replicas, tensor_parallel_size,
    devices, runner and extra arguments from the config's serve:), each replica on GPUs of its own. Once every
    server answers, the endpoints file is written; serve then stays in the foreground until Ctrl-C or SIGTERM,
    which stop every server and remove the file. A reward model read with head=lm-token0 stays local (named on
    the output). Exit code 0 after Ctrl-C or SIGTERM; 2 for bad input, too few GPUs or a server that failed to
    start (its log's last lines are printed; every server is stopped).
    """
    from harness.commands.runner import Prepared, build_models
    from harness.pool import BackendPool
    from harness.serve import serve

    plan, options, cfg, served = _table_plan(
        table, config, {"table": table, "preset": preset},
        judge={"judge": None, "base_url": None, "api_key_env": None}, bench_option=None,
        skip_unavailable=False, devices={"gpus": gpus, "gpu_memory": gpu_memory},
        backend={"dtype": dtype}, endpoints=None,
    )
    pool = BackendPool(options=options, endpoints=served)
    ready = build_models(plan, pool, Prepared())
    serve(pool, cfg.serve, evaluators=ready.evaluators.values(), devices=plan.devices, out=endpoints,
          host=host, start_timeout=start_timeout)


def _with_cli_judge(cfg, spec, *, judge: str | None, base_url: str | None, api_key_env: str | None):
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


def _bench_options(values: list[str], current: dict) -> dict:
    """`--bench-option BENCH.KEY=VALUE` values (VALUE read as YAML: `true`, `3`, `skip`) on top of `current`."""
    import yaml

    from harness.errors import ConfigError

    out = {k: dict(v) for k, v in current.items()}
    for text in values:
        key, sep, value = text.partition("=")
        bench, dot, name = key.partition(".")
        if not sep or not dot or not bench or not name:
            raise ConfigError(f"--bench-option {text!r}: expected BENCH.KEY=VALUE, e.g. writingbench.subset=length")
        out.setdefault(bench, {})[name] = yaml.safe_load(value) if value else value
    return out


def policy_setup(spec, cfg):
    """(judge, generation) of a policy table: the preset's, with the run config's `judge`, `judge_settings` and
    `generation` on top; (None, default generation) for an evaluator table.

    Raises:
        ConfigError: for policy settings given to an evaluator table, or judge options `BackendOptions` lacks.
    """
    from harness.commands.runner import Generation, JudgeSpec
    from harness.config import JudgeConfig, backend_options
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
    backend_options(options, where="judge")  # every key a BackendOptions field, of the right type
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


def _run_and_report(plan, out_dir: Path, *, options, config: dict, parallel: int, command: str, no_cache: bool,
                    overwrite: bool, wait: bool, retry_failed: bool, endpoints: dict) -> None:
    from harness.cache import CallCache
    from harness.pool import BackendPool
    from harness.commands.runner import prepare, run_plan
    from reports.report import write_reports

    pool = BackendPool(options=options, cache=None if no_cache else CallCache(), endpoints=endpoints)
    ready = prepare(plan, pool)
    summary = _drive(pool, lambda: run_plan(
        plan, out_dir, pool, ready=ready, parallel=parallel, command=command,
        config={**config, "backend": _asdict(options), "no_cache": no_cache},
        overwrite=overwrite, wait=wait, retry_failed=retry_failed,
    ))
    write_reports(out_dir)
    typer.echo((out_dir / "table.md").read_text(encoding="utf-8"))
    for what, why in ready.unavailable.items():
        typer.echo(f"{what} left out (--skip-unavailable): {why}", err=True)
    _finish(summary, str(out_dir))


@app.command("eval")
def eval_(
    evaluator: Annotated[str, typer.Option("--evaluator", "-e", help="Evaluator spec (harness list evaluators).")],
    benchmark: Annotated[str, typer.Option("--benchmark", "-b", help="Benchmark (harness list benchmarks).")],
    label: Annotated[
        Optional[str],
        typer.Option("--label", help="Row label (default: the evaluator spec). `harness compare` matches rows by "
                     "label: give a baseline and a candidate checkpoint the same one."),
    ] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1)] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Repeats per item (AVG@k).")] = 1,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir")] = None,
    out: Annotated[
        Optional[Path],
        typer.Option("--out", help="Run directory (default runs/eval-BENCHMARK-<hash of the evaluator spec>)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    parallel: Annotated[int, typer.Option("--parallel", min=1, help="Sets scored concurrently.")] = 8,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
    gpus: GpusOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    endpoints: EndpointsOpt = None,
    no_cache: NoCacheOpt = False,
    overwrite: OverwriteOpt = False,
    wait: WaitOpt = False,
    retry_failed: RetryFailedOpt = False,
) -> None:
    """Run one evaluator on one benchmark (one table cell) and print its metrics.

    Exit code 0 when every item was evaluated, 1 when some records hold failures, 2 for bad input.
    """
    import hashlib

    from harness.commands.runner import RunPlan
    from harness.plan import resolve_devices

    options = _backend_options(base_url=base_url, api_key_env=api_key_env, concurrency=concurrency,
                               timeout=timeout, max_attempts=max_attempts, batch_size=batch_size, dtype=dtype,
                               enforce_eager=enforce_eager)
    plan = RunPlan(rows={label or evaluator: evaluator}, benchmarks=(benchmark,), seeds=seeds, seed=seed,
                   limit=limit, data_dir=data_dir, devices=resolve_devices(None, gpus=gpus, gpu_memory=gpu_memory))
    tag = hashlib.sha256(evaluator.encode()).hexdigest()[:8]
    config = {"evaluator": evaluator, "label": label, "benchmark": benchmark, "limit": limit, "seeds": seeds,
              "data_dir": str(data_dir) if data_dir else None, "seed": seed, "parallel": parallel}
    _run_and_report(plan, out or Path("runs") / f"eval-{benchmark}-{tag}", options=options, config=config,
                    parallel=parallel, command="eval", no_cache=no_cache, overwrite=overwrite, wait=wait,
                    retry_failed=retry_failed, endpoints=_endpoints(None, endpoints, where="command line"))


@app.command()
def score(
    evaluator: Annotated[
        str, typer.Option("--evaluator", "-e", help="Evaluator spec (harness list evaluators).")
    ],
    input: Annotated[Path, typer.Option("--input", "-i", help="JSONL of {id, prompt, responses: [...]}.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL, one line per set: scores + trace.")],
    seed: Annotated[
        int, typer.Option("--seed", help="Run seed; per-set seeds derive from it and the id.")
    ] = 0,
    parallel: Annotated[int, typer.Option("--parallel", min=1, help="Sets scored concurrently.")] = 8,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
    tensor_parallel: TpOpt = None,
    data_parallel: DpOpt = None,
    no_cache: NoCacheOpt = False,
    overwrite: OverwriteOpt = False,
    wait: WaitOpt = False,
    retry_failed: RetryFailedOpt = False,
) -> None:
    """Score {id, prompt, responses} sets with an evaluator; resumable, cached.

    Each output line holds the scores (None for a response that could not be scored) and the evaluator's trace
    (rubric, verdict matrix, per-item pass rates, failures by category). Exit code 0 when every set was fully
    scored, 1 when some hold failures, 2 for bad input.
    """
    from harness.cache import CallCache
    from harness.errors import ConfigError
    from harness.pool import BackendPool
    from harness.commands.score import read_sets_file, run_score
    from judges import load_evaluator

    if _same_file(input, out):
        raise ConfigError(f"--out {out} is the input file itself; choose another output file")
    sets = read_sets_file(input)
    options = _backend_options(
        base_url=base_url, api_key_env=api_key_env, concurrency=concurrency, timeout=timeout,
        max_attempts=max_attempts, batch_size=batch_size, tensor_parallel_size=tensor_parallel,
        data_parallel_size=data_parallel, dtype=dtype, enforce_eager=enforce_eager,
    )
    pool = BackendPool(options=options, cache=None if no_cache else CallCache())
    judge = load_evaluator(evaluator, pool)
    pool.preflight()
    summary = _drive(pool, lambda: run_score(
        judge, sets, out, seed=seed, parallel=parallel, pool=pool,
        runtime={"input": str(input), "backend": _asdict(options), "no_cache": no_cache},
        overwrite=overwrite, wait=wait, retry_failed=retry_failed,
    ))
    _finish(summary, str(out))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    explain: Annotated[
        Optional[tuple[str, str]],
        typer.Option("--explain", metavar="ROW BENCHMARK", help="Print one cell's provenance instead."),
    ] = None,
) -> None:
    """Re-render a run's results.json and tables from its records (no model calls; works on partial runs).

    With --explain ROW BENCHMARK: where that cell comes from (run id, config hash, dataset fingerprint, models
    with revisions or weight hashes, verifier or judge, seeds, n, n_failed) and the command that reproduces it.
    """
    from reports.report import write_reports

    if explain:
        from reports.explain import explain_cell

        typer.echo(explain_cell(run_dir, *explain))
        return
    write_reports(run_dir)
    typer.echo((run_dir / "table.md").read_text())


@app.command()
def compare(
    base_run: Annotated[Path, typer.Argument(help="The baseline run directory.")],
    cand_run: Annotated[Path, typer.Argument(help="The candidate run directory.")],
    margin: Annotated[
        Optional[float],
        typer.Option("--margin", min=0, help="Points (0-100 scale) a change must clear; default 1."),
    ] = None,
    config: Annotated[
        Optional[Path],
        typer.Option("--config", help="YAML: margin, margins (per BENCHMARK or BENCHMARK.METRIC), n_resamples, "
                     "alpha, seed."),
    ] = None,
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Where compare.md and compare.json go (default: CAND_RUN).")
    ] = None,
) -> None:
    """The regression gate: compare a candidate run with a baseline run of the same table, cell by cell.

    Rows match by label, records by (benchmark, item, repeat). Per cell and declared metric: the difference with a
    paired bootstrap interval over items, McNemar's exact test for strict accuracies, and a verdict (regression
    when the whole interval is below -margin). Failures are counted per cell on both sides. Exit code 1 when any
    cell regresses; 2 when the runs are not comparable (other items, data, verifier or settings: the message
    says which); 3 when a cell cannot be gated (a run still holds failures of the backend that its rerun would
    retry, or no item was scored on both sides); else 0.
    """
    from reports.compare import UNGATED, compare_runs, load_config, render_markdown, write_comparison

    result = compare_runs(base_run, cand_run, load_config(config, margin=margin))
    write_comparison(result, out or cand_run)
    typer.echo(render_markdown(result))
    if result.differences:
        typer.echo("error: runs are not comparable: " + "; ".join(result.differences), err=True)
    ungated = [f"{c.row} / {c.benchmark} {c.metric} ({c.verdict})" for c in result.cells if c.verdict in UNGATED]
    if ungated and not result.differences:
        typer.echo(f"not gated: {len(ungated)} cell(s): {'; '.join(ungated[:5])}{' ...' if len(ungated) > 5 else ''}"
                   "; finish the runs (rerun their commands) and compare again", err=True)
    raise typer.Exit(result.exit_code)


@app.command("lm-eval")
def lm_eval_(
    model: ModelOpt,
    tasks: Annotated[str, typer.Option("--tasks", help="lm-eval task names, comma-separated (gsm8k,arc_easy).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory (results.json, table.md, records).")],
    include_path: Annotated[
        Optional[Path], typer.Option("--include-path", help="A folder of your own lm-eval task YAMLs.")
    ] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="The first N documents per task.")] = None,
    num_fewshot: Annotated[
        Optional[int], typer.Option("--num-fewshot", min=0, help="Few-shot examples (default: each task's).")
    ] = None,
    apply_chat_template: Annotated[
        bool, typer.Option("--apply-chat-template", help="Build each context as a chat (lm-eval's flag: few-shot "
                           "examples as turns); without it a context goes as one user turn.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="lm-eval's seeds and the seeds of sampled requests.")] = 0,
    bootstrap_iters: Annotated[
        int, typer.Option("--bootstrap-iters", min=0, help="lm-eval's bootstrap resamples for standard errors.")
    ] = 1000,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
    tensor_parallel: TpOpt = None,
    data_parallel: DpOpt = None,
    no_cache: NoCacheOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    """Run lm-evaluation-harness tasks on a model through this harness' backends and call cache, with lm-eval's
    own metrics: generate_until on every backend, loglikelihood on hf and vllm.

    Writes OUT/results.json (lm-eval's results), table.md (lm-eval's table), records.jsonl (one logged sample per
    task and document) and manifest.json. A rerun with the same settings is answered by the call cache. Exit code 0
    when every request was answered, 1 when a request failed (rerun to retry), 2 for bad input.
    """
    from harness.lmeval import run_lm_eval

    options = _backend_options(
        base_url=base_url, api_key_env=api_key_env, concurrency=concurrency, timeout=timeout,
        max_attempts=max_attempts, batch_size=batch_size, tensor_parallel_size=tensor_parallel,
        data_parallel_size=data_parallel, dtype=dtype, enforce_eager=enforce_eager,
    )
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    results = run_lm_eval(model, names, out, include_path=include_path, limit=limit, num_fewshot=num_fewshot,
                          chat_template=apply_chat_template, seed=seed, options=options, no_cache=no_cache,
                          overwrite=overwrite, bootstrap_iters=bootstrap_iters)
    typer.echo((out / "table.md").read_text(encoding="utf-8").rstrip())
    summary = json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("summary", {})
    typer.echo(f"{out}: {len(results.get('results', {}))} task(s), {summary.get('records', 0)} documents; "
               f"backend calls: {summary.get('calls', 0)}, cache hits: {summary.get('cache_hits', 0)}")
    if summary.get("ignored_gen_kwargs"):
        typer.echo("generation settings not passed to the backend: " + ", ".join(summary["ignored_gen_kwargs"]))


@app.command()
def train(
    what: Annotated[str, typer.Argument(help="generator | policy | coevolve")],
    config: Annotated[Path, typer.Option("--config", help="YAML training config (training/configs/*.yaml).")],
    output_dir: Annotated[
        Optional[Path], typer.Option("--output-dir", help="Where the checkpoint goes (overrides the config's).")
    ] = None,
    data_dir: Annotated[
        Optional[Path], typer.Option("--data-dir", help="Nectar in DIR/nectar/, as the nectar benchmark reads it "
                                     "(overrides data.data_dir; else the Hub).")
    ] = None,
    max_steps: Annotated[Optional[int], typer.Option("--max-steps", min=1, help="GRPO steps (overrides grpo.max_steps).")] = None,
    rounds: Annotated[Optional[int], typer.Option("--rounds", min=1, help="coevolve: rounds (overrides rounds).")] = None,
    endpoints: EndpointsOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Train a DR-Generator or a DR-Policy with GRPO (TRL) on the DR rewards; the output dir is a plain Hugging
    Face checkpoint (`hf:DIR`, `vllm:DIR` load it) with train_log.jsonl and dr_manifest.json beside it.
    `coevolve` alternates them for --rounds (G1 on P0's sets, P1 with G1, G2 on P1's sets, ...) into
    OUTPUT_DIR/G1, P1, ... with coevolve.json listing every checkpoint and its parents.

    A checkpoint is bound to its settings: rerunning with other settings into the same output dir is refused
    (naming every difference) unless --overwrite discards it. Exit code 0 when the checkpoint was written, 2 for
    bad input (config, data, models, an output dir trained with other settings).
    """
    from harness.errors import ConfigError

    if what not in ("generator", "policy", "coevolve"):
        raise ConfigError(f"harness train {what!r}: expected generator, policy or coevolve")
    try:
        import trl  # noqa: F401
    except ImportError:
        raise ConfigError('training needs TRL: pip install -e ".[hf,train]"') from None
    if what == "coevolve":
        from training.coevolve import coevolve, load_coevolve_config

        co = load_coevolve_config(config, rounds=rounds, output_dir=output_dir, data_dir=data_dir,
                                  max_steps=max_steps)
        co = co.model_copy(update={"models": _served_models(co.models, endpoints)})
        result = coevolve(co, overwrite=overwrite)
        for stage in result["stages"]:
            parents = ", ".join(f"{k} {v}" for k, v in stage["parents"].items())
            shown = f"{stage['name']:<10} {stage['kind']:<9} {stage['status']:<7} {stage['checkpoint']}"
            typer.echo(f"{shown}  ({parents})")
        typer.echo(f"manifest: {co.output_dir}/coevolve.json")
        return
    if rounds is not None:
        raise ConfigError("--rounds is for `harness train coevolve`")
    from training.grpo import load_train_config
    from training.job import train as run_training

    cfg = load_train_config(config, output_dir=output_dir, data_dir=data_dir, max_steps=max_steps)
    cfg = cfg.model_copy(update={"models": _served_models(cfg.models, endpoints)})
    manifest = run_training(what, cfg, overwrite=overwrite)  # type: ignore[arg-type]
    typer.echo(f"{what} checkpoint: {manifest['checkpoint']} ({manifest['data']['rows']} training rows; "
               f"manifest {manifest['checkpoint']}/dr_manifest.json)")
    for step in manifest["reward_history"]:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in step.items() if isinstance(v, float))
        typer.echo(f"  reward: {shown}")


@app.command()
def doctor(
    base_url: Annotated[
        Optional[list[str]], typer.Option("--base-url", help="Also check this OpenAI-compatible server.")
    ] = None,
) -> None:
    """Check the environment: Python, torch, CUDA, vLLM, endpoints, cache dir, embedded models."""
    from harness.commands.doctor import run_doctor

    ok = run_doctor(base_urls=base_url or [], echo=typer.echo)
    if not ok:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------------- list


@list_app.command("models")
def list_models() -> None:
    """Model aliases and the backend kinds that take KIND:NAME specs."""
    from harness.registry import lookup, names

    typer.echo("backend kinds (spec KIND:NAME):")
    for kind in names("backend"):
        doc = (lookup("backend", kind).__doc__ or "").strip().splitlines()[0]
        typer.echo(f"  {kind + ':NAME':<14} {doc}")
    typer.echo("aliases:")
    for alias in names("model"):
        entry = lookup("model", alias)
        typer.echo(f"  {alias:<14} {entry.description} [{entry.license}]")
        typer.echo(f"  {'':<14} {entry.status()}")


@list_app.command("tables")
def list_tables() -> None:
    """Paper tables that `harness run` reproduces."""
    _list_kind("table")


@list_app.command("benchmarks")
def list_benchmarks() -> None:
    """Registered benchmarks: kind, the paper's name, the metrics they declare (headline first), and source."""
    from harness.registry import lookup, names

    for name in names("benchmark"):
        bench = lookup("benchmark", name)
        doc = (type(bench).__doc__ or "").strip().splitlines()
        declared = ",".join(m.name for m in bench.metrics)
        typer.echo(f"{name:<18} {bench.kind:<9} {bench.display:<20} {declared:<15} {doc[0] if doc else ''}")


@list_app.command("evaluators")
def list_evaluators() -> None:
    """Evaluator kinds and their settings; a spec is KIND:key=value,... (e.g. dynamic-rubric:generator=smollm2-135m)."""
    from harness.registry import lookup, names

    for kind in names("evaluator"):
        doc = (lookup("evaluator", kind).__doc__ or "").strip().splitlines()
        typer.echo(f"{kind:<16} {doc[0] if doc else ''}")


def _list_kind(kind: str) -> None:
    from harness.registry import names

    found = names(kind)
    if not found:
        _not_yet(f"list {kind}s")
    for name in found:
        typer.echo(name)


# ---------------------------------------------------------------------------------------------------- cache


@cache_app.command("stats")
def cache_stats() -> None:
    """Entries, size, lifetime hits and misses, entries per model."""
    from harness.cache import CallCache

    s = CallCache().stats()
    typer.echo(f"path:    {s.path}")
    typer.echo(f"entries: {s.entries}")
    typer.echo(f"size:    {s.size_bytes / 1e6:.2f} MB")
    total = s.hits + s.misses
    rate = f" ({s.hits / total:.1%} hit rate)" if total else ""
    typer.echo(f"hits:    {s.hits}{rate}")
    typer.echo(f"misses:  {s.misses}")
    for model, count in s.by_model.items():
        typer.echo(f"  {count:>8}  {model}")


@cache_app.command("clear")
def cache_clear(
    model: Annotated[
        Optional[str], typer.Option("--model", help="Only entries of this KIND:MODEL label.")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete cached calls (all, or one model's); a cache file too corrupt to open is deleted whole."""
    from harness.cache import CacheError, CallCache
    from harness.paths import call_cache_path

    try:
        cache = CallCache()
    except CacheError as exc:
        if not exc.corrupt or model is not None:
            raise
        path = call_cache_path()
        if not yes and not typer.confirm(f"{path} is corrupt and cannot be opened; delete the file?"):
            raise typer.Exit(1) from None
        CallCache.delete_files(path)
        typer.echo(f"deleted the corrupt cache file {path}")
        return
    what = f"entries of {model}" if model else "all entries"
    if not yes and not typer.confirm(f"delete {what} from {cache.path}?"):
        raise typer.Exit(1)
    typer.echo(f"deleted {cache.clear(model=model)} entries")


# ---------------------------------------------------------------------------------------------------- bench


@bench_app.command("api")
def bench_api(
    latency_ms: Annotated[
        float, typer.Option("--latency-ms", min=0.0, help="Server-side latency per request.")
    ] = 100,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 32,
    requests: Annotated[int, typer.Option("--requests", min=1)] = 256,
) -> None:
    """Client throughput against a loopback OpenAI-compatible server: achieved/ideal."""
    from harness.commands.bench_api import format_bench_api, run_bench_api

    typer.echo(
        format_bench_api(run_bench_api(latency_ms=latency_ms, concurrency=concurrency, requests=requests))
    )


@bench_app.command("cache")
def bench_cache(
    model: Annotated[str, typer.Option("--model", "-m", help="Model spec or alias.")] = "smollm2-135m",
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Prompts to generate for.")] = 2,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 32,
) -> None:
    """A cold and a fully cached `harness generate`, each in a fresh process: wall times and their ratio."""
    from harness.commands.bench_cache import format_bench_cache, run_bench_cache

    cold, warm = run_bench_cache(model, prompts=prompts, max_tokens=max_tokens)
    typer.echo(format_bench_cache(cold, warm, model=model, prompts=prompts))


@bench_app.command("verify")
def bench_verify(
    model: ModelOpt,
    items: Annotated[int, typer.Option("--items", min=1, help="Rubric items (up to 10).")] = 6,
    responses: Annotated[int, typer.Option("--responses", min=1, help="Responses (up to 6).")] = 4,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
    throughput: Annotated[
        bool, typer.Option("--throughput/--no-throughput", help="Also measure generation throughput.")
    ] = True,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Throughput: prompts in the one call.")] = 8,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Throughput: tokens per prompt.")] = 64,
) -> None:
    """Compare the verification modes per_item, batched, logprob: calls, tokens, wall time, agreement; then the
    generation throughput (for a vllm: model, against hf: on the same checkpoint)."""
    from harness.commands.bench_verify import bench_verify_sync

    options = _backend_options(base_url=base_url, api_key_env=api_key_env, batch_size=batch_size, dtype=dtype,
                               enforce_eager=enforce_eager)
    typer.echo(bench_verify_sync(model, items=items, responses=responses, options=options, throughput=throughput,
                                 prompts=prompts, max_tokens=max_tokens))


@bench_app.command("reward")
def bench_reward(
    model: Annotated[str, typer.Option("--model", "-m", help="The verifier's model spec or alias.")] = "smollm2-135m",
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """The DR-Generator reward's wall time per call with per_item and with logprob verification on the same
    rubric completions (cache off), and their ratio, measured in one run."""
    from harness.commands.bench_reward import format_bench_reward, run_bench_reward

    options = _backend_options(base_url=base_url, api_key_env=api_key_env, batch_size=batch_size, dtype=dtype)
    typer.echo(format_bench_reward(run_bench_reward(model, options=options), model=model))


@bench_app.command("structured")
def bench_structured(
    model: ModelOpt,
    rubrics: Annotated[int, typer.Option("--rubrics", min=1, help="Rubric samples per condition.")] = 4,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=16, help="The rubric's token budget.")] = 256,
    items: Annotated[int, typer.Option("--items", min=1, help="Rubric items for the verifier tasks (up to 10).")] = 6,
    responses: Annotated[int, typer.Option("--responses", min=1, help="Responses (up to 6).")] = 4,
    base_url: BaseUrlOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = None,
    enforce_eager: EagerOpt = None,
) -> None:
    """Rubric generation and the per_item / batched verifier answers, free and then under their structured-output
    constraint: parse failures, tokens, wall time, decode throughput and its constrained/free ratio, agreement."""
    from harness.commands.bench_structured import bench_structured_sync

    options = _backend_options(base_url=base_url, api_key_env=api_key_env, batch_size=batch_size, dtype=dtype,
                               enforce_eager=enforce_eager)
    typer.echo(bench_structured_sync(model, rubrics=rubrics, max_tokens=max_tokens, items=items,
                                     responses=responses, options=options))


def main() -> None:
    """Console entry point: one-line errors, exit codes, `--debug` tracebacks.

    Exit codes, the same for every verb: 0 everything asked for was evaluated; 1 it ran, but some records could
    not be evaluated (the summary says which and why); 2 bad input, configuration or environment (one `error:`
    line, before any model call where it can be known then); 130 interrupted (what was saved is printed).
    """
    debug = _state["debug"] or "--debug" in sys.argv
    # Whatever a verb prints passes one filter: an API key a backend registered is masked (`harness.redact`).
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        app()
    except Interrupted as exc:
        typer.echo(str(exc), err=True)
        sys.exit(exc.exit_code)
    except HarnessError as exc:
        if debug:
            raise
        typer.echo(f"error: {redact_text(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # a file or disk problem nothing above turned into a HarnessError
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"error: {redact_text(where + (exc.strerror or str(exc)))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted; finished work is saved and a rerun of the same command resumes it", err=True)
        sys.exit(130)
