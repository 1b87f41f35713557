"""`harness plan TABLE`: what a run needs before any model loads: models, memory, phases, requests and tokens.

For every row: the models it calls. For every local model (`hf:`, `vllm:`): its parameters and weight memory from
its `config.json` (`harness.weights`), the devices it spans and what it takes of each (`harness.plan`). The phases
the run goes through (`harness.schedule`): what is resident in each, what each vLLM engine gets of a device, what
is released after it. For every model: the requests and tokens to expect, from the benchmarks' sizes (loaded as the
run loads them; a benchmark that cannot be loaded is named and left out of the counts) and each evaluator's call
pattern. Token counts are estimates: four characters a token for what is read, the budget for what is written
(an upper bound); a rubric is assumed to hold `RUBRIC_ITEMS` items. A plan that does not fit is refused with the
numbers and the ways out, as `run` refuses it; so is a row that cannot be built and an endpoint that names no model
of the run (the check `run` makes: `harness.commands.runner.build_models`).

Each local vLLM engine's `max_model_len` is the run's longest request of it (`harness.contexts`: the loaded items
counted with its tokenizer, the templates and a re-ask's first answer, plus the completion budget), and with
devices its memory is printed term by term (`harness.vllm_memory`); the engine starts with exactly the numbers
printed for it in its phase (`max_model_len`, `max_num_seqs`, `max_num_batched_tokens`, `kv_cache_memory_bytes`,
`gpu_memory_utilization`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4
RUBRIC_ITEMS = 8
"""Items assumed per generated rubric (the generator decides; the schema allows up to 20)."""
TEMPLATE_TOKENS = 200
"""A prompt template's own words around what it quotes."""
JUDGE_CALLS = {"alpaca_eval2": 1, "arena_hard_v2": 2, "wildbench": 1}
"""Judge requests per policy answer; WritingBench asks one per criterion, the checkers none."""


