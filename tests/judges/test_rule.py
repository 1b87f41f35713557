"""The `rule` evaluator: each check against hand-made responses, the spec's errors, math-verify against a
reference, and `harness score` with no backend built."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.errors import ConfigError
from harness.registry import lookup
from judges.base import Evaluator, parse_evaluator_spec


class NoPool:
    """A pool that fails the test if anything asks it for a model."""

    def get(self, spec, **_):
        raise AssertionError(f"a rule evaluator asked for a model: {spec}")


def build(spec: str) -> Evaluator:
    kind, settings = parse_evaluator_spec(spec)
    return lookup("evaluator", kind)(settings, NoPool())


def scores(spec: str, responses, **kwargs):
    return asyncio.run(build(spec).score_set("a prompt", responses, seed=0, **kwargs))


@pytest.mark.parametrize(("spec", "responses", "expected"), [
    ("rule:starts_with=Sure", ["  Sure, here", "sure", "Not sure"], [1.0, 0.0, 0.0]),
    ("rule:starts_with=Sure,ignore_case=true", ["sure", "SURE!", "Unsure"], [1.0, 1.0, 0.0]),
    ("rule:ends_with=.", ["Done. ", "Done!", "."], [1.0, 0.0, 1.0]),
    ("rule:contains=Paris", ["It is Paris.", "paris", ""], [1.0, 0.0, 0.0]),
    (r"rule:regex=^\d+$", ["42", "42 apples", "x42"], [1.0, 0.0, 0.0]),
    ("rule:regex=a%2Cb", ["a,b", "ab", "a, b"], [1.0, 0.0, 0.0]),  # %2C: a comma inside a spec value
    ("rule:max_words=2", ["one two", "one two three", ""], [1.0, 0.0, 1.0]),
    ("rule:min_words=2", ["one two", "one", " a  b "], [1.0, 0.0, 1.0]),
])
def test_each_check(spec, responses, expected):
    result = scores(spec, responses)
    assert list(result.scores) == expected
    assert result.trace.verdicts == [expected] and result.trace.calls == 0 and not result.trace.failures


def test_checks_combine_as_a_rubric_of_weight_one_items():
    result = scores("rule:starts_with=Yes,max_words=3", ["Yes it is", "Yes it is not so", "No"])
    assert list(result.scores) == [1.0, 0.5, 0.5]
    assert result.trace.rubric == [{"criterion": "starts with 'Yes'", "weight": 1},
                                   {"criterion": "at most 3 words", "weight": 1}]
    assert result.trace.verdicts == [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    assert result.trace.pass_rates == pytest.approx([2 / 3, 2 / 3]) and result.trace.saturated_share == 0.0


def test_the_spec_is_canonical_and_rebuilds_the_evaluator():
    judge = build("rule:max_words=5, starts_with=A%2C")
    assert judge.spec == "rule:max_words=5,starts_with=A%2C"
    again = build(judge.spec)
    texts = ["A, b", "A b", "A, b c d e f"]
    assert asyncio.run(again.score_set("p", texts, seed=1)).scores == asyncio.run(
        judge.score_set("p", texts, seed=2)).scores == (1.0, 0.5, 0.5)


@pytest.mark.parametrize(("spec", "message"), [
    ("rule:", "name at least one check"),
    ("rule:ignore_case=true", "name at least one check"),
    ("rule:regex=(", r"regex='\(' is not a valid pattern"),
    ("rule:max_words=many", "max_words='many' is not an integer"),
    ("rule:min_words=-1", "min_words must be >= 0"),
    ("rule:starts=x", "unknown setting.*starts_with"),
    ("rule:math=maybe", "write math=true"),
])
def test_bad_specs_fail_when_built(spec, message):
    with pytest.raises(ConfigError, match=message):
        build(spec)


def test_math_checks_the_reference_and_records_a_set_without_one():
    judge = build("rule:math=true")
    try:
        found = asyncio.run(judge.score_set("1/2 + 1/4?", ["So $\\frac{3}{4}$.", "It is 0.75", "1/2"], seed=0,
                                            reference="\\frac{3}{4}"))
        assert list(found.scores) == [1.0, 1.0, 0.0]
        missing = asyncio.run(judge.score_set("p", ["3/4"], seed=0))
    finally:
        asyncio.run(judge.close())
    assert missing.scores == (None,)
    (failure,) = missing.trace.failures
    assert failure.stage == "check" and "no reference answer" in failure.failure.message


def test_harness_score_builds_no_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import harness.backends

    def refuse(*args, **kwargs):
        raise AssertionError("harness score built a backend for a rule evaluator")

    monkeypatch.setattr(harness.backends, "load_backend", refuse)
    from harness.commands.cli import app

    sets = tmp_path / "sets.jsonl"
    sets.write_text(json.dumps({"id": "s", "prompt": "Greet me", "responses": ["Sure, hi", "Hello"]}) + "\n"
                    + json.dumps({"id": "m", "prompt": "2+2?", "responses": ["4", "five"], "reference": "4"}) + "\n")
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(app, ["score", "-e", "rule:starts_with=Sure", "--input", str(sets),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert lines["s"]["scores"] == [1.0, 0.0] and lines["m"]["scores"] == [0.0, 0.0]
    assert lines["s"]["trace"]["calls"] == 0 and "backend calls: 0" in result.output
