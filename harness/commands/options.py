"""The command line's shared options, each declared once (as inspect_ai's `_cli/common.py` declares its common
options): a verb names a group as one parameter and `@takes_groups` spreads it into the group's options.

- `Backend`: every `BackendOptions` field as `--field-name` (the same keys as a config's `backend:`); the verb gets
  the values given, `None` meaning "not given" (the config's value, else the default).
- `Devices`: the GPUs the local models share (`--gpus`, `--gpu-memory`); `EndpointsOption` names the models served
  elsewhere (`--endpoints`).
- `Outputs`: how a resumable output is written (`--no-cache`, `--overwrite`, `--wait`, `--retry-failed`) and where
  its calls are answered (`--replay FILE`).
- Run options (`--limit`, `--seeds`, `--seed`, `--data-dir`, `--out`, `--parallel`, `--preset`, `--coevolve`): a
  `RunConfig` field each, declared there (type, minimum, help from the field's docstring); a group takes one with
  `run_option(default)`, so every verb shows the same option with its own default.
- `Sampling`: how `generate` samples (`--n`, `--temperature`, `--top-p`, `--max-tokens`, `--stop`, `--seed`).
- `TableRun`: what `run` reads besides the backend; `plan` and `serve` take the same, so one command line with the
  verb changed plans or serves that run.
- `EvalRun`, `ScoreRun`, `PromptSet`, `LmEvalRun`: the run options of `eval`, `score`, `generate` and `lm-eval`.
- `TrainRun`: what `train` reads: the config and what overrides it, the held-out evaluation and the learning
  comparison (`--seeds`, `--control`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from harness.backends.base import BackendOptions
from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.cache import CallCache

EndpointsOption = Annotated[Optional[Path], typer.Option(
    "--endpoints", help="YAML/JSON `models:` file (harness serve writes one): each model spec named there is served by "
    "its own OpenAI-compatible server(s) instead of loading here.")]
OverwriteOption = Annotated[bool, typer.Option(
    "--overwrite", help="Discard an existing output (e.g. one made with other settings).")]
NoCacheOption = Annotated[bool, typer.Option("--no-cache", help="Bypass the call cache (nothing read or written).")]
JudgeUrlOption = Annotated[Optional[str], typer.Option(
    "--judge-base-url", help="Policy runs: the judge's OpenAI-compatible server URL.")]
JudgeKeyOption = Annotated[Optional[str], typer.Option(
    "--judge-api-key-env", help="Policy runs: the environment variable holding the judge's API key.")]
ReplayOption = Annotated[Optional[Path], typer.Option(
    "--replay", metavar="FILE", help="Answer every model call from FILE (`harness cache export` writes one), read "
    "only: no model loads and no server is contacted; a call FILE lacks stops the command (exit 2), keeping what "
    "was finished. Not with --no-cache.")]
WaitOption = Annotated[bool, typer.Option(
    "--wait", help="If another process is writing the output, wait for it instead of failing.")]


class Backend(dict):
    """The `BackendOptions` values given on the command line (field name -> value)."""


def _finite(value: Optional[float]) -> Optional[float]:
    """A float option's value where it is a finite number (click's `min` lets `inf` through; nan fails it).

    Raises:
        typer.BadParameter: for inf.
    """
    import math

    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def run_option(default: Any = None, *, shown: str | None = None) -> Any:
    """A group's field that is the command-line option of `RunConfig`'s field of the same name: its flag
    (`--field-name`), type, minimum and help come from there (`_run_option`); `default` is the verb's, `shown`
    what `--help` says of a None default."""
    return dataclasses.field(default=default, metadata={"run_config": True, "shown": shown})


@dataclass(frozen=True)
class Devices:
    gpus: Annotated[Optional[int], typer.Option(
        "--gpus", min=1, help="GPUs the local models share (default: the config's devices:, else what nvidia-smi "
        "lists; none on a CPU machine). With --gpu-memory the run is planned to fit.")] = None
    gpu_memory: Annotated[Optional[float], typer.Option(
        "--gpu-memory", min=1, callback=_finite, help="GiB of one GPU (with --gpus).")] = None


@dataclass(frozen=True)
class Outputs:
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Bypass the call cache (nothing read or written; a "
                                           "run directory records no calls.sqlite).")] = False
    overwrite: OverwriteOption = False
    wait: WaitOption = False
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Also redo records with parse failures (cached outputs are re-read, not re-asked).")] = (
        False)
    replay: ReplayOption = None

    def __post_init__(self) -> None:
        if self.replay is not None and self.no_cache:
            raise ConfigError("--replay and --no-cache exclude each other: a replay answers every call from its file")

    def call_cache(self) -> CallCache | None:
        """The call cache asked for: the user's, none (`--no-cache`), or FILE read-only (`--replay FILE`).

        Raises:
            CacheError: for a cache or replay file that cannot be opened.
        """
        from harness.cache import CallCache

        if self.no_cache:
            return None
        return CallCache(self.replay, read_only=True) if self.replay is not None else CallCache()

    def recorded(self) -> dict[str, Any]:
        """What the manifest's config records of the cache: `no_cache`, and `replay` where given."""
        return {"no_cache": self.no_cache, **({"replay": str(self.replay)} if self.replay is not None else {})}


