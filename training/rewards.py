"""GRPO rewards for the DR-Generator and the DR-Policy, as TRL reward functions, on the judges' scoring path.

TRL (1.16) calls a reward function as `f(prompts=..., completions=..., completion_ids=..., **columns)` with every
dataset column repeated per completion, plus `trainer_state`, `log_metric` and `log_extra`; the `num_generations`
completions of one prompt are consecutive, so the dataset row identifies the group. Both rewards are `async` (TRL
gathers async reward functions on its own event loop), and every verification inside one call runs concurrently.
A completion that cannot be scored (a rubric the parser rejects, a failed backend call, an unanswered verdict) gets
`None`: TRL leaves it out of the group statistics and gives it advantage 0; it is counted, never made a 0.

**Generator** (`GeneratorReward`): each completion is a rubric for its row's set (the current policy's K responses
to the row's prompt, their thinking stripped: `training.grpo.read_sets`). The frozen verifier answers every item on
the set, giving `disc_reward` (the weighted Bernoulli variance of the item pass rates), and on the row's Nectar
anchors (the same prompt's 7 responses in GPT-4's rank order), giving `anchor_reward` (the rank-discounted
Bradley-Terry log-likelihood of the rubric's scores). The paper combines the two *at the advantage level*:
`A = z(disc) + lambda * z(anchor)`, each `z` the group-standardised reward (TRL's formula: `(r - mean) / (std +
1e-4)`, sample std over the group's scorable members). This function returns that sum, which has mean 0 in every
group; its reward scaling (`scale_rewards`, the class attribute `training.grpo` reads: `"none"`) leaves it as it is,
so TRL's advantage `r - mean(r)` is exactly the paper's. (TRL's own `multi_objective_aggregation=
"normalize_then_sum"` standardises once more over the whole batch, a step the paper does not describe; a test in
`tests/training/test_grpo_smoke.py` shows what it changes.) `objective="disc"` / `"anchor"` are Table 3's ablations;
their training batches verify only what they use (the set, or the anchors), and held-out batches verify both.

**Binary verdicts for R_disc.** The paper's `R_disc` takes the verifier's yes/no verdicts, and so does the default
mode (`per_item`, as the evaluation tables verify). With soft verdicts (`logprob`: P(yes)) the mean of `v (1 - v)`
adds the verifier's own uncertainty to the spread across responses: an item the verifier is 50/50 about for every
response would earn the most, 0.25. So in `logprob` mode `R_disc` reads each P(yes) as the verifier's most likely
answer, yes iff P(yes) > 0.5 (`binary_verdicts`): the verdict `per_item` decoding gives greedily, and the paper's
quantity on it. (The other reading, the spread of P(yes) across the responses alone, also pays the unsure item
nothing, but it is not the paper's quantity: two responses the verifier puts at P(yes) 0.45 and 0.55, whose
verdicts differ, would earn 0.0025 instead of 0.25.) The anchor scores keep P(yes) in `logprob` mode: there they
are scores, as the `logprob` evaluators' scores are.

**Policy** (`PolicyReward`): each group of completions for one prompt, their thinking stripped
(`judges.thinking.strip_thinking`, the policy tables' rule), is scored by one evaluator `score_set` call: by
default the `dynamic-rubric` evaluator (one rubric per group from the frozen generator, seeded by the row and the
step), or any registered evaluator the config's `reward` names (Table 2's baselines: a scalar reward model, with or
without the other responses, or RaR's static rubric, whose seed is the row's alone so that its rubric is made once
per prompt and the call cache serves it again every epoch). The reward is the score; GRPO's advantage standardises
it within its group (`scale_rewards = "group"`, GRPO as Shao et al. define it).

**Evaluation calls** (the dataset's `split` column is `heldout`, or `seen` for the training prompts evaluated the
same way: `data.eval_train`) are grouped by TRL's `num_generations_eval`. Given an output dir (`heldout_dir`), the
policy's dynamic rubric scores an evaluated prompt against one **fixed rubric**, generated from the first
evaluation's completions and then only verified (`training.heldout.FixedRubrics`), and every evaluation call of
either reward appends its per-prompt mean score, with its split, to `eval_scores.jsonl`. Any other evaluator (a
scalar RM, a `rule`) scores an evaluated group as it scores a training one.

**Shuffled control** (`ShuffledReward`, `--control shuffled`): any reward, its training batches' values permuted
within the batch before TRL computes the advantages; evaluation calls pass through.

Logged per call (one optimisation step's generation batch, or one held-out batch), through TRL's `log_metric` and
in `stats`: each reward component's mean and std, the share of completions whose rubric parsed (`parse_rate`: the
generator's rollouts; for the policy, its frozen generator's rubrics), the share of groups whose reward has zero
spread, the share of saturated rubric items, the mean rubric size, the correlation of the reward with completion
length (characters), the verifier's backend calls, the unscorable completions by cause, and the reward's wall time.
The generator's reward also logs `anchor_pair_acc`: of the anchor pairs (i better than j by the annotation), the
share its rubric scores strictly in that order (`anchor_order_accuracy`; a tie is wrong), its mean over the scored
rubrics, and `gap`: the score gap Δ_gap on the anchor pairs, the mean over the pairs of the better-ranked anchor's
score minus the worse-ranked one's (`anchor_gap`), its mean over the scored rubrics. An evaluation call goes to
`eval_history`, not `history`. `length_corr` (`dr/length_corr`)
is the one to watch for a length hack: a reward that pays for length shows as a correlation that rises.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from harness.backends.base import BaseBackend
from judges.rubric import (
    Rubric,
    RubricParseError,
    aggregate,
    anchor_reward,
    disc_reward,
    parse_rubric,
    saturated_share,
)
from judges.thinking import strip_thinking
from judges.verify import VerifyMode, verify

Objective = Literal["both", "disc", "anchor"]
_EPS = 1e-4
"""TRL's epsilon in `(r - mean) / (std + 1e-4)`."""


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a conversational `[{"role": "assistant", "content": ...}]`."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def group_standardise(values: Sequence[float | None], group_size: int) -> list[float | None]:
    """Each value's `(v - mean) / (std + 1e-4)` within its group of `group_size` consecutive values, as TRL's
    GRPO computes it (mean and Bessel-corrected std over the group's non-None values). None stays None; a group
    with fewer than two values gives its value 0 (TRL: a NaN std, advantage 0)."""
    if group_size < 1 or len(values) % group_size:
        raise ValueError(f"{len(values)} values do not split into groups of {group_size}")
    out: list[float | None] = []
    for start in range(0, len(values), group_size):
        group = values[start:start + group_size]
        found = np.array([v for v in group if v is not None], dtype=float)
        if len(found) < 2:
            out += [None if v is None else 0.0 for v in group]
            continue
        mean, std = found.mean(), found.std(ddof=1)
        out += [None if v is None else float((v - mean) / (std + _EPS)) for v in group]
    return out


