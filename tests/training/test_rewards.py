"""The rewards as the paper defines them, on scripted verifiers (no training): R_disc on binary verdicts (an item the
verifier is unsure about for every response earns 0), Δ_gap on the anchors, the policy's completions and the
generator's sets judged without their thinking, RaR's static rubric made once per prompt, and each reward's
advantage scaling."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.backends.base import BaseBackend, Completion, LogprobResult, Usage
from judges.base import SetScores, Trace
from judges.rubric import disc_reward
from training.rewards import GeneratorReward, PolicyReward, anchor_gap, binary_verdicts

RUBRIC = '[{"criterion": "Is it clear?", "weight": 2}, {"criterion": "Is it brief?", "weight": 3}]'


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


class Verifier(BaseBackend):
    """Answers every verification by `p_yes(response, criterion)`: P(yes) in logprob mode, and in per_item mode
    the word its P(yes) makes more likely; rubric requests get `RUBRIC`."""

    kind = "scripted"
    model = "scripted-verifier"

    def __init__(self, p_yes) -> None:
        self.p_yes = p_yes
        self.rubric_requests = 0

    def _p(self, text: str) -> float:
        return self.p_yes(_between(text, "[Response]\n", "\n[End of Response]"),
                          _between(text, "\nCriterion: ", "\n"))

    async def generate(self, requests):
        out = []
        for request in requests:
            text = request.messages[-1].content
            if "[Response]" in text:
                out.append(Completion(("Yes" if self._p(text) > 0.5 else "No",), Usage(10, 1)))
            else:
                self.rubric_requests += 1
                out.append(Completion((RUBRIC,), Usage(10, 10)))
        return out

    async def next_token_logprobs(self, requests, candidates):
        out = []
        for request in requests:
            branches = []
            for context in request.contexts():
                p = self._p(context[-1].content)
                found = {"Yes": math.log(p), "No": math.log(1 - p)}
                branches.append({c: found.get(c, -math.inf) for c in candidates})
            out.append(LogprobResult({}, branches=tuple(branches), usage=Usage(10, 0)))
        return out


def _disc(verifier: Verifier, mode: str, responses: list[str]) -> float | None:
    reward = GeneratorReward(verifier, group_size=2, mode=mode)
    return asyncio.run(reward.score(RUBRIC, "Question?", responses, ["best", "worst"], verifier)).disc


@pytest.mark.parametrize("mode", ["logprob", "per_item"])
def test_an_item_the_verifier_is_unsure_about_for_every_response_earns_nothing(mode: str):
    responses = ["one", "two", "three", "four"]
    for p in (0.5, 0.45, 0.3):
        unsure = Verifier(lambda response, criterion: p)
        assert _disc(unsure, mode, responses) == 0.0
    soft = np.full((2, 4), 0.5)
    assert disc_reward([2, 3], soft) == 0.25  # what P(yes) read as verdicts would pay the unsure verifier
    # A verifier that separates one response from the rest still earns the paper's p (1 - p) = 3/16.
    separating = Verifier(lambda response, criterion: 0.9 if response == "one" else 0.2)
    assert _disc(separating, mode, responses) == pytest.approx(3 / 16)


def test_binary_verdicts_read_p_yes_as_the_more_likely_answer():
    assert binary_verdicts(np.array([[0.5, 0.51, 0.0, 1.0]])).tolist() == [[0.0, 1.0, 0.0, 1.0]]


def test_the_anchor_gap_is_logged_with_the_rewards():
    """Scores on the anchors best, middle, worst: 1, 0.4 (the weight-2 item of 5), 0; Δ_gap = mean(0.6, 1, 0.4)."""
    yes = {("best", "Is it clear?"), ("best", "Is it brief?"), ("middle", "Is it clear?")}
    verifier = Verifier(lambda response, criterion: 0.9 if (response, criterion) in yes else 0.1)
    reward = GeneratorReward(verifier, group_size=2)
    logged = {}
    asyncio.run(reward([None, None], [RUBRIC, "not a rubric"], question=["Q?", "Q?"],
                       responses=[["best", "worst"]] * 2, anchor=[["best", "middle", "worst"]] * 2,
                       log_metric=logged.__setitem__))
    assert anchor_gap([1.0, 0.4, 0.0]) == pytest.approx(2 / 3)
    assert reward.calls[0]["outcomes"][0].anchor_gap == pytest.approx(2 / 3)
    assert logged["dr/gap"] == pytest.approx(2 / 3) and reward.history[0]["gap"] == pytest.approx(2 / 3)


class Recording:
    """An evaluator that records what it was asked to score and scores each response by its length."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[str], int]] = []

    async def score_set(self, prompt, responses, *, seed):
        self.asked.append((prompt, list(responses), seed))
        return SetScores(tuple(float(len(r)) for r in responses), Trace())