@dataclass(frozen=True)
class Sampling:
    n: Annotated[int, typer.Option("--n", min=1, help="Samples per prompt.")] = 1
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 1.0
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 512
    stop: Annotated[Optional[list[str]], typer.Option(
        "--stop", help="A stop string: the text ends before it (repeatable).")] = None
    seed: int = run_option(0)


@dataclass(frozen=True)
class TableRun:
    """`run`'s options: None is "not given" (the config's value, else the table's)."""

    preset: Optional[str] = run_option(shown="the config's, else paper")
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="YAML settings; unknown keys are errors.")] = None
    limit: Optional[int] = run_option()
    seeds: Optional[int] = run_option(shown="the config's, else the table's")
    data_dir: Optional[Path] = run_option()
    out: Optional[Path] = run_option(shown="the config's, else runs/TABLE-PRESET")
    seed: Optional[int] = run_option(shown="the config's, else 0")
    parallel: Optional[int] = run_option(shown="the config's, else 8; policy tables 32")
    judge: Annotated[Optional[str], typer.Option(
        "--judge", help="Policy tables: the judge model spec (default: the preset's).")] = None
    judge_base_url: JudgeUrlOption = None
    judge_api_key_env: JudgeKeyOption = None
    bench_option: Annotated[Optional[list[str]], typer.Option(
        "--bench-option", metavar="BENCH.KEY=VALUE", help="A benchmark loader's option, e.g. "
        "writingbench.subset=length or arena_hard_v2.missing_baseline=skip (repeatable).")] = None
    skip_unavailable: Annotated[bool, typer.Option(
        "--skip-unavailable", help="Leave out benchmarks that cannot be loaded and rows that cannot be built (shown "
        "as dashes) instead of stopping.")] = False
    item: Annotated[Optional[list[str]], typer.Option(
        "--item", metavar="BENCH:ID", help="Run just this item (repeatable; table9: the case study's one item).")] = (
        None)
    coevolve: Optional[Path] = run_option()
    gap: Annotated[bool, typer.Option(
        "--gap", help="Evaluator tables: also print the score gap (mean score(preferred) - score(other)) after each "
        "benchmark's accuracy; the paper's rows print dashes there. Recorded in the run: `harness report` keeps "
        "it. results.json holds the gap either way.")] = False

    def overrides(self, table: str) -> dict[str, Any]:
        """The run config's fields given here (`harness.config.load_run_config` puts them over the file's)."""
        from harness.config import items_option

        return {"table": table, "items": items_option(self.item), **{
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("run_config")}}

    def judge_given(self) -> dict[str, str | None]:
        return {"judge": self.judge, "base_url": self.judge_base_url, "api_key_env": self.judge_api_key_env}


@dataclass(frozen=True)
class EvalRun:
    """`eval`'s run options: one evaluator on one benchmark, no table to take defaults from."""

    limit: Optional[int] = run_option()
    seeds: int = run_option(1)
    data_dir: Optional[Path] = run_option()
    out: Optional[Path] = run_option(shown="runs/eval-BENCHMARK-<hash of the evaluator spec>")
    seed: int = run_option(0)
    parallel: int = run_option(8)