def _mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    found = [v for v in values if v is not None]
    if not found:
        return None, None
    return float(np.mean(found)), float(np.std(found, ddof=1)) if len(found) > 1 else 0.0


def zero_std_share(values: Sequence[float | None], group_size: int) -> float:
    """Share of groups whose scorable values are all equal (or fewer than two): no learning signal."""
    groups = [values[i:i + group_size] for i in range(0, len(values), group_size)]
    flat = 0
    for group in groups:
        found = [v for v in group if v is not None]
        flat += len(found) < 2 or max(found) - min(found) == 0
    return flat / len(groups) if groups else 0.0


def _gold_pairs(scores_in_gold_rank_order: Sequence[float], what: str) -> tuple[np.ndarray, np.ndarray]:
    """The scores of every pair (i, j), i ranked better than j by the annotation: (S_i, S_j) as two arrays.

    Raises:
        ValueError: for fewer than two scores.
    """
    s = np.asarray(scores_in_gold_rank_order, dtype=float)
    if s.ndim != 1 or len(s) < 2:
        raise ValueError(f"{what} needs at least 2 scores in gold order, got shape {s.shape}")
    i, j = np.triu_indices(len(s), k=1)
    return s[i], s[j]


def anchor_order_accuracy(scores_in_gold_rank_order: Sequence[float]) -> float:
    """Of the pairs (i, j), i ranked better than j by the annotation, the share scored strictly in that order
    (`S_i > S_j`; a tie counts as wrong, as for the benchmarks' strict accuracy).

    Raises:
        ValueError: for fewer than two scores.
    """
    better, worse = _gold_pairs(scores_in_gold_rank_order, "anchor order accuracy")
    return float(np.mean(better > worse))


def anchor_gap(scores_in_gold_rank_order: Sequence[float]) -> float:
    """Δ_gap on the anchors: of the pairs (i, j), i ranked better than j by the annotation, the mean of
    `S_i - S_j` (positive when the rubric scores the better-ranked anchors higher).

    Raises:
        ValueError: for fewer than two scores.
    """
    better, worse = _gold_pairs(scores_in_gold_rank_order, "the anchor gap")
    return float(np.mean(better - worse))


