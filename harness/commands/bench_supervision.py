"""`harness bench supervision`: what one GRPO step's reward costs under each supervision method the paper compares
(Appendix E; its Limitations: the serial generator-verifier calls add wall-clock time to policy training).

The same step, the same response sets (one group of completions per prompt, `harness/examples/supervision_sets.json`),
scored by each method through the policy trainer's own reward function (`training.rewards.PolicyReward`, the
evaluators' `score_set` on every group at once):

- a scalar reward model, plain and "w/ responses" (it also sees the other completions of the group);
- a static rubric (Rubrics as Rewards: the rubric from the prompt alone, then verification);
- DynamicRubric in each verification mode (`per_item`, `batched`, `logprob`).

Per method: backend calls (requests as the backends see them; a `logprob` request with M branches is one), prompt
and completion tokens (a reward model's prompt tokens are those it read), wall time, and each as a ratio to the plain
scalar reward model measured in the same run. The call cache is off and every model is loaded before the first
timing. `measured` rows come from running the models here; `estimate` rows (the paper preset's models, which a
machine like this cannot run) are `harness plan`'s estimate for those models (`harness.commands.plan`: four
characters a token read, the budget written, `RUBRIC_ITEMS` items a rubric), with no wall time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from types import SimpleNamespace
from typing import Any, Literal

from harness.backends.base import BackendOptions
from harness.errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"reward_model": "smollm2-135m", "head": "lm-token0", "generator": "smollm2-135m",
            "static_generator": "smollm2-135m", "verifier": "smollm2-135m", "gen_max_tokens": 160,
            "large_reward_model": None},
    # The paper's policy training: Skywork-27B as the scalar RM (and Nemotron-70B, its larger one), DR-Generator-8B
    # frozen, Qwen3-30B-A3B verifying, Qwen3-235B-A22B writing the static (RaR) rubrics (training/configs/policy-*).
    "paper": {"reward_model": "Skywork/Skywork-Reward-Gemma-2-27B-v0.2", "head": "classifier",
              "generator": "vllm:checkpoints/dr-generator-8b", "static_generator": "vllm:Qwen/Qwen3-235B-A22B",
              "verifier": "vllm:Qwen/Qwen3-30B-A3B", "gen_max_tokens": 1024,
              "large_reward_model": "nvidia/Llama-3.1-Nemotron-70B-Reward-HF"},
}

ACTIVE_PARAMETERS: dict[str, float] = {
    "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": 27.2e9,
    "nvidia/Llama-3.1-Nemotron-70B-Reward-HF": 70.6e9,
    "Qwen/Qwen3-8B": 8.2e9,
    "checkpoints/dr-generator-8b": 8.2e9,  # trained from Qwen3-8B
    "Qwen/Qwen3-30B-A3B": 3.3e9,  # a mixture of experts: 30.5B in all, 3.3B active per token
    "Qwen/Qwen3-235B-A22B": 22e9,  # 235B in all, 22B active per token
}
"""Parameters active per token of the paper preset's models, from their model cards: what `compute` weighs
tokens by where the model is not loaded here (a loaded `hf` model counts its own)."""

STATIC = "static rubric (RaR)"
AMORTISED = "static rubric (RaR), amortised"


def methods(*, reward_model: str, head: str, generator: str, verifier: str, gen_max_tokens: int,
            static_generator: str | None = None, large_reward_model: str | None = None) -> list[tuple[str, str]]:
    """(method, evaluator spec) in the order measured; the first is the reference of every ratio."""
    rm = f"scalar-rm:model={reward_model},head={head}"
    budget = f"verifier={verifier},gen_max_tokens={gen_max_tokens}"
    rubric = f"generator={generator},{budget}"
    found = [("scalar RM", rm), ("scalar RM w/ responses", rm + ",with_responses=true")]
    if large_reward_model:
        found.append(("scalar RM (large)", f"scalar-rm:model={large_reward_model},head=lm-token0"))
    return [
        *found,
        (STATIC, f"static-rubric:generator={static_generator or generator},{budget}"),
        *[(f"DynamicRubric {mode}", f"dynamic-rubric:{rubric},mode={mode}") for mode in ("per_item", "batched",
                                                                                          "logprob")],
    ]


def step_sets(groups: int, group_size: int) -> list[dict[str, Any]]:
    """The step's groups: the first `groups` shipped prompts, each with its first `group_size` completions."""
    found = json.loads(resources.files("harness").joinpath("examples/supervision_sets.json").read_text())
    if groups > len(found) or group_size > min(len(s["responses"]) for s in found):
        raise ConfigError(f"the shipped sets hold {len(found)} prompts of 4 completions; asked {groups} x {group_size}")
    return [{**s, "responses": s["responses"][:group_size]} for s in found[:groups]]