@dataclass(frozen=True)
class PolicyEval:
    """`eval`'s policy options: one policy's answers to one policy benchmark, judged, without a table."""

    policy: Annotated[Optional[str], typer.Option(
        "--policy", help="Policy benchmarks: the policy's model spec (instead of --evaluator).")] = None
    judge: Annotated[Optional[str], typer.Option(
        "--judge", help="Policy benchmarks: the judge's model spec (none for tasks checked without a model: "
        "math500, mmlu_pro, codescope).")] = None
    judge_base_url: JudgeUrlOption = None
    judge_api_key_env: JudgeKeyOption = None
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", min=1, help="The policy's answer budget in tokens (default 4096).")] = None
    temperature: Annotated[Optional[float], typer.Option(
        "--temperature", min=0.0, help="The policy's sampling temperature (default 0).")] = None

    def judge_options(self) -> dict[str, str]:
        """The judge's own `BackendOptions` fields given here."""
        return {k: v for k, v in (("base_url", self.judge_base_url), ("api_key_env", self.judge_api_key_env))
                if v is not None}

    def generation(self) -> dict[str, Any]:
        """The `harness.commands.runner.Generation` fields given here."""
        return {k: v for k, v in (("max_tokens", self.max_tokens), ("temperature", self.temperature))
                if v is not None}


@dataclass(frozen=True)
class Supervision:
    """`bench supervision`'s options: the models of each method, the step's size, and what to measure."""

    preset: Annotated[str, typer.Option("--preset", help="cpu (smollm2-135m in every role, measured) | paper "
                                        "(the paper's models: the plan's estimate unless --measure).")] = "cpu"
    reward_model: Annotated[Optional[str], typer.Option(
        "--reward-model", help="The scalar RM (default: the preset's).")] = None
    head: Annotated[Optional[str], typer.Option("--head", help="The RM's head: classifier | lm-token0.")] = None
    large_reward_model: Annotated[Optional[str], typer.Option(
        "--large-reward-model", help="A second, larger scalar RM (lm-token0; paper: Nemotron-70B).")] = None
    generator: Annotated[Optional[str], typer.Option("--generator", help="The DR-Generator.")] = None
    static_generator: Annotated[Optional[str], typer.Option(
        "--static-generator",
        help="The static (RaR) rubric's generator (paper: Qwen3-235B-A22B-Instruct-2507).")] = None
    verifier: Annotated[Optional[str], typer.Option("--verifier", help="The rubric verifier.")] = None
    gen_max_tokens: Annotated[Optional[int], typer.Option(
        "--gen-max-tokens", min=43, help="The rubric's token budget.")] = None
    groups: Annotated[int, typer.Option("--groups", min=1, help="Prompts in the step (up to 2).")] = 2
    group_size: Annotated[int, typer.Option("--group-size", min=2, help="Completions per prompt (up to 4).")] = 4
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Measure every method's step this many times "
                                         "in turn; wall time is the median.")] = 1
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="Epochs the amortised static rubric is spread "
                                        "over (made once per prompt before training).")] = 1
    grpo_log: Annotated[Optional[Path], typer.Option(
        "--grpo-log", help="A policy run's directory (harness train policy): the reward's share of its GRPO steps, "
        "and each measured method's projected share.")] = None
    measure: Annotated[bool, typer.Option("--measure", help="Run the models (the default on cpu).")] = False
    estimate: Annotated[bool, typer.Option("--estimate", help="Print the plan's estimate, running no model (the "
                                           "default on paper).")] = False

    def models(self) -> dict[str, Any]:
        """The models and budget given here (None: the preset's)."""
        return {k: getattr(self, k) for k in ("reward_model", "head", "large_reward_model", "generator",
                                              "static_generator", "verifier", "gen_max_tokens")}


def _path(flag: str, help: str) -> Any:
    """An optional path option: `Optional[Path]` with its flag and help."""
    return Annotated[Optional[Path], typer.Option(flag, help=help)]