def binary_verdicts(verdicts: np.ndarray) -> np.ndarray:
    """Each P(yes) as the verifier's most likely answer: 1 where P(yes) > 0.5, else 0 (0/1 verdicts unchanged)."""
    return (np.asarray(verdicts, dtype=float) > 0.5).astype(float)


def length_correlation(rewards: Sequence[float | None], lengths: Sequence[int]) -> float | None:
    """Pearson correlation of the scorable rewards with their completions' lengths (None when undefined)."""
    pairs = [(r, n) for r, n in zip(rewards, lengths) if r is not None]
    if len(pairs) < 2:
        return None
    r, n = np.array(pairs, dtype=float).T
    if r.std() == 0 or n.std() == 0:
        return None
    return float(np.corrcoef(r, n)[0, 1])


@dataclass(slots=True)
class RewardStats:
    """What one reward call found (logged per step)."""

    values: dict[str, float | None] = field(default_factory=dict)

    def log(self, log_metric: Any) -> None:
        if log_metric is None:
            return
        for name, value in self.values.items():
            if value is not None and math.isfinite(value):
                log_metric(name, value)


class _Counted:
    """A backend wrapper counting the requests it forwards (the verifier's calls of one reward call)."""

    def __init__(self, backend: BaseBackend) -> None:
        self.backend = backend
        self.requests = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def generate(self, requests):
        self.requests += len(requests)
        return await self.backend.generate(requests)

    async def next_token_logprobs(self, requests, candidates):
        self.requests += len(requests)
        return await self.backend.next_token_logprobs(requests, candidates)


@dataclass(frozen=True, slots=True)
class RubricOutcome:
    """One rubric completion's two rewards (None where it could not be scored) and why."""

    disc: float | None
    anchor: float | None
    size: int = 0
    saturated: float | None = None
    failure: str | None = None
    """`parse` (the rubric), `verify` (a verdict missing on the set or the anchors), or None."""
    anchor_order: float | None = None
    """`anchor_order_accuracy` of the rubric's scores on the anchors."""
    anchor_gap: float | None = None
    """`anchor_gap` of the rubric's scores on the anchors."""