def _policy_call(reward: PolicyReward, step: int, texts: list[str]) -> list[float | None]:
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    return asyncio.run(reward([None] * len(texts), completions, question=["Q?"] * len(texts),
                              row=["r0"] * 2 + ["r1"] * 2, trainer_state=SimpleNamespace(global_step=step)))


def test_the_policys_completions_reach_the_evaluator_without_their_thinking():
    evaluator = Recording()
    reward = PolicyReward(evaluator, group_size=2)
    rewards = _policy_call(reward, 1, ["<think>long reasoning</think>\n\nShort answer.", "Plain answer.",
                                       "<think>never closed", "Another answer."])
    assert [a[1] for a in evaluator.asked] == [["Short answer.", "Plain answer."], ["", "Another answer."]]
    assert rewards == [13.0, 13.0, 0.0, 15.0]


def test_a_static_rubric_is_seeded_by_the_row_alone():
    per_step, per_row = Recording(), Recording()
    for step in (1, 5):
        _policy_call(PolicyReward(per_step, group_size=2), step, ["a", "b", "c", "d"])
        _policy_call(PolicyReward(per_row, group_size=2, per_row=True), step, ["a", "b", "c", "d"])
    seeds = [a[2] for a in per_row.asked]
    assert seeds[:2] == seeds[2:] and seeds[0] != seeds[1]  # the same per row in every step, one per row
    assert len({a[2] for a in per_step.asked}) == 4


def test_rars_static_rubric_is_made_once_per_prompt_across_epochs(tmp_path: Path):
    """Through the call cache, as training runs it: two steps over the same rows ask the generator once per row."""
    from harness.cache import CachedBackend, CallCache
    from judges.dynamic import RubricEvaluator

    scripted = Verifier(lambda response, criterion: 0.7 if len(response) > 1 else 0.2)
    backend = CachedBackend(scripted, CallCache(tmp_path / "cache.sqlite"))
    static = RubricEvaluator("static-rubric:generator=scripted", generator=backend, verifier=backend, dynamic=False)
    reward = PolicyReward(static, group_size=2, per_row=True)
    for step in (1, 2, 3):
        rewards = _policy_call(reward, step, ["a", "bb", "c", "dd"])
    assert scripted.rubric_requests == 2
    assert rewards == [0.0, 1.0, 0.0, 1.0]


def test_each_reward_declares_the_papers_advantage_scaling(tmp_path: Path):
    pytest.importorskip("trl")
    from training.grpo import GRPOSettings, grpo_config

    settings = GRPOSettings(num_generations=2, per_device_train_batch_size=2, max_steps=1, report_to=[])
    assert grpo_config(settings, tmp_path, scale_rewards=PolicyReward.scale_rewards).scale_rewards == "group"
    assert grpo_config(settings, tmp_path, scale_rewards=GeneratorReward.scale_rewards).scale_rewards == "none"
    changed = settings.model_copy(update={"scale_rewards": "batch"})
    assert grpo_config(changed, tmp_path, scale_rewards=PolicyReward.scale_rewards).scale_rewards == "batch"


def test_the_generators_sets_are_read_without_their_thinking(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    from harness.records import GenerationRecord
    from harness.runstore import RecordLog
    from training.data import NectarRow
    from training.grpo import SetSampling, read_sets

    sets = tmp_path / "sets.jsonl"
    texts = ["<think>the user wants tips</think>\n\nBuy beans.", "Cook rice.", "<think>still thinking when the budget"]
    log = RecordLog(sets, GenerationRecord, writable=True)
    log.append([GenerationRecord("nectar:0", i, "policy", text) for i, text in enumerate(texts)])
    rows = [NectarRow(0, "Plan dinners on a budget, please, for a family of four people.", 1, (), ("a",) * 7)]
    with caplog.at_level("INFO", logger="harness.train"):
        kept, found = read_sets(rows, SetSampling(policy="policy", set_size=3), sets)
    assert kept == rows and found == [["Buy beans.", "Cook rice.", ""]]
    assert "1 of 3 sampled responses are empty once their thinking is stripped" in caplog.text
