"""Nectar filtering (Appendix B.1 generator sets, B.2 policy prompts): the paper's counts as the defaults, each rule
on hand-made rows, the per-rule counts, LMSYS always held out, and the rules on the real rows in
`../shared/data/nectar`."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from training.data import (
    UPSTREAM_FILTERED,
    FilterReport,
    GeneratorRules,
    NectarRow,
    PolicyRules,
    filter_rows,
    fingerprint,
    read_nectar,
    row_from_nectar,
)
from training.responses import DEGENERATE, Kind, classify, is_repetitive, refusal

GOOD = [
    f"Answer {i}: a clear, specific and complete response that explains the steps one by one and why they work."
    for i in range(7)
]
PROMPT = "Explain how to plan a week of vegetarian dinners on a small budget for a family of four."
REFUSAL = "I'm sorry, but I can't assist with that."
DISCLAIMER = "As an AI language model, I don't have personal preferences. I'm here to help with other questions."
ALTERNATIVE = ("I'm sorry, but I can't plan your meals for you. However, I can suggest a start: cook beans, rice and "
               "seasonal vegetables in bulk on Sunday and vary the spices through the week.")
LOOP = "buy now " * 40


def _row(responses=GOOD, *, prompt=PROMPT, sources=("sharegpt",), turns=1, index=0, ranked=True) -> NectarRow:
    return NectarRow(index, prompt, turns, tuple(sources), tuple(responses), ranked)


def _why(rules, row: NectarRow) -> str | None:
    """The first rule that drops `row` (None: kept)."""
    report = FilterReport()
    kept = list(filter_rows([row], rules.rules(), report))
    return None if kept else next(iter(report.dropped))


def test_the_defaults_are_the_papers_counts():
    """Appendix B.1: any repetitive response discards a set, 4 degenerate or 4 boilerplate ones do; B.2: 7
    responses, a rank-1 response over 50 characters that is no plain refusal, greeting or clarification."""
    rules = GeneratorRules()
    assert (rules.min_responses, rules.min_prompt_chars, rules.min_top_chars) == (7, 50, 50)
    assert (rules.max_repetitive, rules.max_degenerate, rules.max_boilerplate) == (0, 3, 3)
    policy = PolicyRules()
    assert (policy.min_responses, policy.min_prompt_chars, policy.min_top_chars, policy.top_response) == (
        7, 50, 50, True)


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
        (_row(GOOD[:6] + [LOOP]), "repetitive"),  # one is enough
        (_row(GOOD[:3] + [REFUSAL, "Hello! How can I help you today?", "Could you please provide more details?",
                          "?!?!...!!! ###"]), "degenerate"),  # 4: broken, plain refusal, greeting, clarification
        (_row(GOOD[:3] + [DISCLAIMER] * 4), "boilerplate"),
        (_row(GOOD[:3] + ["Cook beans and rice in bulk."] * 4), "useful"),
    ],
)
def test_each_generator_rule_drops_its_case(row: NectarRow, rule: str):
    assert _why(GeneratorRules(), row) == rule


def test_three_degenerate_or_boilerplate_responses_keep_the_set():
    assert _why(GeneratorRules(), _row(GOOD[:4] + [REFUSAL] * 3)) is None
    assert _why(GeneratorRules(), _row(GOOD[:4] + [DISCLAIMER] * 3)) is None


def test_refusals_with_a_helpful_alternative_are_useful_not_boilerplate():
    assert refusal(ALTERNATIVE) == "alternative"
    row = _row(GOOD[:3] + [ALTERNATIVE] * 4)
    assert _why(GeneratorRules(), row) is None
    assert _why(GeneratorRules(), _row(GOOD[:3] + [REFUSAL + " Is there anything else I can help with?"] * 4)) == (
        "degenerate")
    assert GeneratorRules().useful(ALTERNATIVE) and not GeneratorRules().useful(DISCLAIMER)


def test_rules_switch_off_and_thresholds_move():
    assert _why(GeneratorRules(min_responses=None, min_useful=3), _row(GOOD[:6])) is None
    assert _why(GeneratorRules(min_prompt_chars=10), _row(prompt="Plan vegetarian dinners.")) is None
    assert _why(GeneratorRules(max_repetitive=1), _row(GOOD[:6] + [LOOP])) is None
    assert _why(GeneratorRules(max_degenerate=None, min_useful=3), _row(GOOD[:3] + [REFUSAL] * 4)) is None
    long = GOOD[:6] + ["A complete answer: " + " ".join(f"step{i}" for i in range(78))]  # 555 characters
    assert _why(GeneratorRules(max_response_chars=500), _row(long)) == "max_response_chars"
    assert _why(GeneratorRules(max_response_chars=600), _row(long)) is None
    assert _why(GeneratorRules(), _row(long)) is None  # off by default
    with pytest.raises(ValidationError):
        GeneratorRules(min_responses=1)
    with pytest.raises(ValidationError):
        GeneratorRules(lmsys_heldout=False)  # the held-out benchmark is not a setting


@pytest.mark.parametrize("top, reason", [
    (REFUSAL + " Please ask me something else instead of this.", "the top response is a plain refusal"),
    ("Hello there! How can I assist you today? I'm happy to help you.", "the top response is a greeting only"),
    ("Could you please provide more details about what you would like the plan to include?",
     "the top response is a clarification request only"),
    (LOOP, "the top response is repetitive"),
])
def test_policy_top_response_is_an_answer(top: str, reason: str):
    report = FilterReport()
    assert not list(filter_rows([_row([top] + GOOD[1:])], PolicyRules().rules(), report))
    assert report.dropped == {"top_response": 1} and report.examples["top_response"] == f"nectar:0: {reason}"
    assert _why(PolicyRules(), _row([ALTERNATIVE] + GOOD[1:])) is None  # declines, then helps


def test_policy_prompts_short_prompt_exemption_turns_and_duplicates():
    rules = PolicyRules(max_turns=2)
    short_curated = _row(prompt="What causes inflation?", sources=("ultrachat",), index=1)
    short_chat = _row(prompt="What causes inflation?", sources=("anthropic-hh",), index=2)
    rows = [_row(index=0), short_curated, short_chat, _row(index=3, turns=3), _row(index=4),
            _row(index=5, sources=("lmsys-chat-1m",)), _row(GOOD[:6], index=6, prompt=PROMPT + " Quickly.")]
    report = FilterReport()
    kept = list(filter_rows(rows, rules.rules(), report))
    assert [r.index for r in kept] == [0, 1]
    assert report.dropped == {"min_prompt_chars": 1, "max_turns": 1, "duplicate": 1, "lmsys_heldout": 1,
                              "min_responses": 1}
    assert (report.seen, report.kept) == (7, 2)
    assert report.examples["duplicate"] == "nectar:4: duplicate prompt"
    assert "ultrachat" in UPSTREAM_FILTERED and "anthropic-hh" not in UPSTREAM_FILTERED
    assert _why(PolicyRules(short_prompt_sources=()), short_curated) == "min_prompt_chars"


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
    """On the authors' 194 ranked rows every kept set holds the paper's counts, every drop says why, and a set of
    four plain refusals (row 7) goes as degenerate, not as boilerplate."""
    ranked = list(read_nectar(shared_data / "nectar" / "ablation_baseline_no_tiebreak_rankings.jsonl"))
    assert len(ranked) == 194 and all(r.ranked and len(r.responses) == 7 for r in ranked)
    report = FilterReport()
    kept = list(filter_rows(ranked, GeneratorRules().rules(), report))
    assert report.seen == 194 and report.kept == len(kept) == 194 - sum(report.dropped.values())
    assert 0 < len(kept) < 194
    for row in kept:
        kinds = [classify(t) for t in row.responses]
        assert not any(is_repetitive(t) for t in row.responses)
        assert sum(k in DEGENERATE for k in kinds) < 4 and kinds.count(Kind.BOILERPLATE) < 4
    assert report.examples["degenerate"].startswith("nectar:7: 4 degenerate responses")
    sourced = list(read_nectar(shared_data / "nectar" / "ablation_pointwise_pairwise_baseline_data.jsonl"))
    report = FilterReport()
    list(filter_rows(sourced, PolicyRules().rules(), report))
    assert report.dropped["lmsys_heldout"] == 27  # the authors' sample's LMSYS-Chat-1M rows
    # Short prompts from curated sources pass B.2's length rule (and meet the ranks rule: this sample has none).
    short = [r for r in sourced if len(r.prompt) <= 50 and "lmsys-chat-1m" not in r.sources]
    assert {s for r in short for s in r.sources} & set(UPSTREAM_FILTERED)
    assert report.dropped["min_prompt_chars"] == sum(not set(r.sources) & set(UPSTREAM_FILTERED) for r in short)