class GeneratorReward:
    """The DR-Generator's reward (see the module docstring).

    Dataset columns it reads: `question` (the prompt), `responses` (the current policy's set) and `anchor` (the
    prompt's Nectar responses, best first).

    Args:
        verifier: The frozen DR-Verifier.
        group_size: TRL's `num_generations`.
        lam: Weight of the anchor advantage (the paper's lambda, default 1).
        objective: `both`, or Table 3's ablations `disc` / `anchor`.
        mode: Verification mode: `per_item` (the paper's binary verdicts, as the evaluation tables verify),
            `batched`, or `logprob` (far fewer calls; `R_disc` on its verdicts thresholded at 0.5: see the module
            docstring).
        verify_max_tokens: Token budget per verdict (`per_item`; a sheet gets it per item).
        structured: Constrain the verifier's answers where the backend can.
        heldout_dir: Where each held-out evaluation's per-prompt scores go (`training.heldout`: a prompt's score
            is the mean discriminability reward of its scored rubrics); None: nowhere.
    """

    __name__ = "dr_generator"
    scale_rewards: ClassVar[str] = "none"
    """The reward already is the paper's advantage (the sum of group-standardised components): TRL scales it by
    nothing more."""

    def __init__(self, verifier: BaseBackend, *, group_size: int, lam: float = 1.0, objective: Objective = "both",
                 mode: VerifyMode = "per_item", verify_max_tokens: int = 16, structured: bool = True,
                 heldout_dir: Path | None = None) -> None:
        from training.heldout import SCORES, EvalScores

        if objective not in ("both", "disc", "anchor"):
            raise ValueError(f"objective must be both, disc or anchor, got {objective!r}")
        self.verifier = verifier
        self.group_size = group_size
        self.lam = lam
        self.objective = objective
        self.mode = mode
        self.verify_max_tokens = verify_max_tokens
        self.structured = structured
        self.eval_scores = EvalScores(Path(heldout_dir) / SCORES) if heldout_dir is not None else None
        self.history: list[dict[str, float | None]] = []
        """The stats of every training call, in order (what was logged)."""
        self.eval_history: list[dict[str, float | None]] = []
        """The stats of every held-out call, in order."""
        self.calls: list[dict[str, Any]] = []
        """Every call's completions, outcomes and rewards, in order (in memory only: for audits and tests)."""

    async def score(self, text: str, question: str, responses: Sequence[str], anchor: Sequence[str],
                    verifier: BaseBackend, *, on_set: bool = True, on_anchor: bool = True) -> RubricOutcome:
        """The rewards of one rubric text: `disc` from the verdicts on the set (`on_set`), `anchor` and the anchor
        order from the verdicts on the anchors (`on_anchor`); a reward not asked for stays None."""
        try:
            rubric: Rubric = parse_rubric(text)
        except RubricParseError:
            return RubricOutcome(None, None, failure="parse")

        async def verdicts(found: Sequence[str], wanted: bool) -> list[list[float | None]]:
            if not wanted:
                return []
            return (await verify(verifier, question, found, rubric, mode=self.mode,
                                 max_tokens=self.verify_max_tokens, structured=self.structured)).verdicts

        set_verdicts, anchor_verdicts = await asyncio.gather(verdicts(responses, on_set), verdicts(anchor, on_anchor))
        if any(v is None for row in set_verdicts + anchor_verdicts for v in row):
            return RubricOutcome(None, None, len(rubric), failure="verify")
        disc = saturated = anchor_value = order = gap = None
        if on_set:
            matrix = binary_verdicts(np.array(set_verdicts, dtype=float))
            disc, saturated = disc_reward(rubric.weights, matrix), saturated_share(matrix)
        if on_anchor:
            scores = aggregate(rubric.weights, np.array(anchor_verdicts, dtype=float))
            anchor_value, order, gap = anchor_reward(scores), anchor_order_accuracy(scores), anchor_gap(scores)
        return RubricOutcome(disc, anchor_value, len(rubric), saturated, anchor_order=order, anchor_gap=gap)

    def combine(self, outcomes: Sequence[RubricOutcome]) -> list[float | None]:
        """The advantage-level combination `z(disc) + lam * z(anchor)` per group (or one of them alone)."""
        need = {"both": ("disc", "anchor"), "disc": ("disc",), "anchor": ("anchor",)}[self.objective]
        ok = [all(getattr(o, name) is not None for name in need) for o in outcomes]
        w_disc = 0.0 if self.objective == "anchor" else 1.0
        w_anchor = 0.0 if self.objective == "disc" else self.lam
        parts = []
        for name, weight in (("disc", w_disc), ("anchor", w_anchor)):
            if name in need:
                z = group_standardise([getattr(o, name) if k else None for o, k in zip(outcomes, ok)], self.group_size)
                parts.append([None if v is None else weight * v for v in z])
        return [None if any(p[i] is None for p in parts) else sum(p[i] for p in parts) for i in range(len(outcomes))]

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], *, question: Sequence[str],
                       responses: Sequence[Sequence[str]], anchor: Sequence[Sequence[str]],
                       split: Sequence[str] | None = None, row: Sequence[str] | None = None,
                       trainer_state: Any = None, log_metric: Any = None, **_: Any) -> list[float | None]:
        started = time.perf_counter()
        verifier = _Counted(self.verifier)
        texts = [completion_text(c) for c in completions]
        # Training batches verify what the objective uses; held-out batches verify both, to report both.
        where = _split(split)
        heldout = where != "train"  # an evaluation: the held-out split, or the training prompts (`seen`)
        wanted = {"on_set": heldout or self.objective != "anchor", "on_anchor": heldout or self.objective != "disc"}
        outcomes = await asyncio.gather(*(
            self.score(t, q, r, a, verifier, **wanted) for t, q, r, a in zip(texts, question, responses, anchor)))
        rewards = self.combine(outcomes)
        self.calls.append({"texts": texts, "question": list(question), "responses": [list(r) for r in responses],
                           "anchor": [list(a) for a in anchor], "outcomes": list(outcomes), "rewards": rewards,
                           "split": where})
        if heldout and self.eval_scores is not None and row is not None:
            step = trainer_state.global_step if trainer_state is not None else len(self.calls) - 1
            self.eval_scores.write(step, row, [o.disc for o in outcomes], split=where)
        stats = _stats(rewards, [len(t) for t in texts], self.group_size, verifier.requests, started,
                       [o.size for o in outcomes if o.size], [o.saturated for o in outcomes],
                       [o.failure for o in outcomes])
        for name in ("disc", "anchor"):
            mean, std = _mean_std([getattr(o, name) for o in outcomes])
            stats[f"{name}_mean"], stats[f"{name}_std"] = mean, std
        stats["anchor_pair_acc"] = _mean_std([o.anchor_order for o in outcomes])[0]
        stats["gap"] = _mean_std([o.anchor_gap for o in outcomes])[0]
        (self.eval_history if heldout else self.history).append(stats)
        RewardStats({f"dr/{k}": v for k, v in stats.items()}).log(log_metric)
        return rewards