@dataclass(slots=True)
class Traffic:
    """Requests and tokens expected of one model."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, requests: int, prompt_chars: float, completion: int) -> None:
        self.requests += requests
        self.prompt_tokens += int(prompt_chars / CHARS_PER_TOKEN) + requests * TEMPLATE_TOKENS
        self.completion_tokens += completion


def _tokens(text: str) -> float:
    return len(text) / CHARS_PER_TOKEN


def evaluator_traffic(evaluator: Any, items: Sequence[Any], repeats: int, key: Any,
                      into: dict[str, Traffic]) -> None:
    """Add what scoring `items` `repeats` times with `evaluator` asks of each model (`key(backend)`: its pool
    key)."""
    kind = evaluator.spec.partition(":")[0]
    for item in items:
        k = len(item.responses)
        shown = len(item.prompt) + sum(map(len, item.responses))
        if kind in ("dynamic-rubric", "static-rubric"):
            seen = shown if kind == "dynamic-rubric" else len(item.prompt)
            into[key(evaluator.generator)].add(repeats, repeats * seen, repeats * evaluator.gen_max_tokens)
            per_response = [len(item.prompt) + len(r) for r in item.responses]
            if evaluator.mode == "batched":
                into[key(evaluator.verifier)].add(repeats * k, repeats * sum(per_response),
                                                         repeats * k * RUBRIC_ITEMS * 4)
            else:  # per_item (one answer token each) and logprob (one position each) ask M x K questions
                into[key(evaluator.verifier)].add(repeats * k * RUBRIC_ITEMS,
                                                         repeats * RUBRIC_ITEMS * sum(per_response),
                                                         repeats * k * RUBRIC_ITEMS)
        elif kind == "scalar-rm":
            seen = [shown if evaluator.with_responses else len(item.prompt) + len(r) for r in item.responses]
            into[key(evaluator.backend)].add(repeats * k, repeats * sum(seen), 0)
        elif kind == "pairwise-judge":
            pairs = k * (k - 1)  # every pair in both orders
            into[key(evaluator.backend)].add(repeats * pairs, repeats * pairs * shown / max(1, k / 2),
                                                  repeats * pairs * evaluator.settings["max_tokens"])


def policy_traffic(policy: str, judge: str | None, bench: str, items: Sequence[Any], repeats: int,
                   max_tokens: int, into: dict[str, Traffic]) -> None:
    """Add what answering `items` with `policy` and judging the answers asks of each model."""
    for item in items:
        prompt = sum(len(m.content) for m in item.messages)
        into[policy].add(repeats, repeats * prompt, repeats * max_tokens)
        if judge is None:
            continue
        calls = len(item.meta.get("criteria", ())) if bench == "writingbench" else JUDGE_CALLS.get(bench, 0)
        quoted = prompt + max_tokens * CHARS_PER_TOKEN + len(str(item.meta.get("reference", "")))
        quoted += len(str(item.meta.get("baseline", "")))
        into[judge].add(repeats * calls, repeats * calls * quoted, repeats * calls * 64)


def traffic(plan: Any, ready: Any, pool: Any) -> dict[str, Traffic]:
    """Pool key -> the requests and tokens the whole plan expects (see the module docstring)."""
    found: dict[str, Traffic] = defaultdict(Traffic)
    judge = pool.key_of(ready.judge_backend) if ready.judge_backend is not None else None
    for bench, items in ready.items.items():
        if plan.policy:
            for spec, backend in ready.policies.items():
                policy_traffic(pool.key_of(backend), judge, bench, items, plan.seeds, plan.generation.max_tokens,
                               found)
        else:
            for evaluator in ready.evaluators.values():
                evaluator_traffic(evaluator, items, plan.seeds, pool.key_of, found)
    return dict(found)


def render(plan: Any, ready: Any, scheduled: Any, pool: Any, flows: Mapping[str, Traffic],
           unavailable: Mapping[str, str]) -> list[str]:
    """The plan as the lines `harness plan` prints."""
    devices = plan.devices
    lines = [f"plan: {plan.table} ({len(plan.rows)} rows, {len(ready.items)} benchmarks, {plan.seeds} repeats)"]
    if devices is None:
        lines.append("devices: none given (no --gpus/--gpu-memory, no devices:, no GPU found): unbounded, one phase")
    else:
        free = f" ({devices.free_gib:.1f} GiB free)" if devices.free_gib is not None else ""
        lines.append(f"devices: {devices.gpus} x {devices.gpu_memory_gib:g} GiB{free}; engines may take "
                     f"{devices.budget_gib:.1f} GiB of each together; at least {devices.kv_cache_gib:g} GiB of "
                     "cache per engine and device")
    lines += ["", "rows:"]
    for label, spec in plan.rows.items():
        lines.append(f"  {label}: {spec}")
        if spec not in ready.needs:
            why = next((v for k, v in ready.unavailable.items() if k.endswith(f" {spec}")), "not built")
            lines.append(f"    left out: {why}")
            continue
        keys = sorted(ready.needs[spec])
        lines.append(f"    models: {', '.join(_where(pool, k) for k in keys) or 'none (checked without a model)'}")
    lines += ["", "local models (weights from config.json: parameters x dtype bytes; MoE counted whole):"]
    for m in scheduled.models.values():
        lines.append(f"  {m.key}: {m.params / 1e9:.2f}B parameters, {m.dtype}, {m.weights_gib:.1f} GiB; "
                     f"spans {m.devices} device(s), {m.per_device_gib:.1f} GiB on each")
        if m.key in scheduled.contexts:
            lines.append(f"    {scheduled.contexts[m.key].describe()}")
        if m.engine is not None:
            lines.append(f"    vLLM engine: {m.engine.describe()}")
    if not scheduled.models:
        lines.append("  none: every model the rows call is served" if ready.needs else "  none: no row was built")
    lines += ["", "phases:"]
    for i, phase in enumerate(scheduled.phases, start=1):
        rows = [label for label, spec in plan.rows.items() if scheduled.row_phase.get(spec) == i - 1]
        load = sum(scheduled.models[k].per_device_gib for k in phase.models if k in scheduled.models)
        budget = f" of {devices.budget_gib:.1f}" if devices is not None else ""
        lines.append(f"  {i}. rows: {', '.join(rows)}")
        lines.append(f"     resident: {', '.join(sorted(phase.models)) or 'no local model'} "
                     f"({load:.1f}{budget} GiB per device)")
        for key in sorted(phase.models):
            if getattr(pool.backend(key).backend, "kind", "") == "vllm":
                lines.append(f"     {key} starts with {engine_numbers(pool.backend(key).backend.options)}")
        if phase.release_after:
            lines.append(f"     then released: {', '.join(sorted(phase.release_after))}")
    lines += ["", "requests and tokens (estimates: 4 characters a token read, the budget written; "
              f"{RUBRIC_ITEMS} items a rubric):"]
    for spec, t in sorted(flows.items()):
        lines.append(f"  {spec}: {t.requests:,} requests, ~{t.prompt_tokens:,} prompt tokens, "
                     f"<= {t.completion_tokens:,} completion tokens")
    for what, why in unavailable.items():
        lines.append(f"  {what} not counted: {why}")
    return lines


def engine_numbers(options: Any) -> str:
    """The numbers a vLLM engine starts with (`harness.backends.vllm_backend.llm_kwargs`), as `plan` prints them;
    a number left to vLLM is said so."""
    from harness.backends.vllm_backend import ENGINE_NUMBERS
    from harness.vllm_memory import GIB

    shown = [f"tensor_parallel_size {options.tensor_parallel_size or 1}",
             f"gpu_memory_utilization {options.gpu_memory_utilization}"]
    for name in ENGINE_NUMBERS:
        value = getattr(options, name)
        if value is None:
            shown.append(f"{name} vLLM's default")
        elif name == "kv_cache_memory_bytes":
            shown.append(f"{name} {value} ({value / GIB:.2f} GiB)")
        else:
            shown.append(f"{name} {value}")
    return ", ".join(shown)


def _where(pool: Any, key: str) -> str:
    backend = pool.backend(key)
    return f"{key} (local)" if backend.local else f"{key} (served)"


def check_target(table: str | None, *, train: str | None, processes: int | None) -> None:
    """Refuse a `harness plan` command line that names no plan, or two: a table or `--train`, not both, and
    `--processes` only with `--train`.

    Raises:
        ConfigError: naming the flags at odds.
    """
    from harness.errors import ConfigError

    if train is None and table is None:
        raise ConfigError("harness plan: name a table (harness list tables), or --train generator|policy --config")
    if train is not None and table is not None:
        raise ConfigError(f"harness plan: a table ({table}) or --train {train}, not both: a training job runs no "
                          "table")
    if train is None and processes is not None:
        raise ConfigError(f"harness plan: --processes {processes} is for --train (a table's run is one process)")


def show_plan(plan: Any, options: Any, endpoints: Mapping[str, Any] | None = None) -> list[str]:
    """Load what the run would load (data; models built, none loaded), size and schedule the local models, and
    return the printed plan.

    Raises:
        ConfigError: an evaluator, policy or judge that cannot be built, or an endpoint that names no model of the
            run, as `run` refuses them (`build_models`, the same check; with --skip-unavailable a row that cannot
            be built is shown as left out, and none built is refused); a model that cannot be sized; a plan that
            does not fit (with the local models' sizes).
    """
    from harness.commands.runner import build_models, check_built, load_benchmarks, schedule_rows
    from harness.errors import ConfigError
    from harness.plan import local_models
    from harness.pool import BackendPool

    pool = BackendPool(options=options, endpoints=endpoints)
    ready = load_benchmarks(plan)  # run's checks of options, items and data; left out only with --skip-unavailable
    unavailable = {k: v for k, v in ready.unavailable.items() if k.startswith("benchmark ")}
    build_models(plan, pool, ready)
    check_built(plan, ready, doing="plan")
    try:
        scheduled = schedule_rows(plan, ready, pool, size=True)
    except ConfigError as exc:
        sizes = local_models(pool, sorted(pool.local()), plan.devices)
        shown = "; ".join(f"{m.key} {m.weights_gib:.1f} GiB over {m.devices} device(s)" for m in sizes.values())
        raise ConfigError(f"the plan does not fit: {exc} (local models: {shown})") from None
    return render(plan, ready, scheduled, pool, traffic(plan, ready, pool), unavailable)


def show_train_plan(kind: str, config_path: Any, *, gpus: int | None, gpu_memory: float | None,
                    processes: int | None, endpoints: Any) -> list[str]:
    """What one process of a training job puts on its GPU, and whether it fits (the check `train` makes).

    Raises:
        ConfigError: a bad kind or config, no devices, or a job that does not fit (with the numbers).
    """
    from harness.config import backend_options
    from harness.endpoints import parse_endpoints, read_endpoints
    from harness.errors import ConfigError
    from harness.plan import check_training, resolve_devices
    from training.grpo import load_train_config
    from training.job import _check_frozen_engines, load

    if kind not in ("generator", "policy") or config_path is None:
        raise ConfigError("harness plan --train: generator or policy, with --config FILE (a training config)")
    config = load_train_config(config_path)
    models = {**parse_endpoints(config.models, where=str(config_path)),
              **(read_endpoints(endpoints) if endpoints is not None else {})}
    devices = resolve_devices(config.devices, gpus=gpus, gpu_memory=gpu_memory)
    if devices is None:
        raise ConfigError("harness plan --train: give --gpus and --gpu-memory (no GPU is visible here)")
    if processes is not None and processes > devices.gpus:
        raise ConfigError(f"harness plan --train: --processes {processes} needs {processes} GPUs, one for each "
                          f"process, and there are {devices.gpus} (--gpus, or the config's devices:)")
    options = backend_options(config.backend, where=str(config_path))
    found = load(kind, config, options, models, devices, processes=processes or devices.gpus)  # type: ignore
    lines = [f"plan: train {kind} ({config_path}) on {processes or devices.gpus} processes, one GPU each of "
             f"{devices.gpu_memory_gib:g} GiB (engines may take {devices.budget_gib:.1f})",
             f"  trained model {config.model}: {found.trained_gib:.1f} GiB per GPU (ZeRO-3 share of bf16 weights "
             "and gradients, fp32 Adam state: 16 bytes a parameter)",
             f"  TRL's colocated vLLM: {found.colocated_gib:.1f} GiB",
             f"  activations: {found.activations_gib:.1f} GiB ({found.activations_for})"]
    lines += [f"  frozen {name}: {gib:.1f} GiB (loaded in every process: serve it to free this)"
              for name, gib in found.frozen_gib.items()]
    served = [spec for spec in models] + ([config.verifier] if (config.verifier or "").startswith("openai:") else [])
    lines += [f"  served: {spec}" for spec in served]
    check_training(found, devices)
    _check_frozen_engines(kind, config, models, world=processes or devices.gpus)  # type: ignore[arg-type]
    lines.append(f"fits: {found.total_gib:.1f} of {devices.budget_gib:.1f} GiB per GPU")
    return lines
