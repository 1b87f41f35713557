"""The DR-Verifier's three modes, its strict parsers, the logprob arithmetic and the prompt templates."""

from __future__ import annotations

import asyncio
import math

import pytest
from judge_fakes import FakeJudge, tokenise

from harness.backends.base import Completion, TokenLogprob
from harness.errors import Failure, FailureCategory
from judges.rubric import Rubric, RubricItem
from judges.templates import load_template, render, render_template, response_label
from judges.verify import (
    VerdictParseError,
    p_yes,
    parse_answer_sheet,
    parse_yes_no,
    soft_verdicts,
    verify,
)

RUBRIC = Rubric((RubricItem("States 4", 3), RubricItem("Shows the working", 1)))
RESPONSES = ["The answer is 4 because 2+2=4.", "It is 5."]
TRUTH = {(RESPONSES[0], "States 4"): True, (RESPONSES[0], "Shows the working"): True}
EXPECTED = [[1.0, 0.0], [1.0, 0.0]]  # items x responses


def run(backend, mode, responses=RESPONSES, rubric=RUBRIC):
    return asyncio.run(verify(backend, "What is 2+2?", responses, rubric, mode=mode, max_tokens=8))


# --- parsers ---


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Yes", True),
        ("no", False),
        ("**No**.", False),
        ("Yes, because it says 4.", True),
        ("<think>no?</think>\nYES", True),
    ],
)
def test_parse_yes_no_accepts_a_leading_verdict(text, verdict):
    assert parse_yes_no(text) is verdict


@pytest.mark.parametrize("text", ["", "Maybe", "The answer is yes", "Yesterday", "<think>still thinking, yes"])
def test_parse_yes_no_rejects_everything_else(text):
    with pytest.raises(VerdictParseError):
        parse_yes_no(text)