class PolicyReward:
    """The DR-Policy's reward: each group's completions, thinking stripped, scored by one evaluator `score_set`
    call (by default the `dynamic-rubric` evaluator: one rubric per group; see the module docstring).

    Dataset columns it reads: `question` (the prompt as the evaluator sees it) and `row` (the row's id, which with
    the step seeds the group's evaluation).

    Args:
        evaluator: Any evaluator (`judges.base.Evaluator`: a `judges.dynamic.RubricEvaluator`, a scalar RM, ...).
        group_size: TRL's `num_generations`.
        seed: Run seed (each group's seed derives from it, the row and the call).
        per_row: Seed each group by its row alone, not the step (a static rubric: made once per prompt, the call
            cache answers it again in later epochs).
        eval_group_size: Completions per held-out prompt (TRL's `num_generations_eval`; None: `group_size`).
        heldout_dir: Where the held-out evaluation keeps its per-prompt record (`training.heldout`): the fixed
            rubrics (a dynamic rubric evaluator's: made once per held-out prompt, then only verified) and each
            evaluation's per-prompt scores. None: neither (each held-out group gets a rubric of its own).
    """

    __name__ = "dr_policy"
    scale_rewards: ClassVar[str] = "group"
    """GRPO's advantage: the score centred and divided by its group's standard deviation."""

    def __init__(self, evaluator: Any, *, group_size: int, seed: int = 0, per_row: bool = False,
                 eval_group_size: int | None = None, heldout_dir: Path | None = None) -> None:
        from judges.dynamic import RubricEvaluator
        from training.heldout import RUBRICS, SCORES, EvalScores, FixedRubrics

        self.evaluator = evaluator
        self.group_size = group_size
        self.eval_group_size = eval_group_size or group_size
        self.seed = seed
        self.per_row = per_row
        fixed = heldout_dir is not None and isinstance(evaluator, RubricEvaluator) and evaluator.dynamic
        self.fixed = FixedRubrics(Path(heldout_dir) / RUBRICS) if fixed else None
        """The held-out prompts' fixed rubrics (None: the evaluator scores every held-out group afresh)."""
        self.eval_scores = EvalScores(Path(heldout_dir) / SCORES) if heldout_dir is not None else None
        self.history: list[dict[str, float | None]] = []
        """The stats of every training call, in order (what was logged)."""
        self.eval_history: list[dict[str, float | None]] = []
        """The stats of every held-out call, in order."""
        self.calls: list[dict[str, Any]] = []
        """Every call's completions, rubric traces and rewards, in order (in memory only)."""

    async def _group(self, question: str, texts: list[str], *, row: str, seed: int, step: int,
                     heldout: bool) -> tuple[list[float | None], Any, int, float | None, list[str | None], int]:
        """(scores, trace, rubric size, saturated share, unscored cause per completion, backend calls) of one
        group: the evaluator's `score_set`, or on held-out rows the prompt's fixed rubric."""
        from training.heldout import score_fixed

        if heldout and self.fixed is not None:
            scores, saturated, found, cause = await score_fixed(
                self.evaluator, self.fixed, row=row, question=question, responses=texts, seed=seed, step=step)
            rubric = self.fixed.get(row)
            causes = [cause if s is None else None for s in scores]
            if found is None:  # the prompt has no rubric
                return scores, None, 0, None, causes, 0
            return scores, found, len(rubric) if rubric is not None else 0, saturated, causes, found.calls
        result = await self.evaluator.score_set(question, texts, seed=seed)
        trace = result.trace
        stages = {f.stage for f in trace.failures}
        cause = "parse" if "generate_rubric" in stages else "verify" if stages else None
        return (list(result.scores), trace, len(trace.rubric or ()), trace.saturated_share,
                [cause if s is None else None for s in result.scores], trace.calls)

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], *, question: Sequence[str],
                       row: Sequence[str], split: Sequence[str] | None = None, trainer_state: Any = None,
                       log_metric: Any = None, **_: Any) -> list[float | None]:
        from harness.seeds import derive_seed

        started = time.perf_counter()
        texts = [strip_thinking(completion_text(c)) for c in completions]
        where = _split(split)
        evaluating = where != "train"  # the held-out split, or the training prompts evaluated (`seen`)
        g = self.eval_group_size if evaluating else self.group_size
        starts = range(0, len(texts), g)
        # The group's seed: the run seed, the row, and the step that generated the group (the same on a resumed
        # run; a held-out group is seeded apart from a training group of the same step); the row alone per_row.
        step = trainer_state.global_step if trainer_state is not None else len(self.calls)
        keys = [(row[s],) if self.per_row else (row[s], step) for s in starts]
        seeds = [derive_seed(self.seed, *key) if where == "train" else derive_seed(self.seed, key[0], where, *key[1:])
                 for key in keys]
        groups = await asyncio.gather(*(
            self._group(question[s], texts[s:s + g], row=row[s], seed=seed, step=step, heldout=evaluating)
            for s, seed in zip(starts, seeds)))
        rewards: list[float | None] = [score for found in groups for score in found[0]]
        self.calls.append({"texts": texts, "question": list(question), "traces": [found[1] for found in groups],
                           "rewards": rewards, "split": where, "row": list(row), "step": step})
        if evaluating and self.eval_scores is not None:
            self.eval_scores.write(step, row, rewards, split=where)
        stats = _stats(rewards, [len(t) for t in texts], g, sum(found[5] for found in groups), started,
                       [found[2] for found in groups if found[2]], [found[3] for found in groups],
                       [cause for found in groups for cause in found[4]])
        (self.eval_history if evaluating else self.history).append(stats)
        RewardStats({f"dr/{k}": v for k, v in stats.items()}).log(log_metric)
        return rewards