@dataclass(frozen=True, slots=True)
class Cost:
    """One method's cost of the step."""

    method: str
    spec: str
    how: Literal["measured", "estimate", "derived"]
    calls: float
    prompt_tokens: float
    completion_tokens: float
    seconds: float | None
    """Wall time of the reward call (None: an estimate has none)."""
    scored: int | None
    """Completions that got a reward (None for an estimate)."""
    prefill_flop: float | None = None
    """2 x active parameters x prompt tokens, summed over the models (None: a model's size is unknown)."""
    decode_flop: float | None = None
    """2 x active parameters x completion tokens, summed over the models."""

    @property
    def flop(self) -> float | None:
        return None if self.prefill_flop is None or self.decode_flop is None else self.prefill_flop + self.decode_flop


@dataclass
class _Spent:
    """Calls and tokens (of one model, or of one role's requests)."""

    calls: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0

    def add(self, calls: float, prompt: float, completion: float) -> None:
        self.calls += calls
        self.prompt_tokens += prompt
        self.completion_tokens += completion


def _flop(spent: dict[str, _Spent], parameters: Any) -> tuple[float | None, float | None]:
    """(prefill, decode) FLOPs of `spent` (model -> tokens): 2 x active parameters per token."""
    sizes = {model: parameters(model) for model in spent}
    if any(size is None for size in sizes.values()):
        return None, None
    return (sum(2 * sizes[m] * t.prompt_tokens for m, t in spent.items()),
            sum(2 * sizes[m] * t.completion_tokens for m, t in spent.items()))


def known_parameters(spec: str) -> float | None:
    """Active parameters of a model the table (`ACTIVE_PARAMETERS`) knows, by its name with or without a backend
    kind (`vllm:Qwen/Qwen3-30B-A3B`)."""
    kind, sep, name = spec.partition(":")
    return ACTIVE_PARAMETERS.get(name if sep and "/" not in kind else spec)


def _loaded_parameters(pool: Any, spec: str) -> float | None:
    """A model's parameters: the table's, else those of the weights the pool loaded (`hf`), else None."""
    known = known_parameters(spec)
    if known is not None:
        return known
    lm = getattr(getattr(pool.get(spec), "backend", None), "_lm", None)
    return float(lm.num_parameters()) if lm is not None else None


class _Timed:
    """A generator backend whose generation is clocked: the wall time its calls span (overlapping calls counted
    once) and the calls and tokens they cost; every other attribute is the backend's."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.spans: list[tuple[float, float]] = []
        self.spent = _Spent()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def generate(self, requests: Any) -> Any:
        start = time.perf_counter()
        out = await self._backend.generate(requests)
        self.spans.append((start, time.perf_counter()))
        for c in out:
            if c.usage is not None:
                self.spent.add(1, c.usage.prompt_tokens, c.usage.completion_tokens)
        return out

    def seconds(self) -> float:
        """The union of the calls' spans."""
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.spans):
            if b > end:
                total += b - max(a, end)
                end = b
        return total


def amortised(static: Cost, generation: _Spent, generation_seconds: float | None,
              generation_flop: tuple[float | None, float | None], epochs: int) -> Cost:
    """The static rubric made once per prompt before training (as Rubrics as Rewards does): its generation leaves
    the step's wall time, and its calls, tokens and compute are spread over the `epochs` passes that reuse it."""
    share = 1 - 1 / epochs
    prefill, decode = generation_flop

    def less(value: float | None, part: float | None) -> float | None:
        return None if value is None or part is None else value - share * part

    seconds = None if static.seconds is None or generation_seconds is None else static.seconds - generation_seconds
    return dataclasses.replace(
        static, method=AMORTISED, how="derived", calls=static.calls - share * generation.calls,
        prompt_tokens=static.prompt_tokens - share * generation.prompt_tokens,
        completion_tokens=static.completion_tokens - share * generation.completion_tokens, seconds=seconds,
        prefill_flop=less(static.prefill_flop, prefill), decode_flop=less(static.decode_flop, decode))


def _tokens(pool: Any) -> dict[str, _Spent]:
    return {spec: _Spent(s["calls"], s["prompt_tokens"], s["completion_tokens"]) for spec, s in pool.spent().items()}


