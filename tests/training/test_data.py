"""Nectar filtering (Appendix B.1 generator sets, B.2 policy prompts): each rule on hand-made rows, the per-rule
counts, LMSYS always held out, and the real rows in `../shared/data/nectar` read."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from training.data import (
    FilterReport,
    GeneratorRules,
    NectarRow,
    PolicyRules,
    filter_rows,
    fingerprint,
    is_boilerplate,
    is_degenerate,
    is_repetitive,
    read_nectar,
    row_from_nectar,
)

GOOD = [
    f"Answer {i}: a clear, specific and complete response that explains the steps one by one and why they work."
    for i in range(7)
]
PROMPT = "Explain how to plan a week of vegetarian dinners on a small budget for a family of four."


def _row(responses=GOOD, *, prompt=PROMPT, sources=("sharegpt",), turns=1, index=0, ranked=True) -> NectarRow:
    return NectarRow(index, prompt, turns, tuple(sources), tuple(responses), ranked)


def _why(rules, row: NectarRow) -> str | None:
    """The first rule that drops `row` (None: kept)."""
    report = FilterReport()
    kept = list(filter_rows([row], rules.rules(), report))
    return None if kept else next(iter(report.dropped))


def test_a_clean_set_passes_every_generator_rule():
    assert _why(GeneratorRules(), _row()) is None


@pytest.mark.parametrize(
    "row, rule",
    [
        (_row(sources=("lmsys-chat-1m", "sharegpt")), "lmsys_heldout"),
        (_row(ranked=False), "ranked"),
        (_row(GOOD[:6]), "min_responses"),
        (_row(prompt="Plan vegetarian dinners."), "min_prompt_chars"),
        (_row(["Sure, here it is: a short one."] + GOOD[1:]), "min_top_chars"),
        (_row(GOOD[:5] + ["spam " * 60, "buy now " * 40]), "repetitive"),
        (_row(GOOD[:6] + ["?!?!...!!! ###"]), "degenerate"),
        (_row(GOOD[:3] + ["Cook beans and rice in bulk."] * 4), "useful"),
        (_row(GOOD[:4] + ["As an AI language model, I cannot plan meals for you, but here are tips: "
                          "buy beans, rice and seasonal vegetables and cook in bulk."] * 3), "boilerplate"),
    ],
)
def test_each_generator_rule_drops_its_case(row: NectarRow, rule: str):
    assert _why(GeneratorRules(), row) == rule


def test_rules_switch_off_and_thresholds_move():
    assert _why(GeneratorRules(min_responses=None, min_useful=3), _row(GOOD[:6])) is None
    assert _why(GeneratorRules(min_prompt_chars=10), _row(prompt="Plan vegetarian dinners.")) is None
    assert _why(GeneratorRules(max_repetitive=2), _row(GOOD[:5] + ["spam " * 60, "buy now " * 40])) is None
    long = GOOD[:6] + ["A complete answer. " * 30]
    assert _why(GeneratorRules(max_response_chars=500), _row(long)) == "max_response_chars"
    assert _why(GeneratorRules(max_response_chars=600), _row(long)) is None
    assert _why(GeneratorRules(), _row(long)) is None  # off by default
    with pytest.raises(ValidationError):
        GeneratorRules(min_responses=1)
    with pytest.raises(ValidationError):
        GeneratorRules(lmsys_heldout=False)  # the held-out benchmark is not a setting


def test_response_properties():
    assert is_repetitive("the same words again " * 20, 0.5) and not is_repetitive(GOOD[0] * 1, 0.5)
    assert not is_repetitive("short short short short", 0.5)  # under 30 words: not judged
    assert is_degenerate("  ok ", 5, 0.5) and is_degenerate("%%%% $$$$ ####", 5, 0.5)
    assert not is_degenerate("A fine answer.", 5, 0.5)
    assert is_boilerplate("I\u2019m sorry, but I can\u2019t help with that.") and not is_boilerplate(GOOD[0])


def test_policy_prompts_short_prompt_exemption_turns_and_duplicates():
    rules = PolicyRules(max_turns=2)
    short_substantive = _row([("Inflation is caused by " + "demand and supply factors, " * 10)] + GOOD[1:],
                             prompt="What causes inflation?", index=1)
    short_trivial = _row(["Hi!"] + GOOD[1:], prompt="Say hi.", index=2)
    rows = [_row(index=0), short_substantive, short_trivial, _row(index=3, turns=3), _row(index=4),
            _row(index=5, sources=("lmsys-chat-1m",))]
    report = FilterReport()
    kept = list(filter_rows(rows, rules.rules(), report))
    assert [r.index for r in kept] == [0, 1]
    assert report.dropped == {"min_prompt_chars": 1, "max_turns": 1, "duplicate": 1, "lmsys_heldout": 1}
    assert (report.seen, report.kept) == (6, 2)
    assert report.examples["duplicate"] == "nectar:4: duplicate prompt"
    no_exemption = PolicyRules(short_prompt_top_chars=None)
    assert _why(no_exemption, short_substantive) == "min_prompt_chars"


def test_row_mapping_from_the_upstream_format():
    row = {"prompt": "\n\nHuman: " + PROMPT + "\n\nAssistant: ", "turns": 1, "source": ["anthropic-hh"],
           "answers": [{"answer": f"r{rank}", "model": "m", "rank": float(rank)} for rank in (3, 1, 2)]}
    mapped = row_from_nectar(row, 7, "row 7")
    assert (mapped.id, mapped.prompt, mapped.responses, mapped.sources) == ("nectar:7", PROMPT, ("r1", "r2", "r3"),
                                                                            ("anthropic-hh",))
    unranked = row_from_nectar({**row, "answers": [{"answer": "a", "model": "m"}]}, 0, "row 0")
    assert not unranked.ranked and unranked.responses == ("a",)
    assert fingerprint([mapped]) != fingerprint([unranked]) and len(fingerprint([mapped])) == 16


def test_the_real_nectar_rows(shared_data: Path):
    ranked = list(read_nectar(shared_data / "nectar" / "ablation_baseline_no_tiebreak_rankings.jsonl"))
    assert len(ranked) == 194 and all(r.ranked and len(r.responses) == 7 for r in ranked)
    report = FilterReport()
    kept = list(filter_rows(ranked, GeneratorRules().rules(), report))
    assert report.seen == 194 and report.kept == len(kept) == 194 - sum(report.dropped.values())
    assert 0 < len(kept) < 194
    sourced = list(read_nectar(shared_data / "nectar" / "ablation_pointwise_pairwise_baseline_data.jsonl"))
    report = FilterReport()
    list(filter_rows(sourced, PolicyRules().rules(), report))
    assert report.dropped["lmsys_heldout"] == 27  # the authors' sample's LMSYS-Chat-1M rows
