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
            "verifier": "smollm2-135m", "gen_max_tokens": 160},
    # The paper's policy training: Skywork-27B as the scalar RM, DR-Generator-8B frozen, Qwen3-30B-A3B verifying.
    "paper": {"reward_model": "Skywork/Skywork-Reward-Gemma-2-27B-v0.2", "head": "classifier",
              "generator": "vllm:checkpoints/dr-generator-8b", "verifier": "vllm:Qwen/Qwen3-30B-A3B",
              "gen_max_tokens": 1024},
}


def methods(*, reward_model: str, head: str, generator: str, verifier: str, gen_max_tokens: int
            ) -> list[tuple[str, str]]:
    """(method, evaluator spec) in the order measured; the first is the reference of every ratio."""
    rm = f"scalar-rm:model={reward_model},head={head}"
    rubric = f"generator={generator},verifier={verifier},gen_max_tokens={gen_max_tokens}"
    return [
        ("scalar RM", rm),
        ("scalar RM w/ responses", rm + ",with_responses=true"),
        ("static rubric (RaR)", f"static-rubric:{rubric}"),
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
    how: Literal["measured", "estimate"]
    calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float | None
    """Wall time of the reward call (None: an estimate has none)."""
    scored: int | None
    """Completions that got a reward (None for an estimate)."""


def _tokens(pool: Any) -> tuple[int, int]:
    spent = pool.spent().values()
    return sum(s["prompt_tokens"] for s in spent), sum(s["completion_tokens"] for s in spent)


def measure(specs: list[tuple[str, str]], sets: list[dict[str, Any]], *, options: BackendOptions,
            repeats: int = 1) -> list[Cost]:
    """Run one reward step per method on `sets` (call cache off) and count what each cost; with `repeats`, every
    method's step again in turn (round-robin, so a busy machine's noise spreads over all), its wall time the
    median of its runs (calls and tokens are those of its first run)."""
    from harness.pool import BackendPool
    from harness.seeds import derive_seed
    from judges import load_evaluator
    from training.rewards import PolicyReward

    k = len(sets[0]["responses"])
    completions = [[{"role": "assistant", "content": r}] for s in sets for r in s["responses"]]
    columns = {"question": [s["prompt"] for s in sets for _ in s["responses"]],
               "row": [s["id"] for s in sets for _ in s["responses"]]}
    found = []

    async def go() -> None:
        pool = BackendPool(options=options, cache=None)
        try:
            evaluators = [(name, spec, load_evaluator(spec, pool)) for name, spec in specs]
            pool.preflight()
            for key in pool.identities():
                await pool.backend(key).probe()  # every model loads before the first timing
            # One untimed group through a reward model and a rubric: first-call costs (a structured-output
            # grammar, the scoring head) are not charged to whichever method runs first.
            for _, _, evaluator in (evaluators[0], evaluators[2]):
                await evaluator.score_set(sets[0]["prompt"], sets[0]["responses"], seed=derive_seed("warm-up"))
            for run in range(repeats):
                for name, spec, evaluator in evaluators:
                    reward = PolicyReward(evaluator, group_size=k)
                    calls, (prompt, completion) = pool.calls, _tokens(pool)
                    start = time.perf_counter()
                    rewards = await reward([None] * len(completions), completions, **columns)
                    seconds = time.perf_counter() - start
                    after = _tokens(pool)
                    if run == 0:
                        found.append(Cost(name, spec, "measured", pool.calls - calls, after[0] - prompt,
                                          after[1] - completion, seconds, sum(r is not None for r in rewards)))
                    times.setdefault(name, []).append(seconds)
        finally:
            await pool.close()

    times: dict[str, list[float]] = {}
    asyncio.run(go())
    return [dataclasses.replace(c, seconds=statistics.median(times[c.method])) for c in found]


def estimate(specs: list[tuple[str, str]], sets: list[dict[str, Any]]) -> list[Cost]:
    """`harness plan`'s estimate of each method's calls and tokens on `sets` (no model is built)."""
    from harness.commands.plan import Traffic, evaluator_traffic
    from judges.base import parse_evaluator_spec

    items = [SimpleNamespace(prompt=s["prompt"], responses=s["responses"]) for s in sets]
    found = []
    for name, spec in specs:
        kind, settings = parse_evaluator_spec(spec)
        evaluator = SimpleNamespace(
            spec=spec, generator=settings.get("generator"), verifier=settings.get("verifier"),
            gen_max_tokens=int(settings.get("gen_max_tokens", 1024)), mode=settings.get("mode", "per_item"),
            backend=settings.get("model"), with_responses=settings.get("with_responses") == "true", settings=settings)
        into: dict[str, Traffic] = defaultdict(Traffic)
        evaluator_traffic(evaluator, items, 1, lambda model: model, into)
        found.append(Cost(name, spec, "estimate", sum(t.requests for t in into.values()),
                          sum(t.prompt_tokens for t in into.values()),
                          sum(t.completion_tokens for t in into.values()), None, None))
    return found


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def format_costs(costs: list[Cost], *, models: dict[str, Any], groups: int, group_size: int,
                 repeats: int = 1) -> str:
    base = costs[0]
    runs = f"; wall s: the median of {repeats} runs" if repeats > 1 and base.how == "measured" else ""
    lines = [
        f"one GRPO step's reward: {groups} prompts x {group_size} completions; scalar RM {models['reward_model']} "
        f"(head {models['head']}), generator {models['generator']}, verifier {models['verifier']} "
        f"(rubric budget {models['gen_max_tokens']} tokens); call cache off{runs}",
        f"{'method':<26} {'how':<9} {'calls':>6} {'prompt tok':>10} {'compl tok':>9} {'wall s':>8} {'scored':>6}"
        f"   {'calls':>6} {'prompt':>7} {'compl':>6} {'wall':>7}",
    ]
    for c in costs:
        wall = "-" if c.seconds is None else f"{c.seconds:.2f}"
        scored = "-" if c.scored is None else f"{c.scored}/{groups * group_size}"
        lines.append(
            f"{c.method:<26} {c.how:<9} {c.calls:>6} {c.prompt_tokens:>10} {c.completion_tokens:>9} {wall:>8} "
            f"{scored:>6}   {_ratio(c.calls, base.calls):>6} {_ratio(c.prompt_tokens, base.prompt_tokens):>7} "
            f"{_ratio(c.completion_tokens, base.completion_tokens):>6} {_ratio(c.seconds, base.seconds):>7}")
    how = "measured in this run" if base.how == "measured" else "estimated (harness plan's estimate; no wall time)"
    lines.append(f"ratios: x the plain scalar RM, {how}; a ratio to 0 (the RM writes no tokens) is '-'")
    return "\n".join(lines)


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
                      options: BackendOptions, groups: int, group_size: int, repeats: int = 1,
                      **models: Any) -> str:
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
    costs = measure(specs, sets, options=options, repeats=repeats) if run_it else estimate(specs, sets)
    return format_costs(costs, models=chosen, groups=groups, group_size=group_size, repeats=repeats)