def _less(after: dict[str, _Spent], before: dict[str, _Spent]) -> dict[str, _Spent]:
    found = {}
    for spec, a in after.items():
        b = before.get(spec, _Spent())
        d = _Spent(a.calls - b.calls, a.prompt_tokens - b.prompt_tokens, a.completion_tokens - b.completion_tokens)
        if d.calls:
            found[spec] = d
    return found


def measure(specs: list[tuple[str, str]], sets: list[dict[str, Any]], *, options: BackendOptions,
            repeats: int = 1, epochs: int = 1) -> list[Cost]:
    """Run one reward step per method on `sets` (call cache off) and count what each cost; with `repeats`, every
    method's step again in turn (round-robin, so a busy machine's noise spreads over all), its wall time the
    median of its runs (calls and tokens are those of its first run). The static rubric's generation is clocked
    apart, for its amortised row (`amortised`, over `epochs`)."""
    from harness.pool import BackendPool
    from harness.seeds import derive_seed
    from judges import load_evaluator
    from training.rewards import PolicyReward

    k = len(sets[0]["responses"])
    completions = [[{"role": "assistant", "content": r}] for s in sets for r in s["responses"]]
    columns = {"question": [s["prompt"] for s in sets for _ in s["responses"]],
               "row": [s["id"] for s in sets for _ in s["responses"]]}
    found: list[Cost] = []
    times: dict[str, list[float]] = {}
    generation: dict[str, Any] = {}

    async def go() -> None:
        pool = BackendPool(options=options, cache=None)
        try:
            evaluators = [(name, spec, load_evaluator(spec, pool)) for name, spec in specs]
            pool.preflight()
            for key in pool.identities():
                await pool.backend(key).probe()  # every model loads before the first timing
            # One untimed group through a reward model and a rubric: first-call costs (a structured-output
            # grammar, the scoring head) are not charged to whichever method runs first.
            rubric = next(e for name, _, e in evaluators if name == STATIC)
            for evaluator in (evaluators[0][2], rubric):
                await evaluator.score_set(sets[0]["prompt"], sets[0]["responses"], seed=derive_seed("warm-up"))
            for run in range(repeats):
                for name, spec, evaluator in evaluators:
                    timed = None
                    if name == STATIC:
                        timed = evaluator.generator = _Timed(evaluator.generator)
                    reward = PolicyReward(evaluator, group_size=k)
                    calls, before = pool.calls, _tokens(pool)
                    start = time.perf_counter()
                    rewards = await reward([None] * len(completions), completions, **columns)
                    seconds = time.perf_counter() - start
                    if timed is not None:
                        evaluator.generator = timed._backend
                        generation.setdefault("seconds", []).append(timed.seconds())
                        if run == 0:
                            generation.update(spent=timed.spent, model=evaluator.settings["generator"])
                    if run == 0:
                        spent = _less(_tokens(pool), before)
                        prefill, decode = _flop(spent, lambda m: _loaded_parameters(pool, m))
                        found.append(Cost(name, spec, "measured", pool.calls - calls,
                                          sum(t.prompt_tokens for t in spent.values()),
                                          sum(t.completion_tokens for t in spent.values()), seconds,
                                          sum(r is not None for r in rewards), prefill, decode))
                    times.setdefault(name, []).append(seconds)
            generation["parameters"] = _loaded_parameters(pool, generation["model"])
        finally:
            await pool.close()

    asyncio.run(go())
    costs = [dataclasses.replace(c, seconds=statistics.median(times[c.method])) for c in found]
    static = next(c for c in costs if c.method == STATIC)
    spent, size = generation["spent"], generation["parameters"]
    flop = (None, None) if size is None else (2 * size * spent.prompt_tokens, 2 * size * spent.completion_tokens)
    costs.insert(costs.index(static) + 1, amortised(static, spent, statistics.median(generation["seconds"]), flop,
                                                     epochs))
    return costs


