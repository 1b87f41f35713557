"""The `harness` command line.

One command per verb; heavy libraries (torch, transformers, vllm) are imported inside command bodies so that
`harness --help` stays instant. A `HarnessError` becomes one line on stderr and a non-zero exit code; `--debug` shows
the traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from harness.commands.options import (
    Backend,
    Devices,
    EndpointsOption,
    EvalRun,
    Gate,
    PolicyEval,
    LmEvalRun,
    NoCacheOption,
    Outputs,
    OverwriteOption,
    PromptSet,
    ReplayOption,
    Sampling,
    ScoreRun,
    Supervision,
    TableRun,
    TrainRun,
    WaitOption,
    takes_groups,
)
from harness.errors import (
    HarnessError,
    Interrupted,
    exit_interrupted,
    request_stop,
    saved_line,
)
from harness.redact import RedactingStream, redact_text

app = typer.Typer(
    help="Evaluate and train LLM evaluators and policies with DynamicRubric.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
list_app = typer.Typer(help="List what exists: tables, benchmarks, evaluators, models.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect, clear or export the call cache.", no_args_is_help=True)
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


# ---------------------------------------------------------------------------------------------------- options
# Shared groups (a backend's settings, devices, outputs, sampling, a table run's) are declared once in
# `harness.commands.options`: a verb names a group as one parameter and `@takes_groups` spreads it into options.

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Model spec KIND:NAME or alias (harness list models).")
]


_stopping = {"active": False}


@contextlib.contextmanager
def _stoppable() -> Iterator[None]:
    """Ctrl-C and SIGTERM anywhere in a verb that writes records, outside the loop that handles its own
    (`harness.loop`): while the config, data and models load, before the loop starts, while the backends close
    after it, while the tables render.

    The first signal unwinds the command as Ctrl-C always did (`KeyboardInterrupt`: an open output is marked
    interrupted, the backends close, and local ones do not wait for work in flight: `harness.errors.request_stop`);
    a second one exits at once. Either way, and when the loop raises `Interrupted`, the command ends with one
    `interrupted:` line saying what is saved or that nothing was started (`harness.errors.saved_line`) and exit
    code 130, skipping the interpreter's slow teardown (`harness.errors.exit_interrupted`). A signal the process
    ignores stays ignored; a verb inside another (the panels of `run fig2`) shares the outer one's handling.
    """
    if _stopping["active"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def received(signum: int, frame: object) -> None:
        caught.append(signum)
        if len(caught) == 1:
            request_stop()
            raise KeyboardInterrupt
        exit_interrupted(saved_line())

    previous = {sig: signal.signal(sig, received) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) != signal.SIG_IGN}
    _stopping["active"] = True
    try:
        yield
    except Interrupted as exc:  # the loop's, saying what it saved
        exit_interrupted(str(exc))
    except KeyboardInterrupt:  # this handler's, or Python's own after asyncio removed the loop's handlers
        exit_interrupted(saved_line())
    finally:
        _stopping["active"] = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
            typer.echo(redact_text(f"  {line}"))
    lacking = summary.lacking_lines()
    if lacking:
        typer.echo("what the backends lack (recorded in the manifest):")
        for line in lacking:
            typer.echo(redact_text(f"  {line}"))
    for line in summary.failure_lines(out):
        typer.echo(redact_text(line), err=True)
    if summary.with_failures or summary.missing:
        raise typer.Exit(1)


@app.command()
@takes_groups
def generate(
    model: ModelOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL, one line per (prompt id, sample).")],
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL of {id, prompt | instruction | messages}.")] = None,
    benchmark: Annotated[Optional[str], typer.Option(
        "--benchmark", help="A policy benchmark's prompts: alpaca_eval2, arena_hard_v2, wildbench, writingbench.")
    ] = None,
    bench_option: Annotated[Optional[list[str]], typer.Option(
        "--bench-option", metavar="KEY=VALUE", help="An option of the benchmark's loader, e.g. subset=length "
        "(writingbench) or missing_baseline=skip (arena_hard_v2); repeatable.")] = None,
    show: Annotated[int, typer.Option("--show", min=0, help="Print the first N generated texts.")] = 0,
    *,
    prompt_set: PromptSet,
    sampling: Sampling,
    backend: Backend,
    outputs: Outputs,
) -> None:
    """Sample responses from a model for a prompt file or a benchmark; resumable, cached.

    Exit code 0 when every sample was answered, 1 when some failed (rerun to retry them), 2 for bad input.
    """
    with _stoppable():
        from harness.commands.prompts import generate_samples

        summary = generate_samples(model, out, prompts=prompts, benchmark=benchmark,
                                   data_dir=prompt_set.data_dir, limit=prompt_set.limit, bench_option=bench_option, sampling=sampling, backend=backend,
                                   outputs=outputs)
        if show:
            _show_generations(out, show)
    _finish(summary, str(out))


def _show_generations(out: Path, limit: int) -> None:
    from harness.records import GenerationRecord
    from harness.runstore import RecordLog

    for record in RecordLog(out, GenerationRecord).records()[:limit]:
        text = record.text if record.error is None else f"[failed: {record.error.message}]"
        typer.echo(f"--- {record.id} #{record.sample}\n{(text or '').strip()}")


@app.command()
@takes_groups
def run(
    table: Annotated[str, typer.Argument(help="Table to reproduce (harness list tables).")],
    endpoints: EndpointsOption = None,
    *,
    args: TableRun,
    backend: Backend,
    devices: Devices,
    outputs: Outputs,
) -> None:
    """Reproduce a paper table: rows (evaluators, or policies) x columns (benchmarks) into a run directory.

    Policy tables (table2, table6, table8): each policy answers each benchmark's prompts and the table's judge
    judges the answers (AlpacaEval 2 against the reference, Arena-Hard v2.0 against the category baseline,
    WildBench by checklist, WritingBench per criterion). table3 adds the macro Average of its columns; table5
    crosses the config's generators and verifiers; table7 prints the benchmarks as lines; table9 is the case
    study of one item (--item BENCH:ID); fig2 runs its panels fig2a (evaluators) and fig2b (policies) into
    OUT/fig2a and OUT/fig2b and draws both (figure.png, figure.pdf). Writes records.jsonl, results.json,
    table.md, table.tex and table.csv (with the paper's numbers) and resumes when rerun into the same --out.
    Local models are planned onto the devices before any loads (`harness plan` shows the plan). Exit code 0 when
    every cell was evaluated, 1 when some records hold failures, 2 for bad input (a benchmark that cannot be
    loaded, an evaluator, policy or judge that cannot be built, other settings, models that cannot fit the devices).
    """
    with _stoppable():
        from harness.commands.panels import panels_of, run_panels
        from harness.commands.setup import table_plan

        if panels_of(table):  # a figure of panels (fig2): each panel is a run of its own table
            return run_panels(table, args, lambda name, panel: run.__wrapped__(
                name, endpoints, args=panel, backend=backend, devices=devices, outputs=outputs))
        plan, options, cfg, served = table_plan(table, args, backend, devices, endpoints)
        out_dir = cfg.out or Path("runs") / f"{table}-{cfg.preset}"
        _run_and_report(plan, out_dir, options=options, config={**cfg.model_dump(mode="json"), "gap": args.gap},
                        parallel=cfg.parallel, command="run", outputs=outputs, endpoints=served)


@app.command("plan")
@takes_groups
def plan_(
    table: Annotated[Optional[str], typer.Argument(help="Table to plan (harness list tables); or --train.")] = None,
    train: Annotated[Optional[str], typer.Option(
        "--train", help="Plan a training job instead: generator | policy (--config).")] = None,
    processes: Annotated[Optional[int], typer.Option(
        "--processes", min=1, help="--train: training processes (default: --gpus).")] = None,
    endpoints: EndpointsOption = None,
    *,
    args: TableRun,
    backend: Backend,
    devices: Devices,
) -> None:
    """Plan a run before any model loads; it takes `run`'s options, so the same command line plans that run.

    Shows each row's models; each local model's weight memory (from its config.json: parameters x dtype bytes, an
    MoE model counted whole) and the devices it spans; the phases the run goes through, what is resident in each
    and each vLLM engine's share of a device; the requests and tokens to expect per model. With --train
    generator|policy --config FILE: what one training process puts on its GPU (the trained model's ZeRO-3 share of
    weights, gradients and Adam state, TRL's colocated vLLM, the frozen models it loads). Exit code 2 when the
    models cannot fit the devices, with the numbers and the ways out (`harness run` and `harness train` make the
    same check before their first model call).
    """
    from harness.commands.plan import check_target, show_plan, show_train_plan
    from harness.commands.setup import table_plan

    check_target(table, train=train, processes=processes)
    if train is not None:
        typer.echo("\n".join(show_train_plan(train, args.config, gpus=devices.gpus, gpu_memory=devices.gpu_memory,
                                               processes=processes, endpoints=endpoints)))
        return
    plan, options, _, served = table_plan(table, args, backend, devices, endpoints)
    typer.echo("\n".join(show_plan(plan, options, served)))


@app.command("serve")
@takes_groups
def serve_(
    table: Annotated[str, typer.Argument(help="Table whose local models to serve (harness list tables).")],
    endpoints: Annotated[Path, typer.Option("--endpoints", help="The endpoints file to write (for run|eval|plan "
                                            "--endpoints); the servers' logs go to FILE.logs/.")],
    host: Annotated[str, typer.Option("--host", help="Address the servers listen on.")] = "127.0.0.1",
    start_timeout: Annotated[float, typer.Option("--start-timeout", min=1, help="Seconds every server has to "
                                                 "answer GET /v1/models.")] = 900.0,
    *,
    args: TableRun,
    backend: Backend,
    devices: Devices,
) -> None:
    """Start the vLLM servers a run needs and write the endpoints file that run|eval|plan --endpoints read; it
    takes `run`'s options, so the same command line serves that run's models.

    Every local model of the plan gets a vLLM OpenAI server per replica (replicas, tensor_parallel_size,
    devices, runner and extra arguments from the config's serve:), each replica on GPUs of its own. Once every
    server answers, the endpoints file is written; serve then stays in the foreground until Ctrl-C or SIGTERM,
    which stop every server and remove the file. A reward model read with head=lm-token0 stays local (named on
    the output). Exit code 0 after Ctrl-C or SIGTERM; 2 for bad input, too few GPUs or a server that failed to
    start (its log's last lines are printed; every server is stopped).
    """
    from harness.commands.runner import Prepared, build_models
    from harness.commands.setup import table_plan
    from harness.pool import BackendPool
    from harness.serve import serve

    plan, options, cfg, served = table_plan(table, args, backend, devices)
    pool = BackendPool(options=options, endpoints=served)
    ready = build_models(plan, pool, Prepared())
    serve(pool, cfg.serve, evaluators=ready.evaluators.values(), devices=plan.devices, out=endpoints,
          host=host, start_timeout=start_timeout)


def _run_and_report(plan, out_dir: Path, *, options, config: dict, parallel: int, command: str, outputs: Outputs,
                    endpoints: dict) -> None:
    from harness.commands.runner import prepare, run_plan
    from harness.commands.setup import as_dict, drive
    from harness.pool import BackendPool
    from reports.report import write_reports

    pool = BackendPool(options=options, cache=outputs.call_cache(), endpoints=endpoints)
    ready = prepare(plan, pool)
    summary = drive(pool, lambda: run_plan(
        plan, out_dir, pool, ready=ready, parallel=parallel, command=command,
        config={**config, "backend": as_dict(options), **outputs.recorded()},
        overwrite=outputs.overwrite, wait=outputs.wait, retry_failed=outputs.retry_failed,
    ))
    write_reports(out_dir)
    typer.echo((out_dir / "table.md").read_text(encoding="utf-8"))
    for what, why in ready.unavailable.items():
        typer.echo(f"{what} left out (--skip-unavailable): {why}", err=True)
    _finish(summary, str(out_dir))


@app.command("eval")
@takes_groups
def eval_(
    benchmark: Annotated[str, typer.Option("--benchmark", "-b", help="Benchmark (harness list benchmarks).")],
    evaluator: Annotated[Optional[str], typer.Option(
        "--evaluator", "-e", help="Evaluator benchmarks: the evaluator spec (harness list evaluators).")] = None,
    label: Annotated[Optional[str], typer.Option(
        "--label", help="Row label (default: the evaluator's or policy's spec). `harness compare` matches rows by "
        "label: give a baseline and a candidate checkpoint the same one.")] = None,
    endpoints: EndpointsOption = None,
    *,
    args: EvalRun,
    policy: PolicyEval,
    backend: Backend,
    devices: Devices,
    outputs: Outputs,
) -> None:
    """Run one table cell and print its metrics: an evaluator (-e) on an evaluator benchmark, or a policy
    (--policy) answering a policy benchmark, judged by --judge (no judge for the tasks checked without a model).

    Exit code 0 when every item was evaluated, 1 when some records hold failures, 2 for bad input.
    """
    with _stoppable():
        import hashlib

        from harness.commands.setup import backend_options, eval_plan
        from harness.commands.setup import endpoints as read_endpoints
        from harness.plan import resolve_devices

        plan, spec = eval_plan(benchmark, evaluator, policy, label=label, seeds=args.seeds, seed=args.seed,
                               limit=args.limit, data_dir=args.data_dir,
                               devices=resolve_devices(None, **dataclasses.asdict(devices)))
        config = {"evaluator": evaluator, "label": label, "benchmark": benchmark, "limit": args.limit,
                  "seeds": args.seeds, "data_dir": str(args.data_dir) if args.data_dir else None, "seed": args.seed,
                  "parallel": args.parallel}
        if policy.policy is not None:
            config.update(dataclasses.asdict(policy))
        out = args.out or Path("runs") / f"eval-{benchmark}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"
        _run_and_report(plan, out, options=backend_options(backend), config=config, parallel=args.parallel,
                        command="eval", outputs=outputs,
                        endpoints=read_endpoints(None, endpoints, where="command line"))


@app.command()
@takes_groups
def score(
    evaluator: Annotated[str, typer.Option("--evaluator", "-e", help="Evaluator spec (harness list evaluators).")],
    input: Annotated[Path, typer.Option("--input", "-i", help="JSONL of {id, prompt, responses: [...]}.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL, one line per set: scores + trace.")],
    *,
    args: ScoreRun,
    backend: Backend,
    outputs: Outputs,
) -> None:
    """Score {id, prompt, responses} sets with an evaluator; resumable, cached.

    Each output line holds the scores (None for a response that could not be scored) and the evaluator's trace
    (rubric, verdict matrix, per-item pass rates, failures by category). Exit code 0 when every set was fully
    scored, 1 when some hold failures, 2 for bad input.
    """
    with _stoppable():
        from harness.commands.score import score_file

        summary = score_file(evaluator, input, out, seed=args.seed, parallel=args.parallel, backend=backend,
                             outputs=outputs)
    _finish(summary, str(out))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    explain: Annotated[
        Optional[tuple[str, str]],
        typer.Option("--explain", metavar="ROW BENCHMARK", help="Print one cell's provenance instead."),
    ] = None,
    gap: Annotated[Optional[bool], typer.Option(
        "--gap/--no-gap", help="Print the score-gap columns beside accuracy, or not (default: as `harness run "
        "--gap` recorded).")] = None,
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
    write_reports(run_dir, gap=gap)
    typer.echo((run_dir / "table.md").read_text())


@app.command()
@takes_groups
def compare(
    base_run: Annotated[Path, typer.Argument(help="The baseline run directory.")],
    cand_run: Annotated[Path, typer.Argument(help="The candidate run directory.")],
    *,
    gate: Gate,
) -> None:
    """The regression gate: compare a candidate run with a baseline run of the same table, cell by cell.

    Rows match by label, records by (benchmark, item, repeat). Per cell and declared metric: the difference with a
    paired bootstrap interval over items, McNemar's exact test for strict accuracies, and a verdict (regression
    when the whole interval is below -margin; underpowered when the interval is wider than twice the margin, with
    the items the margin needs). Failures are counted per cell on both sides. A drift canary re-asks a sample of
    BASE_RUN's requests to the models both runs share. Exit code 1 when any cell regresses; 2 when the runs are not
    comparable (other items, data, verifier or settings, or a shared model that no longer answers as BASE_RUN
    stored: the message says which); 3 when a cell cannot be gated (a run still holds failures of the backend
    that its rerun would retry, or no item was scored on both sides; with --require-power, a cell is
    underpowered); else 0. --junit and --summary add reports for CI.
    """
    from harness.commands.canary import check as drift
    from reports.compare import compare_runs, load_config, verdict_lines, write_comparison
    from reports.gate_ci import write_ci_reports

    cfg = load_config(gate.config, margin=gate.margin, require_power=gate.require_power)
    result = compare_runs(base_run, cand_run, cfg)
    drift(result, base_run, cand_run, requests=gate.canary, local=gate.canary_local)
    write_comparison(result, gate.out or cand_run)
    write_ci_reports(result.to_json(), junit=gate.junit, summary=gate.summary)
    for line, to_stderr in verdict_lines(result, base_run, cand_run, gate.out or cand_run):
        typer.echo(line, err=to_stderr)
    raise typer.Exit(result.exit_code)


@app.command()
def view(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    run2: Annotated[Optional[Path], typer.Argument(
        help="A second run of the same table: the page also lists, side by side, the records whose outcome "
        "changed from RUN to RUN2 (the drill-down behind `harness compare`).")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="The HTML file (default: RUN/view.html; with RUN2, RUN2/compare.html).")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the page in the default browser.")] = False,
    data_dir: Annotated[Optional[Path], typer.Option(
        "--data-dir", help="The benchmark files, for prompts and responses (default: the run's).")] = None,
) -> None:
    """Write one self-contained HTML page to look at a run: its table, items, rubrics, verdicts and judgments.

    No model calls and no network: the data is embedded in the page. Outcomes (right, wrong, tie, failed)
    come from each benchmark's declared metric; prompts and responses are read back from the run's data.
    """
    from reports.view import view_runs

    result = view_runs(run, run2, out=out, data_dir=data_dir)
    changed = f", {result.changed} changed" if result.changed is not None else ""
    typer.echo(f"wrote {result.path} ({result.bytes / 1e6:.1f} MB, {result.records} records{changed}) "
               f"in {result.seconds:.1f} s")
    if result.notes:
        typer.echo("note: `harness compare` would not compare these runs (the page pairs what it can): "
                   + "; ".join(result.notes), err=True)
    if open_:
        import webbrowser

        webbrowser.open(result.path.resolve().as_uri())


@app.command("lm-eval")
@takes_groups
def lm_eval_(
    model: ModelOpt,
    tasks: Annotated[str, typer.Option("--tasks", help="lm-eval task names, comma-separated (gsm8k,arc_easy).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory (results.json, table.md, records).")],
    include_path: Annotated[Optional[Path], typer.Option(
        "--include-path", help="A folder of your own lm-eval task YAMLs.")] = None,
    num_fewshot: Annotated[Optional[int], typer.Option(
        "--num-fewshot", min=0, help="Few-shot examples (default: each task's).")] = None,
    apply_chat_template: Annotated[bool, typer.Option(
        "--apply-chat-template", help="Build each context as a chat (lm-eval's flag: few-shot examples as turns); "
        "without it a context goes as one user turn.")] = False,
    bootstrap_iters: Annotated[int, typer.Option(
        "--bootstrap-iters", min=0, help="lm-eval's bootstrap resamples for standard errors.")] = 1000,
    no_cache: NoCacheOption = False,
    replay: ReplayOption = None,
    overwrite: OverwriteOption = False,
    wait: WaitOption = False,
    *,
    args: LmEvalRun,
    backend: Backend,
) -> None:
    """Run lm-evaluation-harness tasks on a model through this harness' backends and call cache, with lm-eval's
    own metrics: generate_until on every backend, loglikelihood on hf, vllm and openai (served by vLLM).

    Writes OUT/results.json (lm-eval's results), table.md (lm-eval's table), records.jsonl (one logged sample per
    task and document) and manifest.json. A rerun with the same settings is answered by the call cache. Exit code 0
    when every request was answered, 1 when a request failed (rerun to retry), 2 for bad input.
    """
    from harness.commands.setup import backend_options
    from harness.lmeval import run_lm_eval, summary_lines

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    run_lm_eval(model, names, out, include_path=include_path, limit=args.limit, num_fewshot=num_fewshot,
                chat_template=apply_chat_template, seed=args.seed, options=backend_options(backend),
                no_cache=no_cache, replay=replay, overwrite=overwrite, wait=wait, bootstrap_iters=bootstrap_iters)
    typer.echo("\n".join(summary_lines(out)))


@app.command()
@takes_groups
def train(
    what: Annotated[str, typer.Argument(help="generator | policy | coevolve | plot")],
    target: Annotated[Optional[Path], typer.Argument(help="plot: the run's output dir.")] = None,
    endpoints: EndpointsOption = None,
    overwrite: OverwriteOption = False,
    *,
    args: TrainRun,
) -> None:
    """Train a DR-Generator or a DR-Policy with GRPO (TRL) on the DR rewards; the output dir is a plain Hugging
    Face checkpoint (`hf:DIR`, `vllm:DIR` load it) with train_log.jsonl, TensorBoard events (runs/),
    training_curves.png and dr_manifest.json beside it. `coevolve` alternates them for --rounds (G1 on P0's sets,
    P1 with G1, G2 on P1's sets, ...) into OUTPUT_DIR/G1, P1, ... with coevolve.json listing every checkpoint and
    its parents. `plot DIR` draws DIR/train_log.jsonl into DIR/training_curves.png. With --seeds N and --control
    shuffled each seed is trained, trained again with each batch's rewards shuffled, and its base weights evaluated
    on the same held-out streams; the pre-registered rule's verdict, the curves and peak memory go to learning.json
    and learning.png. --noise-pilot measures the held-out evaluation's own noise first. Under `accelerate launch --num_processes N` the processes share the job (the main process
    writes everything once).

    A checkpoint is bound to its settings: rerunning with other settings into the same output dir is refused
    (naming every difference) unless --overwrite discards it. Exit code 0 when the checkpoint was written, 2 for
    bad input (config, data, models, an output dir trained with other settings).
    """
    from harness.commands.train import run_train

    run_train(what, target, args, endpoints=endpoints, overwrite=overwrite, echo=typer.echo)


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


def _usable(kind: str) -> Iterator[tuple[str, Any]]:
    """(name, entry) of every entry of `kind` that passes its contract, after a `broken: NAME (why)` line for each
    plugin that does not (`harness.registry`): one broken plugin never hides the others."""
    from harness.registry import broken, lookup, names

    usable = []
    for name in names(kind):
        try:
            usable.append((name, lookup(kind, name)))
        except HarnessError as exc:
            typer.echo(f"broken: {name} ({exc})")
    for name, why in broken(kind):  # a name two plugins claim, or a built-in's a plugin claims too
        typer.echo(f"broken: {name} ({why})")
    yield from usable


@list_app.command("models")
def list_models() -> None:
    """Model aliases and the backend kinds that take KIND:NAME specs."""
    typer.echo("backend kinds (spec KIND:NAME):")
    for kind, backend in _usable("backend"):
        doc = (backend.__doc__ or "").strip().splitlines()[0]
        typer.echo(f"  {kind + ':NAME':<14} {doc}")
    typer.echo("aliases:")
    for alias, entry in _usable("model"):
        typer.echo(f"  {alias:<14} {entry.description} [{entry.license}]")
        typer.echo(f"  {'':<14} {entry.status()}")


@list_app.command("tables")
def list_tables() -> None:
    """Paper tables that `harness run` reproduces."""
    for name, _ in _usable("table"):
        typer.echo(name)


@list_app.command("benchmarks")
def list_benchmarks() -> None:
    """Registered benchmarks: kind, the paper's name, the metrics they declare (headline first), and source."""
    for name, bench in _usable("benchmark"):
        doc = (type(bench).__doc__ or "").strip().splitlines()
        declared = ",".join(m.name for m in bench.metrics)
        typer.echo(f"{name:<18} {bench.kind:<9} {bench.display:<20} {declared:<15} {doc[0] if doc else ''}")


@list_app.command("evaluators")
def list_evaluators() -> None:
    """Evaluator kinds and their settings; a spec is KIND:key=value,... (e.g. dynamic-rubric:generator=smollm2-135m)."""
    for kind, build in _usable("evaluator"):
        doc = (build.__doc__ or "").strip().splitlines()
        typer.echo(f"{kind:<16} {doc[0] if doc else ''}")


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


@cache_app.command("export")
def cache_export(
    run_dirs: Annotated[list[Path], typer.Argument(
        metavar="RUN_DIR", help="Run directories of `harness run` or `harness eval`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The file to write (replaced if it exists).")],
) -> None:
    """Write exactly the calls some runs made (the union of their calls.sqlite) as one small call-cache file, for
    `--replay FILE`; prints the calls per model. Exit code 2 for a directory without calls.sqlite."""
    from harness.calllog import export_calls

    counts = export_calls(run_dirs, out)
    typer.echo(f"wrote {sum(counts.values())} calls of {len(run_dirs)} run(s) to {out}")
    for model, count in counts.items():
        typer.echo(f"  {count:>8}  {model}")


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
@takes_groups
def bench_verify(
    model: ModelOpt,
    items: Annotated[int, typer.Option("--items", min=1, help="Rubric items (up to 10).")] = 6,
    responses: Annotated[int, typer.Option("--responses", min=1, help="Responses (up to 6).")] = 4,
    throughput: Annotated[
        bool, typer.Option("--throughput/--no-throughput", help="Also measure generation throughput.")
    ] = True,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Throughput: prompts in the one call.")] = 8,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Throughput: tokens per prompt.")] = 64,
    *,
    backend: Backend,
) -> None:
    """Compare the verification modes per_item, batched, logprob: calls, tokens, wall time, agreement; then the
    generation throughput (for a vllm: model, against hf: on the same checkpoint)."""
    from harness.commands.bench_verify import bench_verify_sync
    from harness.commands.setup import backend_options

    typer.echo(bench_verify_sync(model, items=items, responses=responses, options=backend_options(backend),
                                 throughput=throughput, prompts=prompts, max_tokens=max_tokens))


@bench_app.command("reward")
@takes_groups
def bench_reward(
    model: Annotated[str, typer.Option("--model", "-m", help="The verifier's model spec or alias.")] = "smollm2-135m",
    *,
    backend: Backend,
) -> None:
    """The DR-Generator reward's wall time per call with per_item and with logprob verification on the same
    rubric completions (cache off), and their ratio, measured in one run."""
    from harness.commands.bench_reward import format_bench_reward, run_bench_reward
    from harness.commands.setup import backend_options

    typer.echo(format_bench_reward(run_bench_reward(model, options=backend_options(backend)), model=model))


@bench_app.command("reward-signal")
@takes_groups
def bench_reward_signal(
    config: Annotated[Path, typer.Option("--config", help="A policy training config (its model, reward and data).")],
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="DATA/nectar/ holds Nectar (else the config's "
                                                     "data.data_dir, else the Hub).")] = None,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="The first N training prompts.")] = 8,
    k: Annotated[int, typer.Option("--k", min=2, help="Completions per prompt (the config's group).")] = 8,
    anchors: Annotated[int, typer.Option("--anchors", min=2, help="Nectar's top-ranked responses scored per "
                                         "prompt for the pair accuracy.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the sampling and the rubrics.")] = 0,
    *,
    backend: Backend,
) -> None:
    """Before any DR training: the reward's signal on a policy config's prompts (zero-spread share, distinct scores
    per group, Spearman between two independently generated rubrics, verifier yes-rate, pair accuracy against
    Nectar's ranks, clipped share) and a go / no-go line against thresholds fixed in the code. Exit 0 for go, 1
    for no-go, 2 for bad input."""
    from harness.commands.bench_signal import format_signal, run_reward_signal
    from harness.commands.setup import backend_options

    signal = run_reward_signal(config, data_dir=data_dir, prompts=prompts, k=k, anchors=anchors,
                               options=backend_options(backend), seed=seed)
    typer.echo(format_signal(signal, config=config, k=k))
    raise typer.Exit(0 if signal.go else 1)