@dataclass(frozen=True)
class Gate:
    """`compare`'s options: the margins, the outputs, power and the drift canary."""

    margin: Annotated[Optional[float], typer.Option(
        "--margin", min=0, help="Points (0-100 scale) a change must clear; default 1.")] = None
    config: _path("--config", "YAML: margin, margins (per BENCHMARK or BENCHMARK.METRIC), n_resamples, alpha, seed, "
                  "require_power, canary_min_agreement.") = None
    out: _path("--out", "Where compare.md and compare.json go (default: CAND_RUN).") = None
    junit: _path("--junit", "Also write the verdicts as JUnit XML for a CI test report, one test per cell.") = None
    summary: _path("--summary", 'Also write a short Markdown summary for a CI step summary or a PR comment '
                   '(--summary "$GITHUB_STEP_SUMMARY").') = None
    require_power: Annotated[bool, typer.Option(
        "--require-power", help="Exit 3 when a cell is underpowered: its interval is wider than twice its margin, "
        "so a change of the margin could have gone unseen.")] = False
    canary: Annotated[int, typer.Option(
        "--canary", min=0, metavar="N", help="Re-ask N of BASE_RUN's stored greedy requests to the models both runs "
        "share (verifier, judge), without the cache; below canary_min_agreement (--config) the runs are not "
        "comparable (exit 2). 0 skips it.")] = 32
    canary_local: Annotated[bool, typer.Option(
        "--canary-local", help="Also re-ask models identified by their weights (left out by default).")] = False


@dataclass(frozen=True)
class ScoreRun:
    """`score`'s run options (its `--out` is the output file, not a run directory)."""

    seed: int = run_option(0)
    parallel: int = run_option(8)


@dataclass(frozen=True)
class PromptSet:
    """Which prompts `generate` reads from a benchmark (its `--seed` is `Sampling`'s)."""

    data_dir: Optional[Path] = run_option()
    limit: Optional[int] = run_option()


@dataclass(frozen=True)
class LmEvalRun:
    """`lm-eval`'s run options (its `--out` is required)."""

    limit: Optional[int] = run_option()
    seed: int = run_option(0)


@dataclass(frozen=True)
class TrainRun:
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="YAML training config (training/configs/*.yaml).")] = None
    output_dir: Annotated[Optional[Path], typer.Option(
        "--output-dir", help="Where the checkpoint goes (overrides the config's).")] = None
    data_dir: Annotated[Optional[Path], typer.Option(
        "--data-dir", help="Nectar in DIR/nectar/, as the nectar benchmark reads it (overrides data.data_dir; else "
        "the Hub).")] = None
    max_steps: Annotated[Optional[int], typer.Option(
        "--max-steps", min=1, help="GRPO steps (overrides grpo.max_steps).")] = None
    eval_every: Annotated[Optional[int], typer.Option(
        "--eval-every", min=1, help="Evaluate the held-out split (data.heldout) at step 0, every K steps and at the "
        "end (overrides eval_every).")] = None
    seeds: Annotated[int, typer.Option(
        "--seeds", min=1, help="Train N seeds (grpo.seed + 0..N-1) into OUTPUT_DIR/seed<S>, each in a process of "
        "its own, and compare their held-out scores (learning.json, learning.png).")] = 1
    control: Annotated[Optional[str], typer.Option(
        "--control", metavar="shuffled[,lr0]", help="shuffled: also train each seed with each batch's rewards "
        "shuffled (OUTPUT_DIR/seed<S>-shuffled), evaluate the base weights on every evaluation's stream "
        "(seed<S>-base) and apply the pre-registered rule (training.learning) to the paired held-out gains. "
        "shuffled,lr0: also train each seed at learning rate 0 (seed<S>-lr0), whose scores must equal the base "
        "weights', prompt by prompt.")] = None
    noise_pilot: Annotated[bool, typer.Option(
        "--noise-pilot", help="generator, policy: train nothing; evaluate the base weights on the held-out "
        "streams of steps 0 and 1 against one set of fixed rubrics and print the spread of the per-prompt "
        "differences, what a learning comparison has to beat (OUTPUT_DIR/noise-pilot/noise.json).")] = False
    rounds: Annotated[Optional[int], typer.Option(
        "--rounds", min=1, help="coevolve: rounds (overrides rounds).")] = None
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="generator, policy: read and filter the data and print each rule's drops, the rows, the "
        "reward and the steps (and the passes over the data they make); load and train nothing.")] = False


