"""Our JudgeBench rule (`benchmarks.metrics.judgebench_result`) on the judge outputs that JudgeBench ships.

`../shared/data/judgebench/judge_outputs/` holds two LLM judges' and five reward models' outputs on the GPT-4o
and Claude pairs; its PROVENANCE.md lists the accuracy the official `compute_final_metrics` gives each file. Each
record has two judgments: the original order, then the swapped one (whose decision is in the swapped frame).
Reward-model records also carry the two scalar scores of each order, which `decisions_from_scores` reads as a
score-based evaluator's decisions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.metrics import decisions_from_scores, judgebench_result

OFFICIAL = {
    "claude-3-5-sonnet-20240620_pairs__arena_hard_judge__claude-3-haiku-20240307.jsonl": (270, 32.2222),
    "gpt-4o-2024-05-13_pairs__arena_hard_judge__o1-mini-2024-09-12.jsonl": (350, 65.7143),
    "gpt-4o-2024-05-13_pairs__reward_model__Skywork_Skywork-Reward-Gemma-2-27B.jsonl": (350, 64.2857),
    "gpt-4o-2024-05-13_pairs__reward_model__Skywork_Skywork-Reward-Llama-3.1-8B.jsonl": (350, 62.2857),
    "gpt-4o-2024-05-13_pairs__reward_model__internlm_internlm2-20b-reward.jsonl": (350, 63.4286),
    "gpt-4o-2024-05-13_pairs__reward_model__internlm_internlm2-7b-reward.jsonl": (350, 59.4286),
    "gpt-4o-2024-05-13_pairs__reward_model__Ray2333_GRM-Gemma-2B-rewardmodel-ft.jsonl": (350, 59.4286),
}
O1_MINI_BY_SOURCE = {"mmlu-pro": 58.44, "livebench-reasoning": 62.24, "livebench-math": 82.14, "livecodebench": 78.57}
FLIP = {"A>B": "B>A", "B>A": "A>B", "A=B": "A=B", None: None}


def _records(shared_data: Path, name: str) -> list[dict]:
    path = shared_data / "judgebench" / "judge_outputs" / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _decision(decision: str | None, label: str) -> int | None:
    """A verdict in the original frame as a JudgeBench decision: +1 right, -1 wrong, 0 tie, None unparsable."""
    if decision is None:
        return None
    return 1 if decision == label else -1 if decision == FLIP[label] else 0


def _decisions(record: dict) -> list[int | None]:
    first, swapped = record["judgments"]
    return [_decision(first["decision"], record["label"]), _decision(FLIP[swapped["decision"]], record["label"])]


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_the_official_accuracy_of_every_shipped_judge_output(shared_data: Path, name: str) -> None:
    records = _records(shared_data, name)
    n, official = OFFICIAL[name]
    result = judgebench_result([_decisions(r) for r in records])
    assert len(records) == result.n == n
    assert round(100 * result.value, 4) == official


@pytest.mark.parametrize("name", sorted(n for n in OFFICIAL if "reward_model" in n))
def test_reward_model_scores_read_as_a_score_based_evaluator_give_the_same_accuracy(
    shared_data: Path, name: str
) -> None:
    pairs = []
    for record in _records(shared_data, name):
        (a1, b1), (b2, a2) = (j["judgment"]["scores"] for j in record["judgments"])  # order 2 shows B first
        preferred_first = record["label"] == "A>B"
        orders = [(a1, b1), (a2, b2)] if preferred_first else [(b1, a1), (b2, a2)]
        pairs.append(decisions_from_scores(orders))
    assert round(100 * judgebench_result(pairs).value, 4) == OFFICIAL[name][1]


def test_o1_mini_per_category(shared_data: Path) -> None:
    records = _records(shared_data, "gpt-4o-2024-05-13_pairs__arena_hard_judge__o1-mini-2024-09-12.jsonl")
    for source, expected in O1_MINI_BY_SOURCE.items():
        chosen = [_decisions(r) for r in records if r["source"].startswith(source)]
        assert round(100 * judgebench_result(chosen).value, 2) == expected, source