class ShuffledReward:
    """The shuffled control's reward (`--control shuffled`): `reward`'s values on every training batch, permuted
    within the batch (the call's completions, this process's share) before TRL computes the advantages.

    The permutation keeps the batch's rewards as a multiset and breaks their tie to the completions: the run takes
    steps of the same size on the same data at the same learning rate, learning nothing from the reward, so what its
    held-out score moves by is drift. Held-out batches are scored as they are. The permutation is seeded by the run
    seed and the step.

    Args:
        reward: The reward to shuffle (its `scale_rewards`, histories and calls are this one's).
        seed: The run seed.
    """

    def __init__(self, reward: Any, *, seed: int) -> None:
        self.reward = reward
        self.__name__ = reward.__name__  # TRL's log keys (`rewards/NAME/...`) as the trained run's
        self.seed = seed
        self.scale_rewards = reward.scale_rewards
        self.permutations: list[list[int]] = []
        """Each training call's permutation: the reward at position i is the one computed for position p[i]."""

    def __getattr__(self, name: str) -> Any:
        if name == "reward":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.reward, name)

    async def __call__(self, *args: Any, split: Sequence[str] | None = None, trainer_state: Any = None,
                       **kwargs: Any) -> list[float | None]:
        from harness.seeds import derive_seed

        rewards = await self.reward(*args, split=split, trainer_state=trainer_state, **kwargs)
        if _split(split) != "train":  # an evaluation is scored as it is
            return rewards
        step = trainer_state.global_step if trainer_state is not None else len(self.permutations)
        order = np.random.default_rng(derive_seed(self.seed, "shuffle", step)).permutation(len(rewards)).tolist()
        self.permutations.append(order)
        return [rewards[i] for i in order]


def _stats(rewards: Sequence[float | None], lengths: Sequence[int], group_size: int, calls: int, started: float,
           sizes: Sequence[int], saturated: Sequence[float | None], failures: Sequence[str | None]
           ) -> dict[str, float | None]:
    mean, std = _mean_std(rewards)
    found_saturated = [s for s in saturated if s is not None]
    return {
        "reward_mean": mean,
        "reward_std": std,
        "parse_rate": sum(f != "parse" for f in failures) / len(failures) if failures else None,
        "zero_std_groups": zero_std_share(rewards, group_size),
        "saturated_items": float(np.mean(found_saturated)) if found_saturated else None,
        "rubric_size": float(np.mean(sizes)) if sizes else None,
        "length_corr": length_correlation(rewards, lengths),
        "verifier_calls": float(calls),
        "unscored_parse": float(sum(f == "parse" for f in failures)),
        "unscored_verify": float(sum(f == "verify" for f in failures)),
        "reward_seconds": time.perf_counter() - started,
    }


def _split(split: Sequence[str] | None) -> str:
    """The split of one reward call's rows (`train` when the dataset has no `split` column)."""
    return split[0] if split else "train"
