"""The `dynamic-rubric` and `static-rubric` evaluators on a scripted judge, plus one end-to-end run on SmolLM2."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from judge_fakes import FakeJudge, FakePool

from harness.errors import ConfigError, Failure, FailureCategory
from harness.registry import lookup
from harness.seeds import derive_seed
from judges.base import Evaluator, SetScores, parse_evaluator_spec
from judges.dynamic import dynamic_generator_prompt, presentation_order, static_generator_prompt
from judges.rubric import aggregate

PROMPT = "What is 2+2? Explain."
RESPONSES = ["2+2=4, since two pairs make four.", "It is 5.", "The sum is four."]
RUBRIC = [
    {"criterion": "States that the answer is 4", "weight": 5},
    {"criterion": "Explains the reasoning", "weight": 2},
    {"criterion": "Is written in English", "weight": 1},
]
GOOD = json.dumps(RUBRIC)
TRUTH = {
    (RESPONSES[0], "States that the answer is 4"): True,
    (RESPONSES[0], "Explains the reasoning"): True,
    (RESPONSES[2], "States that the answer is 4"): True,
    **{(r, "Is written in English"): True for r in RESPONSES},
}
EXPECTED_VERDICTS = [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def build(spec: str, judge: FakeJudge) -> Evaluator:
    kind, settings = parse_evaluator_spec(spec)
    return lookup("evaluator", kind)(settings, FakePool(judge))


def score(spec: str, judge: FakeJudge, responses=RESPONSES, seed: int = 7) -> SetScores:
    return asyncio.run(build(spec, judge).score_set(PROMPT, responses, seed=seed))


# --- prompts and order ---


def test_presentation_order_is_seeded():
    assert presentation_order(7, 1) == presentation_order(7, 1)
    assert sorted(presentation_order(7, 1)) == list(range(7))
    assert len({tuple(presentation_order(7, s)) for s in range(5)}) > 1
    assert presentation_order(1, 3) == [0]


def test_dynamic_prompt_shows_every_response_in_order_and_static_none():
    order = [2, 0, 1]
    text = dynamic_generator_prompt(PROMPT, RESPONSES, order)
    positions = [text.index(f"[Response {label}]\n{RESPONSES[i]}\n") for label, i in zip("ABC", order)]
    assert positions == sorted(positions) and PROMPT in text
    static = static_generator_prompt(PROMPT)
    assert PROMPT in static and not any(r in static for r in RESPONSES) and "[Response" not in static


def test_generator_request_uses_the_order_and_derived_seed():
    judge = FakeJudge(rubrics=[GOOD], truth=TRUTH)
    result = score("dynamic-rubric:generator=fake", judge, seed=11)
    gen = judge.batches[0][0]
    assert result.trace.order == presentation_order(3, 11)
    assert gen.messages[0].content == dynamic_generator_prompt(PROMPT, RESPONSES, result.trace.order)
    assert gen.params.seed == derive_seed(11, "rubric") and gen.params.temperature == 0.7
    assert gen.params.max_tokens == 1024


# --- scoring ---


@pytest.mark.parametrize(("mode", "verify_requests"), [("per_item", 9), ("batched", 3), ("logprob", 3)])
def test_scores_are_the_aggregate_of_the_verdicts(mode, verify_requests):
    judge = FakeJudge(rubrics=[GOOD], truth=TRUTH)
    result = score(f"dynamic-rubric:generator=fake,mode={mode}", judge)
    trace = result.trace
    weights = [item["weight"] for item in RUBRIC]
    assert trace.rubric == RUBRIC
    if mode != "logprob":
        assert trace.verdicts == EXPECTED_VERDICTS
    assert list(result.scores) == pytest.approx(list(aggregate(weights, trace.verdicts)))
    # The rubric, then one verification batch (generated, or scored for logprob).
    assert trace.calls == 1 + verify_requests and len(judge.batches) + len(judge.logprob_batches) == 2
    p = np.mean(trace.verdicts, axis=1)
    assert trace.pass_rates == pytest.approx(list(p))
    assert trace.discriminability == pytest.approx(list(p * (1 - p)))
    assert trace.failures == () and result.n_unscored == 0
    assert trace.raw["generator"] == GOOD and "verifier" in trace.raw
    json.dumps(result.to_json())  # the whole record is serialisable


def test_hard_scores_and_saturation_by_hand():
    result = score("dynamic-rubric:generator=fake,mode=batched", FakeJudge(rubrics=[GOOD], truth=TRUTH))
    assert result.scores == pytest.approx((8 / 8, 1 / 8, 6 / 8))
    assert result.trace.saturated_share == pytest.approx(1 / 3)  # "Is written in English" passes everywhere


def test_a_response_with_an_unanswered_item_is_unscored_and_left_out_of_the_rates():
    down = Failure(FailureCategory.TIMEOUT, "no answer in 120 s", 6)
    judge = FakeJudge(
        rubrics=[GOOD], truth=TRUTH, hook=lambda r: down if "[Response]\nIt is 5." in r.messages[0].content else None
    )
    result = score("dynamic-rubric:generator=fake,mode=batched", judge)
    assert result.scores == pytest.approx((1.0, None, 0.75))
    assert result.n_unscored == 1
    assert result.trace.pass_rates == [1.0, 0.5, 1.0]  # over responses 0 and 2 only
    (failure,) = result.trace.failures
    assert (failure.stage, failure.response, failure.failure.category) == ("verify", 1, FailureCategory.TIMEOUT)


def test_k_equals_one():
    result = score("dynamic-rubric:generator=fake", FakeJudge(rubrics=[GOOD], truth=TRUTH), responses=RESPONSES[:1])
    assert result.scores == (1.0,) and result.trace.order == [0]
    assert result.trace.discriminability == [0.0, 0.0, 0.0] and result.trace.saturated_share == 1.0


def test_no_responses_is_an_error():
    with pytest.raises(ValueError, match="at least one response"):
        score("dynamic-rubric:generator=fake", FakeJudge(rubrics=[GOOD]), responses=[])


def test_static_rubric_never_shows_the_responses_to_the_generator():
    judge = FakeJudge(rubrics=[GOOD], truth=TRUTH)
    result = score("static-rubric:generator=fake,mode=batched", judge)
    gen = judge.batches[0][0].messages[0].content
    assert gen == static_generator_prompt(PROMPT) and not any(r in gen for r in RESPONSES)
    assert result.trace.order is None and result.scores == pytest.approx((1.0, 1 / 8, 6 / 8))


# --- rubric re-ask and failures ---


def test_unparsable_rubric_is_reasked_with_the_complaint():
    judge = FakeJudge(rubrics=['[{"criterion": "Correct", "weight": 9}]', GOOD], truth=TRUTH)
    result = score("dynamic-rubric:generator=fake,mode=batched", judge)
    retry = judge.batches[1][0]
    assert [m.role for m in retry.messages] == ["user", "assistant", "user"]
    assert "weight 9 is outside 1..5" in retry.messages[2].content
    assert result.trace.rubric == RUBRIC and result.n_unscored == 0 and result.trace.failures == ()
    assert result.trace.raw["generator_retry"] == GOOD and "outside" in result.trace.raw["generator_problem"]
    assert result.trace.calls == 2 + 3


def test_unparsable_rubric_twice_is_recorded_and_nothing_is_scored():
    judge = FakeJudge(rubrics=["I would grade on accuracy.", "Accuracy matters most."])
    result = score("dynamic-rubric:generator=fake", judge)
    assert result.scores == (None, None, None) and result.n_unscored == 3
    (failure,) = result.trace.failures
    assert failure.stage == "generate_rubric" and failure.failure.category is FailureCategory.PARSE
    assert len(judge.batches) == 2  # no verification without a rubric
    assert result.trace.rubric is None and result.trace.raw["generator"] == "I would grade on accuracy."
    assert result.trace.calls == 2


def test_generator_backend_failure_is_recorded_with_its_category():
    judge = FakeJudge(rubrics=[Failure(FailureCategory.AUTH, "401: key refused")])
    result = score("dynamic-rubric:generator=fake", judge)
    assert result.scores == (None, None, None)
    (failure,) = result.trace.failures
    assert (failure.stage, failure.failure.category) == ("generate_rubric", FailureCategory.AUTH)
    assert len(judge.batches) == 1


# --- settings and spec ---


def test_spec_is_canonical_and_the_verifier_defaults_to_the_generator():
    pool = FakePool(FakeJudge())
    a = lookup("evaluator", "dynamic-rubric")({"mode": "batched", "generator": "fake:g"}, pool)
    b = lookup("evaluator", "dynamic-rubric")(
        {"generator": "fake:g", "verifier": "fake:g", "mode": "batched", "gen_temperature": "0.70"}, pool
    )
    assert a.spec == b.spec == "dynamic-rubric:generator=fake:g,mode=batched"  # defaults stay out of the name
    assert pool.specs == ["fake:g"] * 4
    assert isinstance(a, Evaluator)


def test_separate_verifier_model_gets_the_verification_requests():
    gen, ver = FakeJudge(rubrics=[GOOD]), FakeJudge(truth=TRUTH)
    pool = FakePool(gen, {"fake:v": ver})
    judge = lookup("evaluator", "dynamic-rubric")({"generator": "fake:g", "verifier": "fake:v"}, pool)
    result = asyncio.run(judge.score_set(PROMPT, RESPONSES, seed=0))
    assert len(gen.requests) == 1 and len(ver.requests) == 9 and result.n_unscored == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"generator": "g", "temprature": "0.5"}, "unknown setting"),
        ({"mode": "batched"}, "missing required"),
        ({"generator": "g", "mode": "pairwise"}, "mode='pairwise'"),
        ({"generator": "g", "gen_temperature": "-1"}, "gen_temperature"),
        ({"generator": "g", "verify_max_tokens": "0"}, "verify_max_tokens"),
        ({"generator": "g", "gen_max_tokens": "many"}, "not a valid int"),
    ],
)
def test_bad_settings_are_config_errors(settings, message):
    with pytest.raises(ConfigError, match=message):
        lookup("evaluator", "static-rubric")(settings, FakePool(FakeJudge()))


# --- the real embedded model ---


def _check_trace(result: SetScores, k: int) -> None:
    """Whatever the tiny model wrote, the result is scores or recorded failures, and the trace adds up."""
    trace = result.trace
    assert len(result.scores) == k and trace.calls >= 1 and trace.raw["generator"]
    if trace.rubric is None:  # the model missed the JSON format twice: recorded, not raised
        assert trace.failures[0].stage == "generate_rubric" and result.n_unscored == k
        return
    assert len(trace.verdicts) == len(trace.rubric) and all(len(row) == k for row in trace.verdicts)
    assert {j for j, s in enumerate(result.scores) if s is None} == {f.response for f in trace.failures}
    assert all(s is None or 0.0 <= s <= 1.0 for s in result.scores)


@pytest.mark.slow
def test_smollm2_scores_a_set_end_to_end_or_records_why_not():
    from harness.pool import BackendPool
    from judges.rubric import Rubric, RubricItem
    from judges.verify import verify

    pool = BackendPool(cache=None)
    spec = "dynamic-rubric:generator=smollm2-135m,mode=batched,gen_max_tokens=96,verify_max_tokens=4"
    kind, settings = parse_evaluator_spec(spec)
    judge = lookup("evaluator", kind)(settings, pool)
    prompt, responses = "Name the capital of France.", ["Paris.", "Lyon.", "It is Paris, France."]
    rubric = Rubric((RubricItem("Names Paris as the capital", 5), RubricItem("Is one short sentence", 1)))

    async def go():
        try:
            scored = await judge.score_set(prompt, responses, seed=1)
            # The generator may never produce a rubric; verification on a fixed one runs the verifier for real.
            checked = await verify(judge.verifier, prompt, responses, rubric, mode="batched", max_tokens=4)
            return scored, checked
        finally:
            await pool.close()

    start = time.perf_counter()
    result, checked = asyncio.run(go())
    elapsed = time.perf_counter() - start
    _check_trace(result, 3)
    assert sorted(result.trace.order) == [0, 1, 2]
    json.dumps(result.to_json())
    assert 3 <= checked.requests <= 6 and len(checked.verdicts) == 2
    for k in range(3):  # a response's column is all verdicts or all None with a recorded failure
        column = [row[k] for row in checked.verdicts]
        failed = any(f.response == k for f in checked.failures)
        assert (None in column) == failed and all(v in (0.0, 1.0, None) for v in column)
    print(
        f"smollm2 end to end: {elapsed:.1f} s; rubric={result.trace.rubric}; scores={result.scores}; "
        f"failures={[f.failure.message for f in result.trace.failures]}; fixed-rubric verdicts={checked.verdicts}"
    )


# --- structured output ---


@pytest.mark.parametrize("mode", ["per_item", "batched"])
def test_structured_requests_carry_the_shape_of_each_answer(mode):
    import re

    from judges.dynamic import rubric_constraint
    from judges.verify import VERDICT_CHOICE, sheet_constraint

    judge = FakeJudge(rubrics=[GOOD], truth=TRUTH)
    result = score(f"dynamic-rubric:generator=fake-judge:m,mode={mode},gen_max_tokens=500", judge)
    assert list(result.scores) == pytest.approx(list(aggregate([i["weight"] for i in RUBRIC], EXPECTED_VERDICTS)))
    generator, *verifier = judge.requests
    schema = generator.params.constraint.schema
    assert generator.params.constraint == rubric_constraint(500) and not generator.params.constraint.think
    assert schema["maxItems"] == 500 // 64 and schema["items"]["properties"]["weight"] == {
        "type": "integer", "minimum": 1, "maximum": 5}
    if mode == "per_item":
        assert {r.params.constraint for r in verifier} == {VERDICT_CHOICE}
    else:
        assert {r.params.constraint for r in verifier} == {sheet_constraint(3)}
        assert all(r.params.min_tokens == 0 for r in verifier)  # the grammar, not min_tokens, holds back the end
        assert re.fullmatch(sheet_constraint(3).spec, " yes\n2: no\n3: yes")
        assert not re.fullmatch(sheet_constraint(3).spec, " yes\n2: no")


def test_structured_false_sends_free_text_and_is_named_in_the_spec():
    judge = FakeJudge(rubrics=[GOOD], truth=TRUTH)
    evaluator = build("dynamic-rubric:generator=fake-judge:m,structured=false", judge)
    asyncio.run(evaluator.score_set(PROMPT, RESPONSES, seed=7))
    assert all(r.params.constraint is None for r in judge.requests)
    assert "structured=false" in evaluator.spec and evaluator.settings["structured"] is False
    default = build("dynamic-rubric:generator=fake-judge:m", FakeJudge())
    assert "structured" not in default.spec  # the default stays out of the name, and is in the settings
    assert default.settings == {"generator": "fake-judge:m", "verifier": "fake-judge:m", "mode": "per_item",
                                "gen_temperature": 0.7, "gen_max_tokens": 1024, "verify_max_tokens": 16,
                                "structured": True}


def test_the_rubric_bounds_follow_the_generation_budget():
    from judges.dynamic import ITEM_JSON_TOKENS, rubric_budget, rubric_constraint

    assert [rubric_budget(t) for t in (43, 64, 96, 160, 1024, 4096)] == [
        (1, 8), (1, 29), (1, 36), (2, 36), (16, 30), (20, 36)]
    for t in range(43, 2000):  # the grammar's worst case fits the budget
        items, criterion = rubric_budget(t)
        assert 2 + items * (ITEM_JSON_TOKENS + criterion) <= t and criterion >= 8
    constraint = rubric_constraint(160)
    assert constraint.schema["maxItems"] == 2 and constraint.schema["items"]["properties"]["criterion"]["maxLength"] == 160
    assert "criterion[max_tokens=36]" in constraint.lark and '(", " item){0,1}' in constraint.lark
    assert '", " item' not in rubric_constraint(96).lark  # one item: no repetition (llguidance refuses {0,0})


def test_a_budget_too_small_for_one_item_is_refused_before_any_call():
    from judges.dynamic import rubric_constraint

    with pytest.raises(ConfigError, match="at least 43 tokens.*max_tokens=42"):
        rubric_constraint(42)
    with pytest.raises(ConfigError, match="'dynamic-rubric'.*at least 43 tokens.*structured=false"):
        build("dynamic-rubric:generator=fake-judge:m,gen_max_tokens=42", FakeJudge())
    assert build("dynamic-rubric:generator=fake-judge:m,gen_max_tokens=42,structured=false", FakeJudge())


def test_a_rubric_with_repeated_criteria_is_scored_once_per_criterion_and_says_so():
    repeated = json.dumps(RUBRIC + [{"criterion": "states that the answer is 4.", "weight": 1}])
    result = score("dynamic-rubric:generator=fake-judge:m", FakeJudge(rubrics=[repeated], truth=TRUTH))
    assert result.trace.rubric == RUBRIC and result.trace.raw["rubric_merged"] == 1
    assert list(result.scores) == pytest.approx(list(aggregate([i["weight"] for i in RUBRIC], EXPECTED_VERDICTS)))


def test_the_rubric_schema_admits_no_criterion_the_parser_calls_empty():
    import re

    from harness.backends.base import Constraint
    from judges.rubric import RubricParseError, parse_rubric, rubric_schema

    pattern = rubric_schema()["items"]["properties"]["criterion"]["pattern"]
    for blank in (" ", "  .", "!?", "\t,"):
        assert not re.search(pattern, blank)
        with pytest.raises(RubricParseError, match="criterion is empty"):
            parse_rubric(json.dumps([{"criterion": blank, "weight": 2}]))
    assert re.search(pattern, "Is it right?")
    assert Constraint.json_schema(rubric_schema()).schema == rubric_schema()
