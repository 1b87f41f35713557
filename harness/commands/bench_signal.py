"""`harness bench reward-signal`: how much signal a policy config's dynamic-rubric reward would give GRPO, measured
before any training.

On the config's first N training prompts (the rows its job would train on, `training.grpo.read_rows`), the base
policy samples K completions each (temperature 1.0, the config's `max_completion_length`), and the config's reward
evaluator scores each group twice, with two independently seeded rubrics (what two training steps would see). Nectar's
own ranked responses of each prompt are scored too, so the rubric's order can be checked against GPT-4's ranks.
It prints:

- the zero-spread share: groups whose first rubric gives every completion one score (GRPO's advantage is 0 there);
- the distinct score values per group (a 2-item rubric gives at most 4: one verdict moves a whole group);
- the mean within-group Spearman correlation of the two rubrics' scores (over groups where both spread);
- the verifier's yes-rate over every item x completion verdict;
- the pair accuracy against Nectar's ranks (ties count half);
- the clipped share: completions whose re-tokenised length reaches the cap (a truncated answer is judged).

and a go / no-go line against `THRESHOLDS`, fixed here before any run.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.backends.base import BackendOptions


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The go rule: every bound holds."""

    max_zero_spread: float = 0.30
    min_distinct: float = 3.0
    min_spearman: float = 0.30
    yes_rate: tuple[float, float] = (0.10, 0.90)
    min_pair_accuracy: float = 0.55
    max_clipped: float = 0.20


THRESHOLDS = Thresholds()


@dataclass(slots=True)
class Signal:
    """What one pilot measured (None: nothing to measure it on)."""

    prompts: int
    completions: int
    zero_spread: float | None = None
    distinct: float | None = None
    spearman: float | None = None
    spearman_groups: int = 0
    yes_rate: float | None = None
    pair_accuracy: float | None = None
    pairs: int = 0
    clipped: float | None = None
    rubric_items: float | None = None
    unscored: int = 0
    failures: list[str] = field(default_factory=list)

    def checks(self, t: Thresholds = THRESHOLDS) -> list[tuple[str, bool | None]]:
        """(what, held) per bound; None where the figure could not be measured (which is a no-go)."""
        def held(value: float | None, ok: bool) -> bool | None:
            return None if value is None else ok

        lo, hi = t.yes_rate
        return [
            (f"zero-spread share <= {t.max_zero_spread:g}",
             held(self.zero_spread, self.zero_spread is not None and self.zero_spread <= t.max_zero_spread)),
            (f"distinct values per group >= {t.min_distinct:g}",
             held(self.distinct, self.distinct is not None and self.distinct >= t.min_distinct)),
            (f"rubric-rubric Spearman >= {t.min_spearman:g}",
             held(self.spearman, self.spearman is not None and self.spearman >= t.min_spearman)),
            (f"yes-rate in [{lo:g}, {hi:g}]", held(self.yes_rate, self.yes_rate is not None and lo <= self.yes_rate <= hi)),
            (f"pair accuracy vs Nectar >= {t.min_pair_accuracy:g}",
             held(self.pair_accuracy, self.pair_accuracy is not None and self.pair_accuracy >= t.min_pair_accuracy)),
            (f"clipped share <= {t.max_clipped:g}",
             held(self.clipped, self.clipped is not None and self.clipped <= t.max_clipped)),
        ]

    @property
    def go(self) -> bool:
        return all(ok is True for _, ok in self.checks())


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho of two equal-length lists (average ranks for ties); None when either is constant."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a), rankdata(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def pair_accuracy(scores_best_first: list[float | None]) -> tuple[float, int]:
    """(correct share, pairs) over every pair of scored responses, the better-ranked one first; a tie counts half."""
    got, pairs = 0.0, 0
    for i, hi in enumerate(scores_best_first):
        for lo in scores_best_first[i + 1:]:
            if hi is None or lo is None:
                continue
            pairs += 1
            got += 1.0 if hi > lo else 0.5 if hi == lo else 0.0
    return (got / pairs if pairs else math.nan), pairs


