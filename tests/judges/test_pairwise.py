"""The `pairwise-judge` evaluator against a scripted judge backend.

The fake judge reads which response the prompt shows as A and which as B, and answers from a script keyed on
that order (successive answers for successive asks of the same order), else from a fixed preference ranking.
Model specs `fake-judge:NAME` resolve to it (the pool's `load_backend` is patched per test), so evaluators are
built from spec strings through the registry, the backend pool and the call cache, as in a run.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.backends.base import BaseBackend, Completion, GenerateRequest, Usage
from harness.cache import CallCache
from harness.errors import ConfigError, Failure, FailureCategory
from harness.pool import BackendPool
from harness.registry import lookup
from judges.base import parse_evaluator_spec
from judges.pairwise import COMPLAINT, Verdict, VerdictParseError, judge_prompt, parse_verdict

_SHOWN = re.compile(r"<response_a>\n(.*?)\n</response_a>\n\n<response_b>\n(.*?)\n</response_b>", re.DOTALL)


class FakeJudge(BaseBackend):
    """Answers judge prompts from a script keyed on (text shown as A, text shown as B)."""

    kind = "fake-judge"

    def __init__(self, model: str) -> None:
        self.model = model
        self.script: dict[tuple[str, str], list[str | Failure]] = {}
        self.ranking: list[str] = []
        """Texts best first: the default judge prefers the better-ranked one."""
        self.batches: list[list[GenerateRequest]] = []

    def _answer(self, request: GenerateRequest) -> str | Failure:
        shown = _SHOWN.search(request.messages[0].content)
        assert shown, "not a judge prompt"
        a, b = shown.groups()
        queue = self.script.get((a, b))
        if queue:
            return queue.pop(0)
        better = a if self.ranking.index(a) < self.ranking.index(b) else b
        return f"Comparing the two. Verdict:\n{'[[A]]' if better == a else '[[B]]'}"

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        self.batches.append(list(requests))
        out = []
        for r in requests:
            answer = self._answer(r)
            if isinstance(answer, Failure):
                out.append(Completion((), error=answer))
            else:
                out.append(Completion((answer,), Usage(10, 5)))
        return out

    async def next_token_logprobs(self, requests, candidates):
        raise AssertionError("the pairwise judge never asks for logprobs")


def load(spec: str, pool: BackendPool):
    """Build an evaluator from its spec through the registry (as `judges.load_evaluator` does)."""

    kind, settings = parse_evaluator_spec(spec)
    return lookup("evaluator", kind)(settings, pool)


@pytest.fixture(autouse=True)
def fake_backends(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeJudge]:
    """Model specs `fake-judge:NAME` load the fake judge NAME (the pool looks `load_backend` up per build)."""
    import harness.backends

    fakes: dict[str, FakeJudge] = {}
    real = harness.backends.load_backend

    def load_backend(spec: str, options=None):
        kind, _, name = spec.partition(":")
        return fakes.setdefault(name, FakeJudge(name)) if kind == "fake-judge" else real(spec, options)

    monkeypatch.setattr(harness.backends, "load_backend", load_backend)
    return fakes


@pytest.fixture
def judge(request: pytest.FixtureRequest, fake_backends: dict[str, FakeJudge]) -> FakeJudge:
    name = request.node.name
    fake_backends[name] = FakeJudge(name)
    return fake_backends[name]


def run(
    judge: FakeJudge, responses: Sequence[str], *, seed: int = 0, cache: CallCache | None = None, **settings
):
    spec = "pairwise-judge:" + ",".join(
        [f"model=fake-judge:{judge.model}", *(f"{k}={v}" for k, v in settings.items())]
    )

    async def go():
        pool = BackendPool(cache=cache)
        evaluator = load(spec, pool)
        try:
            return await evaluator.score_set("Which is right?", responses, seed=seed)
        finally:
            await evaluator.close()
            await pool.close()

    return asyncio.run(go())


def categories(result) -> list[str]:
    return [f.failure.category.value for f in result.trace.failures]


# ------------------------------------------------------------------------------------------------------------
# Parsing and the prompt


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("A is better.\n[[A]]", Verdict.A),
        ("[[B]]", Verdict.B),
        ("Neither wins. [[C]]", Verdict.TIE),
        (
            "I answer [[A]] if A is better... on reflection B is right.\n**[[B]]**",
            Verdict.B,
        ),  # the last one wins
        ("<think>Surely [[A]]</think>Response B is correct. [[B]]", Verdict.B),
        ("<think>[[B]]</think>\n[[A]]", Verdict.A),
    ],
)
def test_parse_verdict(text: str, verdict: Verdict) -> None:
    assert parse_verdict(text) is verdict


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("A is better.", "no \\[\\[A\\]\\]"),
        ("[[a]]", "no \\[\\["),
        ("[[ A ]]", "no \\[\\["),
        ("[A]", "no \\[\\["),
        ("<think>I will say [[A]] at the end but the budget ran out", "reasoning but nothing after"),
        ("<think>[[A]]</think>The answer is A.", "no \\[\\["),
    ],
)
def test_unparsable_verdicts(text: str, reason: str) -> None:
    with pytest.raises(VerdictParseError, match=reason):
        parse_verdict(text)


def test_judge_prompt_places_texts_verbatim() -> None:
    prompt = judge_prompt("Q {{response_b}} {x}", "first {{prompt}}", "second")
    assert "<user_request>\nQ {{response_b}} {x}\n</user_request>" in prompt
    assert _SHOWN.search(prompt).groups() == ("first {{prompt}}", "second")
    assert prompt.rstrip().endswith("[[C]] when neither is better than the other")


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, judges.pairwise; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------------------------
# Scoring K=2


def test_both_orders_agree(judge: FakeJudge) -> None:
    judge.ranking = ["good", "bad"]
    result = run(judge, ["bad", "good"])
    assert result.scores == (0.0, 1.0)
    assert [len(b) for b in judge.batches] == [2]  # both orders in one batch
    games = result.trace.raw["games"]
    assert [(g["a"], g["b"], g["verdict"], g["winner"]) for g in games] == [(0, 1, "B", 1), (1, 0, "A", 1)]
    assert result.trace.raw["pairs"] == [{"responses": [0, 1], "sum": -2, "games": 2, "preferred": 1}]
    assert result.trace.failures == () and result.trace.calls == 2


def test_orders_disagree_is_a_tie(judge: FakeJudge) -> None:
    judge.script = {("x", "y"): ["[[A]]"], ("y", "x"): ["[[A]]"]}  # always the first shown: position bias
    result = run(judge, ["x", "y"])
    assert result.scores == (0.5, 0.5)
    assert result.trace.raw["pairs"][0] == {"responses": [0, 1], "sum": 0, "games": 2, "preferred": None}


def test_one_order_prefers_the_other_ties(judge: FakeJudge) -> None:
    judge.script = {("x", "y"): ["[[A]]"], ("y", "x"): ["[[C]]"]}
    result = run(judge, ["x", "y"])
    assert result.scores == (0.75, 0.25)
    assert result.trace.raw["pairs"][0]["preferred"] == 0 and result.trace.raw["pairs"][0]["sum"] == 1


def test_unparsable_answer_is_fixed_by_the_re_ask(judge: FakeJudge) -> None:
    judge.ranking = ["x", "y"]
    judge.script = {("y", "x"): ["Clearly the first one is worse.", "[[B]]"]}
    result = run(judge, ["x", "y"])
    assert result.scores == (1.0, 0.0) and result.trace.failures == ()
    assert [len(b) for b in judge.batches] == [2, 1] and result.trace.calls == 3
    (reask,) = judge.batches[1]
    assert [m.role for m in reask.messages] == ["user", "assistant", "user"]
    assert reask.messages[1].content == "Clearly the first one is worse."
    assert reask.messages[2].content == COMPLAINT.format(reason="no [[A]], [[B]] or [[C]] marker found")
    game = result.trace.raw["games"][1]
    assert game["texts"] == ["Clearly the first one is worse.", "[[B]]"] and game["asks"] == 2


def test_unparsable_twice_fails_the_game_and_the_other_decides(judge: FakeJudge) -> None:
    judge.ranking = ["x", "y"]
    judge.script = {("x", "y"): ["", "I cannot decide."]}
    result = run(judge, ["x", "y"])
    assert result.scores == (1.0, 0.0)  # from the (y, x) game alone
    (failure,) = result.trace.failures
    assert failure.stage == "judge" and failure.failure.category is FailureCategory.PARSE
    assert failure.failure.attempts == 2 and failure.failure.message.startswith(
        "game 0 (response 0 as A, 1 as B)"
    )
    assert judge.batches[1][0].messages[1].content == "(empty reply)"
    game = result.trace.raw["games"][0]
    assert (
        game["verdict"] is None
        and game["texts"] == ["", "I cannot decide."]
        and game["failure"]["category"] == "parse"
    )
    assert result.trace.raw["pairs"][0]["games"] == 1


def test_both_games_failing_leaves_no_scores(judge: FakeJudge) -> None:
    judge.script = {("x", "y"): ["?", "?"], ("y", "x"): ["?", "?"]}
    result = run(judge, ["x", "y"])
    assert result.scores == (None, None) and result.n_unscored == 2
    assert categories(result) == ["parse", "parse"]
    assert result.trace.raw["pairs"][0] == {"responses": [0, 1], "sum": 0, "games": 0, "preferred": None}


def test_backend_failure_is_recorded_with_its_category(judge: FakeJudge) -> None:
    judge.ranking = ["x", "y"]
    judge.script = {("y", "x"): [Failure(FailureCategory.RATE_LIMIT, "429 after 6 attempts", attempts=6)]}
    result = run(judge, ["x", "y"])
    assert result.scores == (1.0, 0.0)
    (failure,) = result.trace.failures
    assert failure.failure.category is FailureCategory.RATE_LIMIT and failure.failure.attempts == 6
    assert "429 after 6 attempts" in failure.failure.message
    assert len(judge.batches) == 1  # a backend failure is not re-asked


def test_backend_failure_on_the_re_ask(judge: FakeJudge) -> None:
    judge.ranking = ["x", "y"]
    judge.script = {("x", "y"): ["hmm", Failure(FailureCategory.TIMEOUT, "timed out", attempts=3)]}
    result = run(judge, ["x", "y"])
    assert (
        categories(result) == ["timeout"] and "re-ask: timed out" in result.trace.failures[0].failure.message
    )
    assert result.scores == (1.0, 0.0)


# ------------------------------------------------------------------------------------------------------------
# K != 2, caching, settings


def test_round_robin_for_three(judge: FakeJudge) -> None:
    judge.ranking = ["best", "mid", "worst"]
    result = run(judge, ["mid", "worst", "best"])
    assert result.scores == (0.5, 0.0, 1.0)
    shown = sorted((g["a"], g["b"]) for g in result.trace.raw["games"])
    assert shown == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]  # K(K-1) games, each order once
    assert [len(b) for b in judge.batches] == [6] and result.trace.calls == 6
    assert [p["preferred"] for p in result.trace.raw["pairs"]] == [0, 2, 2]


def test_round_robin_with_a_failed_game_uses_mean_points(judge: FakeJudge) -> None:
    judge.ranking = ["best", "mid", "worst"]
    judge.script = {("best", "mid"): ["?", "?"]}
    result = run(judge, ["best", "mid", "worst"])
    # best: 3 points from 3 scored games; mid: 2 from 3 (beats worst twice, loses to best); worst: 0 from 4.
    assert result.scores == (1.0, pytest.approx(2 / 3), 0.0)
    assert categories(result) == ["parse"]


def test_single_and_empty_sets(judge: FakeJudge) -> None:
    result = run(judge, ["alone"])
    assert result.scores == (None,) and categories(result) == ["unsupported"] and judge.batches == []
    assert run(judge, []).scores == ()


def test_repeats_come_from_the_call_cache(judge: FakeJudge, tmp_path: Path) -> None:
    judge.ranking = ["x", "y"]
    cache = CallCache(tmp_path / "c.sqlite")
    first = run(judge, ["x", "y"], cache=cache, seed=1)
    again = run(judge, ["x", "y"], cache=cache, seed=2)  # greedy: the seed does not enter the key
    assert first.trace.calls == 2 and again.trace.calls == 0 and again.scores == first.scores


def test_sampling_settings_reach_the_backend(judge: FakeJudge) -> None:
    judge.ranking = ["x", "y"]
    run(judge, ["x", "y"], temperature=0.7, max_tokens=64, seed=3)
    params = [r.params for r in judge.batches[0]]
    assert {(p.temperature, p.max_tokens) for p in params} == {(0.7, 64)}
    assert len({p.seed for p in params}) == 2  # one seed per game


def test_spec_is_canonical(judge: FakeJudge) -> None:
    pool = BackendPool()
    evaluator = load(f"pairwise-judge:max_tokens=256,model=fake-judge:{judge.model}", pool)
    assert evaluator.spec == f"pairwise-judge:max_tokens=256,model=fake-judge:{judge.model}"
    assert load(evaluator.spec, pool).spec == evaluator.spec


@pytest.mark.parametrize(
    "settings, message",
    [
        ("model=fake-judge:m,top_k=5", "unknown setting.*top_k.*valid: max_tokens, model, structured, temperature"),
        ("temperature=0", "missing required setting.*model"),
        ("model=fake-judge:m,max_tokens=many", "max_tokens"),
        ("model=fake-judge:m,temperature=-1", "temperature must be >= 0"),
        ("model=fake-judge:m,max_tokens=0", "max_tokens must be >= 1"),
        ("model=nosuchkind:m", "unknown"),
    ],
)
def test_bad_settings_are_rejected(settings: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load("pairwise-judge:" + settings, BackendPool())


def test_structured_games_end_in_a_verdict_marker_and_can_be_switched_off():
    import re

    from judges.pairwise import VERDICT_CONSTRAINT

    assert re.fullmatch(VERDICT_CONSTRAINT.spec, "A is right.\nVerdict: [[A]]")
    assert re.fullmatch(VERDICT_CONSTRAINT.spec, "[[C]]")
    assert not re.fullmatch(VERDICT_CONSTRAINT.spec, "A is better.")
    assert not re.fullmatch(VERDICT_CONSTRAINT.spec, "[[D]]")
    on = load("pairwise-judge:model=fake-judge:m", BackendPool())
    off = load("pairwise-judge:model=fake-judge:m,structured=false", BackendPool())
    assert on._params(0).constraint == VERDICT_CONSTRAINT and off._params(0).constraint is None
    assert "structured" not in on.spec and "structured=false" in off.spec