@bench_app.command("structured")
@takes_groups
def bench_structured(
    model: ModelOpt,
    rubrics: Annotated[int, typer.Option("--rubrics", min=1, help="Rubric samples per condition.")] = 4,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=16, help="The rubric's token budget.")] = 256,
    items: Annotated[int, typer.Option("--items", min=1, help="Rubric items for the verifier tasks (up to 10).")] = 6,
    responses: Annotated[int, typer.Option("--responses", min=1, help="Responses (up to 6).")] = 4,
    *,
    backend: Backend,
) -> None:
    """Rubric generation and the per_item / batched verifier answers, free and then under their structured-output
    constraint: parse failures, tokens, wall time, decode throughput and its constrained/free ratio, agreement."""
    from harness.commands.bench_structured import bench_structured_sync
    from harness.commands.setup import backend_options

    typer.echo(bench_structured_sync(model, rubrics=rubrics, max_tokens=max_tokens, items=items,
                                     responses=responses, options=backend_options(backend)))


@bench_app.command("supervision")
@takes_groups
def bench_supervision(*, run: Supervision, backend: Backend) -> None:
    """One GRPO step's reward under each supervision method (scalar RM, plain and w/ responses; static rubric,
    generated in the step and amortised; DynamicRubric per_item, batched, logprob) on the same response sets: calls,
    prompt and completion tokens, compute (active parameters x tokens) and wall time, each as a ratio to the scalar
    RM measured in the same run (call cache off); at paper scale the plan's estimate, marked as such."""
    from harness.commands.bench_supervision import bench_supervision as run_bench
    from harness.commands.setup import backend_options

    typer.echo(run_bench(preset=run.preset, measure_it=run.measure, estimate_it=run.estimate,
                         options=backend_options(backend), groups=run.groups, group_size=run.group_size,
                         repeats=run.repeats, epochs=run.epochs, grpo_log=run.grpo_log, **run.models()))


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
    except Interrupted as exc:  # what the verbs that write records do not end themselves (`_stoppable`)
        exit_interrupted(str(exc))
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
    except KeyboardInterrupt:  # outside any verb (typer turns one inside a verb into a silent exit 130)
        exit_interrupted(saved_line())
