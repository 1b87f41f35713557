"""`harness bench reward`: the DR-Generator reward's cost per step with `per_item` against `logprob` verification.

The paper's Limitations name the serial generator-verifier calls as its cost. One run scores the same groups of
rubric completions (fixed rubrics, one set and one anchor list per group) with `training.rewards.GeneratorReward`
twice, once per mode, on the same verifier model with the call cache off, and prints each call's wall time, its
verifier requests, and the per_item/logprob time ratio measured in that one run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from harness.backends.base import BackendOptions

_RUBRICS = (
    '[{"criterion": "Does it answer the question?", "weight": 3}, {"criterion": "Is it polite?", "weight": 1}, '
    '{"criterion": "Is it under three sentences?", "weight": 2}]',
    '[{"criterion": "Does it name a city?", "weight": 4}, {"criterion": "Is it correct?", "weight": 5}]',
    '[{"criterion": "Is it in English?", "weight": 2}, {"criterion": "Does it explain why?", "weight": 3}, '
    '{"criterion": "Is it free of errors?", "weight": 4}]',
    '[{"criterion": "Is it specific?", "weight": 3}, {"criterion": "Does it stay on topic?", "weight": 2}]',
)
_GROUPS = (
    ("What is the capital of France?", ("Paris.", "The capital of France is Paris, on the Seine.", "Lyon."),
     ("Paris is the capital of France.", "Paris.", "I think it is Marseille.")),
    ("Why is the sky blue?", ("Rayleigh scattering of sunlight.", "Because it reflects the sea.", "It is blue."),
     ("Air scatters blue light more than red (Rayleigh scattering).", "Sunlight scatters.", "No idea.")),
)


@dataclass(frozen=True, slots=True)
class RewardTiming:
    mode: str
    seconds: float
    requests: int
    rewards: list


def run_bench_reward(model: str, *, options: BackendOptions, group_size: int = 2) -> list[RewardTiming]:
    """Time `GeneratorReward` in `per_item` and `logprob` mode on the same completions (cache off)."""
    from harness.pool import BackendPool
    from training.rewards import GeneratorReward

    texts, question, responses, anchor = [], [], [], []
    for g, (q, rs, an) in enumerate(_GROUPS):
        for i in range(group_size):
            texts.append(_RUBRICS[(g * group_size + i) % len(_RUBRICS)])
            question.append(q)
            responses.append(list(rs))
            anchor.append(list(an))
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    found = []

    async def go():
        pool = BackendPool(options=options, cache=None)
        try:
            backend = pool.get(model)
            await backend.probe()  # the model loads before either timing starts
            for mode in ("per_item", "logprob"):
                reward = GeneratorReward(backend, group_size=group_size, mode=mode)
                calls = pool.calls
                start = time.perf_counter()
                rewards = await reward([None] * len(texts), completions, question=question, responses=responses,
                                       anchor=anchor)
                found.append(RewardTiming(mode, time.perf_counter() - start, pool.calls - calls, rewards))
        finally:
            await pool.close()

    asyncio.run(go())
    return found


def format_bench_reward(timings: list[RewardTiming], *, model: str) -> str:
    by_mode = {t.mode: t for t in timings}
    lines = [f"generator reward on {model}: {len(timings[0].rewards)} rubric completions in "
             f"{len(_GROUPS)} groups, each verified on a 3-response set and 3 anchors (call cache off)"]
    for t in timings:
        scored = sum(r is not None for r in t.rewards)
        lines.append(f"  {t.mode:<9} {t.seconds:8.2f} s  {t.requests:4d} verifier requests  {scored} scored")
    lines.append(f"per_item/logprob: {by_mode['per_item'].seconds / by_mode['logprob'].seconds:.2f}x wall time, "
                 f"{by_mode['per_item'].requests / max(1, by_mode['logprob'].requests):.2f}x requests (one run)")
    return "\n".join(lines)
