"""`harness bench supervision`: one GRPO step's reward per supervision method on the same groups, counted as the
backends see it and put against the scalar reward model's; at paper scale the plan's estimate, marked so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.base import (
    BackendOptions,
    BaseBackend,
    Completion,
    LogprobResult,
    ScoreResult,
    Usage,
)
from harness.commands.bench_supervision import bench_supervision, format_costs, measure, methods, step_sets
from harness.errors import ConfigError
from harness.registry import register

RUBRIC = '[{"criterion": "The response contains a digit.", "weight": 3}, {"criterion": "It is polite.", "weight": 2}]'


class StepBackend(BaseBackend):
    """Writes `RUBRIC`, answers every verification yes (a question, an answer sheet, a next-token position) and
    scores a response by its length; a request's prompt tokens are its words."""

    kind = "step"

    def __init__(self, name: str, options: BackendOptions) -> None:
        self.model = name

    async def generate(self, requests):
        out = []
        for r in requests:
            text = r.messages[0].content
            if "grading rubric" in text:
                answer = RUBRIC
            elif "Answer with exactly" in text:  # the answer sheet, continuing its prefill `1:`
                m = int(re.search(r"Answer with exactly (\d+) lines", text).group(1))
                answer = " yes" + "".join(f"\n{i}: yes" for i in range(2, m + 1))
            else:
                answer = "Yes"
            out.append(Completion((answer,), Usage(len(text.split()), len(answer.split()))))
        return out

    async def next_token_logprobs(self, requests, candidates):
        yes = {c: (-0.1 if c.lower() == "yes" else -3.0) for c in candidates}
        return [LogprobResult({}, branches=tuple(yes for _ in r.branches), usage=Usage(10, 0)) for r in requests]

    def check_score(self, head) -> None:
        return None

    async def score(self, requests):
        return [ScoreResult(float(len(r.messages[-1].content)), tokens=7, kept=7) for r in requests]


register("backend", "step", StepBackend)


def test_one_step_per_method_against_the_scalar_rm():
    specs = methods(reward_model="step:rm", head="classifier", generator="step:gen", verifier="step:ver",
                    gen_max_tokens=160)
    costs = measure(specs, step_sets(2, 4), options=BackendOptions(), repeats=2)  # counted on the first run
    by = {c.method: c for c in costs}
    # 2 groups x 4 completions: the RM scores 8; a rubric method writes 2 rubrics of 2 items and verifies them on
    # the 8 completions: per_item 2 x 8 questions, batched 8 answer sheets, logprob 8 requests of 2 branches.
    assert {m: c.calls for m, c in by.items()} == {
        "scalar RM": 8, "scalar RM w/ responses": 8, "static rubric (RaR)": 18, "DynamicRubric per_item": 18,
        "DynamicRubric batched": 10, "DynamicRubric logprob": 10}
    assert all(c.how == "measured" and c.scored == 8 and c.seconds is not None for c in costs)
    assert by["scalar RM"].prompt_tokens == 8 * 7 and by["scalar RM"].completion_tokens == 0
    assert by["DynamicRubric logprob"].completion_tokens == 2 * len(RUBRIC.split())  # the rubrics alone
    table = format_costs(costs, models={"reward_model": "step:rm", "head": "classifier", "generator": "step:gen",
                                        "verifier": "step:ver", "gen_max_tokens": 160}, groups=2, group_size=4)
    assert re.search(r"DynamicRubric per_item\s+measured\s+18 .* 2\.25x", table)
    assert re.search(r"DynamicRubric batched\s+measured\s+10 .* 1\.25x", table)
    assert "measured in this run" in table


def test_at_paper_scale_the_plans_estimate_is_printed_and_marked():
    table = bench_supervision(preset="paper", options=BackendOptions(), groups=2, group_size=4)
    rows = {line.split("  ")[0]: line for line in table.splitlines()[2:-1]}
    assert all(" estimate " in line for line in rows.values()) and len(rows) == 6
    # 2 rubrics and, at the plan's 8 items a rubric, 8 x 8 questions, against 8 RM scores: 66 / 8
    assert re.search(r"DynamicRubric per_item\s+estimate\s+66 .*\s-\s+-\s+8\.25x", table)
    assert "estimated (harness plan's estimate; no wall time)" in table


def _bench(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "bench", "supervision", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HARNESS_CACHE_DIR": str(cache)})


@pytest.mark.parametrize(("args", "message"), [
    (("--measure", "--estimate"), "error: --measure and --estimate: give one"),
    (("--estimate", "--head", "nonsense"), "error: scalar RM: scalar-rm: unknown head 'nonsense'; valid: "
                                            "classifier, lm-token0"),
    (("--preset", "paper", "--generator", "nosuch:model"), "error: static rubric (RaR): unknown backend kind "
                                                            "'nosuch' in model spec 'nosuch:model'"),
    (("--estimate", "--verifier", "nosuch-alias"), "error: static rubric (RaR): unknown model alias 'nosuch-alias'"),
    (("--generator", "nosuch:model"), "error: static rubric (RaR): unknown backend kind 'nosuch'"),
])
def test_contradictory_flags_and_bad_specs_are_refused_before_anything_runs(tmp_path: Path, args, message):
    """Estimating checks every method's spec as measuring does (settings, model spec forms) and the two modes
    exclude each other; measuring refuses a bad spec before it converts or loads any model."""
    done = _bench(*args, cache=tmp_path / "cache")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_an_estimate_checks_an_alias_without_converting_it(tmp_path: Path):
    done = _bench("--preset", "paper", "--generator", "smollm2-135m", cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert "generator smollm2-135m" in done.stdout and " estimate " in done.stdout
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_the_check_runs_before_measuring(monkeypatch: pytest.MonkeyPatch):
    import harness.commands.bench_supervision as bench

    def never(*args, **kwargs):
        raise AssertionError("measured a spec the check should have refused")

    monkeypatch.setattr(bench, "measure", never)
    with pytest.raises(ConfigError, match=r"static rubric \(RaR\): evaluator 'static-rubric': setting "
                                          r"gen_max_tokens='x' is not a valid int"):
        bench.check(methods(reward_model="step:rm", head="classifier", generator="step:gen", verifier="step:ver",
                            gen_max_tokens="x"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--measure and --estimate: give one"):
        bench_supervision(preset="cpu", measure_it=True, estimate_it=True, options=BackendOptions(), groups=2,
                          group_size=4)
    with pytest.raises(ConfigError, match="unknown backend kind 'nosuch'"):
        bench_supervision(preset="cpu", measure_it=True, options=BackendOptions(), groups=2, group_size=4,
                          verifier="nosuch:model")
