"""The DR-Verifier's three modes, its strict parsers, the logprob arithmetic and the prompt templates."""

from __future__ import annotations

import asyncio
import math

import pytest
from judge_fakes import FakeJudge

from harness.backends.base import Completion, LogprobResult, assistant_text
from harness.errors import Failure, FailureCategory
from judges.rubric import Rubric, RubricItem
from judges.templates import load_template, render, render_template, response_label
from judges.verify import (
    SHEET_PREFILL,
    YES_NO,
    VerdictParseError,
    item_question_parts,
    p_yes,
    parse_answer_sheet,
    parse_yes_no,
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


def test_the_prefill_is_joined_only_onto_a_continuation():
    continued = Completion((" yes\n2: no",))
    assert assistant_text("1:", continued) == "1: yes\n2: no"
    whole = Completion(("2: no",), continues_prefix=False)  # asked without the prefill: read as written
    assert assistant_text("1:", whole) == "2: no"
    assert assistant_text("", Completion(("anything",))) == "anything"

def test_item_question_parts_rebuild_the_per_item_question():
    head, tail = item_question_parts("What is 2+2?", RESPONSES[0])
    expected = render_template("verify_item", prompt="What is 2+2?", response=RESPONSES[0], criterion="States 4")
    assert head + "States 4" + tail == expected
    assert RESPONSES[0] in head and "Criterion" not in tail


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


def test_batched_prefills_the_sheet_and_holds_back_its_end():
    judge = FakeJudge(truth=TRUTH)
    found = run(judge, "batched")
    for request in judge.requests:
        assert request.assistant_prefix == SHEET_PREFILL == "1:"
        assert request.params.min_tokens == 4 * len(RUBRIC) - 3  # room for every `N: yes` line
        assert request.params.max_tokens == 8 * len(RUBRIC)
        assert request.params.stop == ("\n\n", "\n3:")  # a blank line, or a line past the last item
    assert found.raw["answers"] == ["1: yes\n2: yes", "1: no\n2: no"]  # the prefill joined on


def test_batched_reads_a_whole_sheet_from_a_backend_that_could_not_prefill():
    # Asked without the prefill, the model wrote the sheet in full: read as written, `1:` not glued on.
    judge = FakeJudge(hook=lambda r: Completion(("1: no\n2: yes",), continues_prefix=False))
    found = run(judge, "batched")
    assert found.verdicts == [[0.0, 0.0], [1.0, 1.0]] and found.failures == ()
    assert found.raw["answers"] == ["1: no\n2: yes"] * 2


def test_logprob_mode_gives_soft_verdicts_from_one_request_per_response():
    judge = FakeJudge(truth=TRUTH)
    found = run(judge, "logprob")
    assert found.verdicts == [[pytest.approx(0.9), pytest.approx(0.2)]] * 2  # P(yes) of the fake's tables
    assert found.raw["yes_no_mass"] == [[pytest.approx(1.0), pytest.approx(0.75)]] * 2
    assert found.failures == () and found.requests == found.calls == len(RESPONSES)
    assert judge.batches == [] and len(judge.logprob_batches) == 1  # no generation; one batch
    for request, response in zip(judge.logprob_batches[0], RESPONSES):
        # The per_item question, one branch per criterion after a shared prompt + response.
        head, tail = item_question_parts("What is 2+2?", response)
        assert request.messages[-1].content == head
        assert request.branches == tuple(c + tail for c in RUBRIC.criteria)


def test_logprob_mode_agrees_with_per_item_on_the_same_questions():
    judge = FakeJudge(truth=TRUTH)
    hard = run(judge, "per_item").verdicts
    soft = run(judge, "logprob").verdicts
    assert [[v >= 0.5 for v in row] for row in soft] == [[v == 1.0 for v in row] for row in hard]


def test_logprob_cell_without_yes_or_no_is_a_failure_of_that_cell():
    def hook(context: str):
        return {"Maybe": -0.1} if "It is 5." in context and "Shows the working" in context else None

    found = run(FakeJudge(truth=TRUTH, logprob_hook=hook), "logprob")
    assert found.verdicts == [[pytest.approx(0.9), pytest.approx(0.2)], [pytest.approx(0.9), None]]
    (failure,) = found.failures
    assert (failure.stage, failure.item, failure.response) == ("verify", 1, 1)
    assert failure.failure.category is FailureCategory.PARSE and "neither Yes nor No" in failure.failure.message
    assert found.raw["yes_no_mass"][1][1] == 0.0


def test_logprob_backend_failure_and_a_short_answer_fail_the_response():
    down = Failure(FailureCategory.TIMEOUT, "no answer in 120 s", 6)
    judge = FakeJudge(truth=TRUTH, logprob_hook=lambda c: down if "It is 5." in c else None)
    found = run(judge, "logprob")
    assert found.verdicts == [[pytest.approx(0.9), None], [pytest.approx(0.9), None]]
    assert [(f.response, f.item, f.failure) for f in found.failures] == [(1, None, down)]

    async def short(requests, candidates):
        return [LogprobResult({}, branches=({c: -1.0 for c in candidates},)) for _ in requests]

    judge.next_token_logprobs = short
    found = run(judge, "logprob")
    assert all(v is None for row in found.verdicts for v in row)
    assert [f.failure.category for f in found.failures] == [FailureCategory.MALFORMED_RESPONSE] * 2
    assert "1 branch results for 2 items" in found.failures[0].failure.message


def test_logprob_candidates_are_both_cases_of_both_words():
    assert set(YES_NO) == {"Yes", "No", "yes", "no"}
    judge = FakeJudge(truth=TRUTH)
    judge.answer_logprobs["yes"] = {"yes": math.log(0.3), "Yes": math.log(0.3), "no": math.log(0.2)}
    found = run(judge, "logprob")
    assert found.verdicts[0][0] == pytest.approx(0.6 / 0.8)


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
        return " yes" if "It is 5." in request.messages[0].content else None  # continues `1:`: item 2 missing

    judge = FakeJudge(truth=TRUTH, hook=hook)
    found = run(judge, "batched")
    assert found.verdicts == [[1.0, None], [1.0, None]]  # the whole response's column
    assert [len(b) for b in judge.batches] == [2, 1]
    assert "no answer for item(s) 2" in judge.batches[1][0].messages[-1].content
    assert "exactly 2 lines" in judge.batches[1][0].messages[-1].content
    assert judge.batches[1][0].assistant_prefix == "1:"  # the re-ask is prefilled too
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
    judge = FakeJudge(hook=lambda r: Completion((" no\n2: no",), cached=True))
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