def estimate(specs: list[tuple[str, str]], sets: list[dict[str, Any]], *, epochs: int = 1) -> list[Cost]:
    """`harness plan`'s estimate of each method's calls and tokens on `sets` (no model is built), weighed by the
    models' active parameters (`known_parameters`), with the static rubric's amortised row."""
    from harness.commands.plan import Traffic, evaluator_traffic
    from judges.base import parse_evaluator_spec

    items = [SimpleNamespace(prompt=s["prompt"], responses=s["responses"]) for s in sets]
    found = []
    for name, spec in specs:
        kind, settings = parse_evaluator_spec(spec)
        # Roles kept apart, so the static rubric's generation is known even where one model plays both.
        evaluator = SimpleNamespace(
            spec=spec, generator=("generation", settings.get("generator")),
            verifier=("verification", settings.get("verifier")),
            gen_max_tokens=int(settings.get("gen_max_tokens", 1024)), mode=settings.get("mode", "per_item"),
            backend=("score", settings.get("model")), with_responses=settings.get("with_responses") == "true",
            settings=settings)
        into: dict[Any, Traffic] = defaultdict(Traffic)
        evaluator_traffic(evaluator, items, 1, lambda role: role, into)
        spent = {role: _Spent(t.requests, t.prompt_tokens, t.completion_tokens) for role, t in into.items()}
        prefill, decode = _flop(spent, lambda role: known_parameters(role[1]))
        found.append(Cost(name, spec, "estimate", sum(t.calls for t in spent.values()),
                          sum(t.prompt_tokens for t in spent.values()),
                          sum(t.completion_tokens for t in spent.values()), None, None, prefill, decode))
        if name == STATIC:
            made = {role: t for role, t in spent.items() if role[0] == "generation"}
            found.append(amortised(found[-1], _Spent(*(sum(getattr(t, f) for t in made.values()) for f in
                                                       ("calls", "prompt_tokens", "completion_tokens"))),
                                   None, _flop(made, lambda role: known_parameters(role[1])), epochs))
    return found


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def _gflop(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:,.0f}" if value >= 1e10 else f"{value / 1e9:.1f}"


def format_costs(costs: list[Cost], *, models: dict[str, Any], groups: int, group_size: int,
                 repeats: int = 1, epochs: int = 1) -> str:
    base = costs[0]
    runs = f"; wall s: the median of {repeats} runs" if repeats > 1 and base.how == "measured" else ""
    static = models.get("static_generator") or models["generator"]
    large = f" and {models['large_reward_model']} (lm-token0)" if models.get("large_reward_model") else ""
    lines = [
        f"one GRPO step's reward: {groups} prompts x {group_size} completions; scalar RM {models['reward_model']} "
        f"(head {models['head']}){large}, generator {models['generator']}, static generator {static}, verifier "
        f"{models['verifier']} (rubric budget {models['gen_max_tokens']} tokens); call cache off{runs}",
        f"{'method':<31} {'how':<9} {'calls':>6} {'prompt tok':>10} {'compl tok':>9} {'prefill GF':>10} "
        f"{'decode GF':>9} {'wall s':>8} {'scored':>6}   {'calls':>6} {'prompt':>7} {'compl':>6} {'compute':>7} "
        f"{'wall':>7}",
    ]
    for c in costs:
        wall = "-" if c.seconds is None else f"{c.seconds:.2f}"
        scored = "-" if c.scored is None else f"{c.scored}/{groups * group_size}"
        lines.append(
            f"{c.method:<31} {c.how:<9} {c.calls:>6.0f} {c.prompt_tokens:>10.0f} {c.completion_tokens:>9.0f} "
            f"{_gflop(c.prefill_flop):>10} {_gflop(c.decode_flop):>9} {wall:>8} {scored:>6}   "
            f"{_ratio(c.calls, base.calls):>6} {_ratio(c.prompt_tokens, base.prompt_tokens):>7} "
            f"{_ratio(c.completion_tokens, base.completion_tokens):>6} {_ratio(c.flop, base.flop):>7} "
            f"{_ratio(c.seconds, base.seconds):>7}")
    how = "measured in this run" if base.how == "measured" else "estimated (harness plan's estimate; no wall time)"
    lines.append(f"ratios: x the plain scalar RM, {how}; a ratio to 0 (the RM writes no tokens) is '-'")
    lines.append("compute: 2 x active parameters x tokens (GF: 10^9 FLOPs), prefill (prompt) and decode "
                 f"(completion) apart; amortised: the static rubric made once per prompt before training, out of "
                 f"the step's wall time, its cost spread over {epochs} epoch{'s' if epochs > 1 else ''}")
    return "\n".join(lines)