def _backend_parameters() -> list[tuple[str, Any, Any]]:
    """(name, annotation, default) of an option per `BackendOptions` field, all defaulting to None."""
    hints = typing.get_type_hints(BackendOptions)
    found = []
    for f in dataclasses.fields(BackendOptions):
        kind = next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name])
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        if kind is bool:
            option = typer.Option(f"{flag}/--no-{flag[2:]}", help=f.metadata["help"], show_default=False,
                                  rich_help_panel="Backend (a config's backend:)")
        else:
            option = typer.Option(flag, help=f.metadata["help"], min=f.metadata["min"], show_default=False,
                                  rich_help_panel="Backend (a config's backend:)")
        found.append((f.name, Annotated[Optional[kind], option], None))
    return found


def _run_option(f: dataclasses.Field) -> Any:
    """The annotation of a group's `run_option` field: the option of `RunConfig`'s field of that name, its type
    (a `Literal` read as `str`, checked when the config is built), minimum (`ge`) and help (its docstring).

    Raises:
        TypeError: when `RunConfig` has no such field, or the field has no docstring.
    """
    from harness.config import RunConfig

    declared = RunConfig.model_fields.get(f.name)
    if declared is None or not declared.description:
        raise TypeError(f"run_option {f.name!r}: RunConfig has no field of that name with a docstring")
    kind = declared.annotation
    if typing.get_origin(kind) is typing.Literal:
        kind = str
    kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
    minimum = next((m.ge for m in declared.metadata if hasattr(m, "ge")), None)
    shown = f.metadata["shown"] if f.default is None else True
    option = typer.Option("--" + f.name.replace("_", "-"), min=minimum, help=" ".join(declared.description.split()),
                          show_default=shown or False)
    return Annotated[Optional[kind] if f.default is None else kind, option]


_PANELS = {Devices: "Devices", Outputs: "Outputs"}


def _group_parameters(group: type) -> list[tuple[str, Any, Any]]:
    if group is Backend:
        return _backend_parameters()
    hints = typing.get_type_hints(group, include_extras=True)
    found = []
    for f in dataclasses.fields(group):
        if f.metadata.get("run_config"):
            found.append((f.name, _run_option(f), f.default))
            continue
        annotation = hints[f.name]
        if group in _PANELS:
            kind, option = typing.get_args(annotation)
            option = copy.copy(option)
            option.rich_help_panel = _PANELS[group]
            annotation = Annotated[kind, option]
        found.append((f.name, annotation, f.default))
    return found


GROUPS = (Backend, Devices, Outputs, Sampling, TableRun, EvalRun, PolicyEval, Gate, ScoreRun, PromptSet, LmEvalRun, TrainRun,
          Supervision)


def takes_groups(verb: Callable) -> Callable:
    """Spread each parameter of `verb` annotated with a group (`GROUPS`) into the group's options, and hand the
    verb the group built from their values."""
    signature = inspect.signature(verb, eval_str=True)
    params: list[inspect.Parameter] = []
    spread: dict[str, tuple[type, list[str]]] = {}
    for p in signature.parameters.values():
        if p.annotation not in GROUPS:
            params.append(p)
            continue
        names = []
        for name, annotation, default in _group_parameters(p.annotation):
            names.append(name)
            params.append(inspect.Parameter(f"{p.name}__{name}", inspect.Parameter.KEYWORD_ONLY,
                                            default=default, annotation=annotation))
        spread[p.name] = (p.annotation, names)
    taken = [p.name for p in params]
    if len(set(taken)) != len(taken):
        raise TypeError(f"{verb.__name__}: option names collide: {taken}")

    @functools.wraps(verb)
    def wrapper(*args, **kwargs):
        for param, (group, names) in spread.items():
            values = {name: kwargs.pop(f"{param}__{name}") for name in names}
            kwargs[param] = (Backend({k: v for k, v in values.items() if v is not None}) if group is Backend
                             else group(**values))
        return verb(*args, **kwargs)

    # Keyword-only parameters after positional ones with defaults are fine for typer (it reads names, not order).
    wrapper.__signature__ = signature.replace(parameters=sorted(params, key=lambda p: p.kind))
    return wrapper
