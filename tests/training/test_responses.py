"""What a response is, as Appendix B's rules count it (`training.responses`): each kind on hand-written answers and on
real Nectar responses from the authors' rows in `../shared/data/nectar` (rows the CPU learning run never holds out:
the 100-row sample without ranks, and ranked rows its length caps drop)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.data import read_nectar
from training.responses import (
    DEGENERATE,
    Kind,
    classify,
    is_broken,
    is_clarification_only,
    is_greeting_only,
    is_repetitive,
    refusal,
)

SOURCED = "ablation_pointwise_pairwise_baseline_data.jsonl"
RANKED = "ablation_baseline_no_tiebreak_rankings.jsonl"


@pytest.fixture(scope="module")
def sourced(shared_data: Path) -> dict[int, tuple[str, ...]]:
    """Row index -> responses of the authors' 100 rows with sources (upstream order)."""
    return {r.index: r.responses for r in read_nectar(shared_data / "nectar" / SOURCED)}


@pytest.fixture(scope="module")
def ranked(shared_data: Path) -> dict[int, tuple[str, ...]]:
    """Row index -> responses (best first) of the authors' 194 ranked rows."""
    return {r.index: r.responses for r in read_nectar(shared_data / "nectar" / RANKED)}


@pytest.mark.parametrize("text, kind", [
    ("", Kind.BROKEN),
    ("?!?!...!!! ###", Kind.BROKEN),
    ("Caf\ufffd au lait", Kind.BROKEN),
    ("C", Kind.OK),  # a short answer to a multiple-choice prompt is an answer
    ("I'm sorry, but I can't assist with that.", Kind.PLAIN_REFUSAL),
    ("I cannot help with that. It is important to respect the law. If you have any other questions, feel free to "
     "ask!", Kind.PLAIN_REFUSAL),
    ("I'm sorry, but I can't help you pick that lock. If you are locked out of your own home, I would recommend "
     "calling a licensed locksmith or your landlord.", Kind.OK),
    ("Hello! How can I assist you today?", Kind.GREETING_ONLY),
    ("Sure, I can help with that.", Kind.GREETING_ONLY),
    ("Could you please provide more details about what you need?", Kind.CLARIFICATION_ONLY),
    ("I'm sorry, I don't understand what you're asking. Can you please rephrase your question?",
     Kind.CLARIFICATION_ONLY),
    ("As an AI language model, I don't have personal opinions. I'm here to help with any other questions.",
     Kind.BOILERPLATE),
    ("As an AI, I don't have personal opinions. However, I can tell you that most economists see inflation as "
     "caused by demand outpacing supply.", Kind.OK),
    ("Inflation is caused by demand growing faster than supply, by rising costs, or by expanding money supply.",
     Kind.OK),
])
def test_each_kind(text: str, kind: Kind):
    assert classify(text) is kind


def test_a_refusal_with_a_helpful_alternative_is_neither_degenerate_nor_boilerplate():
    text = ("I'm sorry, but as an AI I can't browse the internet. However, you can find cold-weather moisturisers "
            "by searching for creams labelled for winter use.")
    assert refusal(text) == "alternative" and classify(text) not in DEGENERATE | {Kind.BOILERPLATE}
    assert refusal("I'm sorry, but I can't browse the internet. Is there anything else I can help with?") == "plain"
    assert refusal("Inflation is caused by demand.") is None


def test_thresholds_move():
    assert not is_broken("[-1, 0, -19]") and is_broken("[-1, 0, -19]", min_alnum_share=0.6)
    long_question = "Could you tell me more about your project? " * 12
    assert not is_clarification_only(long_question) and is_clarification_only(long_question, max_chars=1000)
    assert is_repetitive("the same words again " * 20) and not is_repetitive("the same words again " * 20, 0.01)
    assert not is_repetitive("short short short short")  # under 30 words: not judged


def test_real_refusals(sourced, ranked):
    assert classify(sourced[76][0]) is Kind.PLAIN_REFUSAL  # "Sorry, but I can't assist with that."
    assert classify(sourced[85][3]) is Kind.PLAIN_REFUSAL  # declines, then offers help "with a different topic"
    # Declines, then points to what helps instead: useful.
    assert refusal(sourced[57][0]) == "alternative"  # can't give links; "some popular ... moisturizers include"
    assert refusal(sourced[66][1]) == "alternative"  # won't say; refers to a mental health professional
    assert refusal(sourced[28][6]) == "alternative"  # can't access papers; "I can guide you on how to cite"
    assert refusal(ranked[1][0]) == "alternative"  # won't help with the lock; "I would recommend ... a locksmith"
    assert [classify(t) for t in ranked[7]].count(Kind.PLAIN_REFUSAL) == 4


def test_real_greetings_clarifications_and_boilerplate(sourced, ranked):
    assert classify(sourced[89][0]) is Kind.GREETING_ONLY  # "That's great! How can I assist you with your robots?"
    assert classify(sourced[70][2]) is Kind.GREETING_ONLY  # "You are welcome!"
    assert classify(sourced[83][5]) is Kind.CLARIFICATION_ONLY  # "I'm not sure what you mean ... provide more context"
    assert classify(sourced[15][6]) is Kind.CLARIFICATION_ONLY  # the preface was not given: please share it
    assert classify(ranked[1][2]) is Kind.CLARIFICATION_ONLY  # "Could you elaborate on what kind of house ...?"
    assert classify(sourced[77][0]) is Kind.BOILERPLATE  # "As an artificial intelligence, I don't have feelings ..."
    assert classify(sourced[48][0]) is Kind.OK  # the same disclaimer, then "However, I can tell you that ..."


def test_real_broken_short_and_repetitive_answers(sourced, ranked):
    assert classify(sourced[4][2]) is Kind.BROKEN  # an empty answer
    assert all(classify(t) is Kind.OK for t in sourced[78])  # "C", "B. It's good.": short, not broken
    assert all(classify(t) is Kind.OK for t in sourced[90] if t.strip())  # "Yes"
    assert [is_repetitive(t) for t in ranked[54]].count(True) == 2  # two raps that loop one verse
    assert not any(is_repetitive(t) for t in sourced[40])  # short factual answers that share words