def grpo_share(run_dir: Any, costs: list[Cost], *, completions: int) -> list[str]:
    """The reward's share of a policy run's GRPO steps (its `train_log.jsonl`: `step_time` and
    `dr/reward_seconds`, rollouts and backward pass included), then each measured method's projected share: its
    reward wall time here against the run's time outside the reward, scaled to this step's `completions`."""
    from pathlib import Path

    from training.plots import read_log

    path = Path(run_dir) / "train_log.jsonl"
    rows = [r for r in read_log(path) if "step_time" in r and "dr/reward_seconds" in r]
    try:
        manifest = json.loads((Path(run_dir) / "dr_manifest.json").read_text(encoding="utf-8"))
        grpo = manifest["settings"]["grpo"]
        per_step = grpo["per_device_train_batch_size"] * grpo["gradient_accumulation_steps"]
        settings = manifest["settings"]
        reward_spec = settings.get("reward") or (f"dynamic-rubric:generator={settings['generator']},verifier="
                                                 f"{settings['verifier']},mode={settings['verify_mode']}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--grpo-log {run_dir}: not a policy run's directory ({exc})") from None
    if not rows:
        raise ConfigError(f"--grpo-log {run_dir}: {path} has no training step with step_time and "
                          "dr/reward_seconds")
    step = sum(r["step_time"] for r in rows) / len(rows)
    reward = sum(r["dr/reward_seconds"] for r in rows) / len(rows)
    other = (step - reward) * completions / per_step
    lines = [f"GRPO step of {run_dir} ({len(rows)} steps of {per_step} completions; reward {reward_spec}): "
             f"{step:.1f} s a step, the reward {reward:.1f} s: {reward / step:.0%} of the step"]
    for c in costs:
        if c.how != "estimate" and c.seconds is not None:
            lines.append(f"  {c.method:<31} projected share of a step of {completions} completions: "
                         f"{c.seconds / (c.seconds + other):.0%}")
    return lines


def _model_form(spec: str) -> None:
    """Check a model spec's form (`KIND:NAME` of a known backend kind, or an alias) without finding, converting or
    loading the model: what an estimate for models this machine lacks can check.

    Raises:
        ConfigError: as `harness.backends.parse_spec` says it.
    """
    from harness.backends import LOCAL_KINDS, parse_spec
    from harness.registry import names

    kind, sep, name = spec.strip().partition(":")
    if (name if sep else kind) in names("model") and (not sep or kind in LOCAL_KINDS):
        return  # an alias: its checkpoint is converted on first use, which a check must not do
    parse_spec(spec)


class _Unbuilt:
    """The stand-in `check` hands an evaluator for each model: it answers the evaluators' build-time questions of
    a backend (none concerns the model's weights here) and is never called."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def check_score(self, head: str) -> None:
        return None


class _FormPool:
    """What `check` builds the evaluators with: `get` checks a model spec's form (`_model_form`) and builds no
    backend."""

    def get(self, spec: str, *, overrides: Any = None) -> _Unbuilt:
        _model_form(spec)
        return _Unbuilt(spec)


def check(specs: list[tuple[str, str]]) -> None:
    """Build every method's evaluator from its spec as measuring would, with no model found, converted or loaded:
    its settings (a reward model's head, a rubric's mode and budgets) and the form of every model spec.

    Raises:
        ConfigError: naming the method and what is wrong with its spec.
    """
    from harness.errors import HarnessError
    from judges import load_evaluator

    for name, spec in specs:
        try:
            load_evaluator(spec, _FormPool())  # type: ignore[arg-type]
        except HarnessError as exc:
            raise ConfigError(f"{name}: {exc}") from None


def bench_supervision(*, preset: str, measure_it: bool = False, estimate_it: bool = False,
                      options: BackendOptions, groups: int, group_size: int, repeats: int = 1, epochs: int = 1,
                      grpo_log: Any = None, **models: Any) -> str:
    """The printed table: measured (the cpu preset, or `measure_it`) or estimated (the paper preset, or
    `estimate_it`). Every method's spec is checked (`check`) before anything runs, whichever it is.

    Raises:
        ConfigError: for an unknown preset, both `measure_it` and `estimate_it`, or a spec `check` refuses.
    """
    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: expected {' or '.join(PRESETS)}")
    if measure_it and estimate_it:
        raise ConfigError("--measure and --estimate: give one (measure runs the models, estimate runs none)")
    chosen = {**PRESETS[preset], **{k: v for k, v in models.items() if v is not None}}
    specs = methods(**chosen)
    sets = step_sets(groups, group_size)
    check(specs)
    run_it = measure_it or (preset == "cpu" and not estimate_it)
    if run_it:
        costs = measure(specs, sets, options=options, repeats=repeats, epochs=epochs)
    else:
        costs = estimate(specs, sets, epochs=epochs)
    text = format_costs(costs, models=chosen, groups=groups, group_size=group_size, repeats=repeats, epochs=epochs)
    if grpo_log is not None:
        text += "\n" + "\n".join(grpo_share(grpo_log, costs, completions=groups * group_size))
    return text