def measure(groups: list[dict[str, Any]], *, prompts: int) -> Signal:
    """The figures of `groups`: per prompt `first` and `second` (the two rubrics' scores and traces), `anchor`
    (Nectar's responses' scores, best first), `clipped` (per completion, or None)."""
    completions = sum(len(g["first"][0]) for g in groups)
    signal = Signal(prompts=prompts, completions=completions)
    spreads, distinct, rhos, verdicts, sizes, clipped = [], [], [], [], [], []
    correct, pairs = 0.0, 0
    for g in groups:
        first, second = g["first"][0], g["second"][0]
        signal.unscored += sum(s is None for s in first) + sum(s is None for s in second)
        scored = [s for s in first if s is not None]
        if scored:
            spreads.append(len(set(scored)) == 1)
            distinct.append(len(set(scored)))
        both = [(a, b) for a, b in zip(first, second) if a is not None and b is not None]
        if len(both) > 1:
            rho = spearman([a for a, _ in both], [b for _, b in both])
            if rho is not None:
                rhos.append(rho)
        for trace in (g["first"][1], g["second"][1]):
            if trace is not None and trace.verdicts:
                verdicts += [v for row in trace.verdicts for v in row if v is not None]
                sizes.append(len(trace.rubric or ()))
        acc, n = pair_accuracy(g["anchor"])
        if n:
            correct += acc * n
            pairs += n
        clipped += [c for c in g["clipped"] if c is not None]
    signal.zero_spread = float(np.mean(spreads)) if spreads else None
    signal.distinct = float(np.mean(distinct)) if distinct else None
    signal.spearman = float(np.mean(rhos)) if rhos else None
    signal.spearman_groups = len(rhos)
    signal.yes_rate = float(np.mean([v >= 0.5 for v in verdicts])) if verdicts else None
    signal.pair_accuracy = correct / pairs if pairs else None
    signal.pairs = pairs
    signal.clipped = float(np.mean(clipped)) if clipped else None
    signal.rubric_items = float(np.mean(sizes)) if sizes else None
    return signal


def run_reward_signal(config_path: Path, *, data_dir: Path | None, prompts: int, k: int, anchors: int,
                      options: BackendOptions, seed: int = 0) -> Signal:
    """Sample, score and measure (see the module docstring) on the policy config at `config_path`.

    Raises:
        ConfigError: for a config that is not a policy job's, or rows it cannot read.
    """
    from benchmarks.nectar import local_file
    from harness.backends.base import GenerateRequest, Message, SamplingParams
    from harness.errors import ConfigError
    from harness.pool import BackendPool
    from harness.seeds import derive_seed
    from judges import load_evaluator
    from judges.thinking import strip_thinking
    from training.fit import policy_reward_spec
    from training.grpo import load_train_config, read_rows

    config = load_train_config(config_path, data_dir=data_dir)
    spec = policy_reward_spec(config)
    nectar = local_file(Path(config.data.data_dir)) if config.data.data_dir is not None else None
    rows, _, _ = read_rows(config.data, nectar, policy=True)
    rows = rows[:prompts]
    if not rows:
        raise ConfigError(f"{config_path}: no training rows to measure on")
    cap = config.grpo.max_completion_length
    groups: list[dict[str, Any]] = []

    async def go() -> None:
        pool = BackendPool(options=options, cache=None)
        try:
            policy = pool.get(config.model)
            evaluator = load_evaluator(spec, pool)
            for row in rows:
                params = SamplingParams(n=k, temperature=1.0, max_tokens=cap, seed=derive_seed(seed, row.id, "sample"))
                (done,) = await policy.generate([GenerateRequest((Message("user", row.prompt),), params)])
                if done.error is not None:
                    raise ConfigError(f"the policy {config.model} failed on {row.id}: {done.error}")
                texts = [strip_thinking(t) for t in done.texts]
                tokenizer = getattr(getattr(policy, "backend", policy), "tokenizer", None)  # hf: the cache's inner
                clipped = ([len(tokenizer(t, add_special_tokens=False)["input_ids"]) >= cap for t in done.texts]
                           if tokenizer is not None else [None] * len(texts))
                first = await evaluator.score_set(row.prompt, texts, seed=derive_seed(seed, row.id, 1))
                second = await evaluator.score_set(row.prompt, texts, seed=derive_seed(seed, row.id, 2))
                anchor = await evaluator.score_set(row.prompt, list(row.responses[:anchors]),
                                                   seed=derive_seed(seed, row.id, "anchor"))
                groups.append({"first": (list(first.scores), first.trace),
                               "second": (list(second.scores), second.trace),
                               "anchor": list(anchor.scores) if row.ranked else [], "clipped": clipped})
        finally:
            await pool.close()

    asyncio.run(go())
    return measure(groups, prompts=len(rows))


def format_signal(signal: Signal, *, config: Path, k: int) -> str:
    def f(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [(f"reward signal of {config}: {signal.prompts} prompts x {k} completions, two rubrics each "
              f"(mean {f(signal.rubric_items, 1)} items), {signal.unscored} scores missing"),
             f"zero-spread share of groups: {f(signal.zero_spread)}",
             f"distinct score values per group: {f(signal.distinct, 1)}",
             f"Spearman between the two rubrics: {f(signal.spearman)} (over {signal.spearman_groups} groups)",
             f"verifier yes-rate: {f(signal.yes_rate)}",
             f"pair accuracy against Nectar's ranks: {f(signal.pair_accuracy)} (over {signal.pairs} pairs)",
             f"clipped share of completions: {f(signal.clipped)}"]
    failed = [what for what, ok in signal.checks() if ok is not True]
    lines.append("go: every bound holds" if signal.go else f"no-go: {'; '.join(failed)} does not hold")
    return "\n".join(lines)