def test_parse_answer_sheet_reads_one_line_per_item_and_ignores_prose():
    text = "Here are my answers:\n1: Yes\n**2.** no - it lacks steps\nCriterion 3) YES\nDone."
    assert parse_answer_sheet(text, 3) == [True, False, True]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("1: yes\n3: no", "no answer for item(s) 2"),
        ("1: yes\n1: no\n2: no", "item 1 is answered more than once"),
        ("1: yes\n2: no\n3: yes", "item 3 does not exist (there are 2)"),
        ("Both look fine.", "found no lines"),
        ("<think>1: yes\n2: no</think>", "found no lines"),
    ],
)
def test_parse_answer_sheet_rejects_a_sheet_without_exactly_one_verdict_per_item(text, complaint):
    with pytest.raises(VerdictParseError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
        parse_answer_sheet(text, 2)


def test_p_yes_matches_a_hand_computed_value():
    top = {" yes": math.log(0.6), "Yes": math.log(0.1), " no": math.log(0.2), " maybe": math.log(0.1)}
    assert p_yes(top) == pytest.approx(0.7 / 0.9)
    assert p_yes({" maybe": -0.1, "\n": -3.0}) is None
    assert p_yes({" yes": -math.inf, " no": -0.5}) == 0.0


def test_soft_verdicts_read_the_position_where_each_answer_was_written():
    top2 = {" no": math.log(0.5), " yes": math.log(0.3), " NO": math.log(0.1), "\n": math.log(0.1)}
    tokens = [
        TokenLogprob(t, 0.0, {t: 0.0})
        for t in tokenise("1: yes\n2:")
    ] + [TokenLogprob(" no", math.log(0.5), top2), TokenLogprob("\n3", 0.0, {"\n3": 0.0})]
    tokens += [TokenLogprob(t, 0.0, {t: 0.0}) for t in tokenise(": maybe")]
    # item 1: top holds only " yes" itself -> 1.0; item 2: 0.3 / (0.5 + 0.3 + 0.1); item 3: no yes/no written
    assert soft_verdicts(tokens, 3) == pytest.approx([1.0, 0.3 / 0.9, None])  # type: ignore[arg-type]


# --- the three modes on a known fake ---


@pytest.mark.parametrize("mode", ["per_item", "batched"])
def test_hard_modes_return_the_fakes_verdicts(mode):
    judge = FakeJudge(truth=TRUTH)
    found = run(judge, mode)
    assert found.verdicts == EXPECTED
    assert found.failures == ()
    assert len(judge.batches) == 1  # every request of the round in one generate call
    expected_requests = len(RUBRIC) * len(RESPONSES) if mode == "per_item" else len(RESPONSES)
    assert found.requests == found.calls == len(judge.requests) == expected_requests
    assert all(r.params.greedy and r.params.logprobs == 0 for r in judge.requests)


def test_logprob_mode_gives_soft_verdicts_from_one_request_per_response():
    judge = FakeJudge(truth=TRUTH)
    found = run(judge, "logprob")
    p_yes_no = 0.2 / 0.9  # NO_TOP in the fake
    assert found.verdicts == [[pytest.approx(0.9), pytest.approx(p_yes_no)]] * 2
    assert found.failures == () and found.raw["notes"] == []
    assert found.requests == len(RESPONSES) and len(judge.batches) == 1
    assert all(r.params.logprobs == 5 and r.params.greedy for r in judge.requests)
    assert all(r.params.max_tokens == 8 * len(RUBRIC) for r in judge.requests)


def test_logprob_mode_falls_back_to_the_written_verdict_with_a_note():
    judge = FakeJudge(truth=TRUTH)
    judge.answer_top["no"] = {" no": 0.0, "\n": -2.0}  # greedy "no" but no "yes" alternative: still a slot, P = 0
    judge.answer_top["yes"] = {" sure": -0.1, " ok": -2.0}  # neither word among the alternatives
    found = run(judge, "logprob")
    assert found.verdicts == EXPECTED
    assert found.failures == ()
    assert len(found.raw["notes"]) == 2 and "response 0 item 0" in found.raw["notes"][0]


def test_logprob_mode_without_logprobs_from_the_backend_uses_the_written_sheet():
    judge = FakeJudge(hook=lambda r: Completion(("1: yes\n2: no",)))
    found = run(judge, "logprob")
    assert found.verdicts == [[1.0, 1.0], [0.0, 0.0]]
    assert found.failures == ()


# --- re-asks and failures ---


def test_per_item_reasks_an_unreadable_answer_with_the_complaint():
    def hook(request):
        if "It is 5." in request.messages[0].content and len(request.messages) == 1:
            return "I think it partly does."
        return None

    judge = FakeJudge(truth=TRUTH, hook=hook)
    found = run(judge, "per_item")
    assert found.verdicts == EXPECTED and found.failures == ()
    assert [len(b) for b in judge.batches] == [4, 2]  # the two re-asks go out together
    retry = judge.batches[1][0].messages
    assert [m.role for m in retry] == ["user", "assistant", "user"]
    assert retry[1].content == "I think it partly does."
    assert "expected the answer to start with Yes or No" in retry[2].content
    assert found.requests == 6 and len(found.raw["retries"]) == 2


def test_per_item_records_a_parse_failure_after_the_reask():
    def hook(request):
        return "Perhaps." if "Shows the working" in request.messages[0].content else None

    judge = FakeJudge(truth=TRUTH, hook=hook)
    found = run(judge, "per_item")
    assert found.verdicts == [[1.0, 0.0], [None, None]]
    assert [(f.stage, f.item, f.response, f.failure.category) for f in found.failures] == [
        ("verify", 1, 0, FailureCategory.PARSE),
        ("verify", 1, 1, FailureCategory.PARSE),
    ]
    assert found.failures[0].failure.attempts == 2


def test_batched_sheet_with_a_missing_item_is_reasked_then_recorded():
    def hook(request):
        return "1: yes" if "It is 5." in request.messages[0].content else None

    judge = FakeJudge(truth=TRUTH, hook=hook)
    found = run(judge, "batched")
    assert found.verdicts == [[1.0, None], [1.0, None]]  # the whole response's column
    assert [len(b) for b in judge.batches] == [2, 1]
    assert "no answer for item(s) 2" in judge.batches[1][0].messages[-1].content
    assert "exactly 2 lines" in judge.batches[1][0].messages[-1].content
    (failure,) = found.failures
    assert (failure.stage, failure.response, failure.item) == ("verify", 1, None)
    assert failure.failure.category is FailureCategory.PARSE and "no answer for item(s) 2" in failure.failure.message


def test_a_backend_failure_is_recorded_with_its_category_and_not_reasked():
    down = Failure(FailureCategory.RATE_LIMIT, "429 after 6 attempts", 6)
    judge = FakeJudge(truth=TRUTH, hook=lambda r: down if "It is 5." in r.messages[0].content else None)
    found = run(judge, "batched")
    assert found.verdicts == [[1.0, None], [1.0, None]]
    assert len(judge.batches) == 1
    (failure,) = found.failures
    assert failure.failure == down and failure.response == 1


def test_cached_completions_are_not_counted_as_calls():
    judge = FakeJudge(hook=lambda r: Completion(("1: no\n2: no",), cached=True))
    found = run(judge, "batched")
    assert (found.requests, found.calls) == (2, 0)


def test_k_equals_one():
    found = run(FakeJudge(truth=TRUTH), "per_item", responses=RESPONSES[:1])
    assert found.verdicts == [[1.0], [1.0]]


# --- prompts ---


def test_verifier_prompts_put_the_response_before_the_items():
    judge = FakeJudge(truth=TRUTH)
    run(judge, "per_item")
    a, b = (r.messages[0].content for r in judge.requests[:2])  # same response, two items
    prefix = 0
    while a[prefix] == b[prefix]:
        prefix += 1
    assert RESPONSES[0] in a[:prefix] and "Criterion: " in a[:prefix]  # only the criterion differs
    sheet = render_template("verify_sheet", prompt="p", response="r", criteria="1. c", count=1)
    assert sheet.index("[Response]") < sheet.index("Criteria:")


def test_templates_insert_text_with_braces_verbatim():
    tricky = 'def f(): return {"a": {{prompt}}} % {0}'
    judge = FakeJudge(truth={(tricky, "States 4"): True})
    found = run(judge, "batched", responses=[tricky])
    assert tricky in judge.requests[0].messages[0].content and found.verdicts == [[1.0], [0.0]]
    assert render("a {{x}} {b} {{y}}", x="{{y}}", y="}") == "a {{y}} {b} }"


def test_render_rejects_missing_and_unused_values():
    with pytest.raises(ValueError, match="missing values: \\['y'\\]"):
        render("{{x}} {{y}}", x=1)
    with pytest.raises(ValueError, match="without a slot: \\['z'\\]"):
        render("{{x}}", x=1, z=2)
    with pytest.raises(FileNotFoundError, match="verify_item"):
        load_template("no_such_template")


def test_response_labels():
    assert [response_label(i) for i in (0, 1, 25, 26, 27, 701, 702)] == ["A", "B", "Z", "AA", "AB", "ZZ", "AAA"]


def test_a_backend_that_loses_results_is_an_error_not_a_guess():
    judge = FakeJudge(truth=TRUTH)
    real = judge.generate

    async def short(requests):
        return (await real(requests))[:-1]

    judge.generate = short
    with pytest.raises(RuntimeError, match="returned 1 results for 2"):
        run(judge, "batched")
