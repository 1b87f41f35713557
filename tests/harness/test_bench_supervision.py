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
        "scalar RM": 8, "scalar RM w/ responses": 8, "static rubric (RaR)": 18,
        "static rubric (RaR), amortised": 18, "DynamicRubric per_item": 18, "DynamicRubric batched": 10,
        "DynamicRubric logprob": 10}
    assert all(c.how == "measured" and c.scored == 8 and c.seconds is not None for c in costs
               if c.method != "static rubric (RaR), amortised")
    # Made before training, the static rubric's generation leaves the step's wall time; in one epoch it costs
    # the same calls and tokens.
    made = by["static rubric (RaR), amortised"]
    assert made.how == "derived" and 0 < made.seconds < by["static rubric (RaR)"].seconds
    assert made.completion_tokens == by["static rubric (RaR)"].completion_tokens
    assert all(c.prefill_flop is None for c in costs)  # the stand-in backend's size is unknown
    assert by["scalar RM"].prompt_tokens == 8 * 7 and by["scalar RM"].completion_tokens == 0
    assert by["DynamicRubric logprob"].completion_tokens == 2 * len(RUBRIC.split())  # the rubrics alone
    table = format_costs(costs, models={"reward_model": "step:rm", "head": "classifier", "generator": "step:gen",
                                        "verifier": "step:ver", "gen_max_tokens": 160}, groups=2, group_size=4)
    assert "static generator step:gen" in table
    assert re.search(r"DynamicRubric per_item\s+measured\s+18 .* 2\.25x", table)
    assert re.search(r"DynamicRubric batched\s+measured\s+10 .* 1\.25x", table)
    assert "measured in this run" in table


def test_at_paper_scale_the_plans_estimate_is_printed_marked_and_weighed_by_active_parameters():
    table = bench_supervision(preset="paper", options=BackendOptions(), groups=2, group_size=4, epochs=2)
    rows = {line[:31].strip(): line[31:].split() for line in table.splitlines()[2:-2]}
    assert len(rows) == 8 and "scalar RM (large)" in rows and "static rubric (RaR), amortised" in rows
    assert all(r[0] == ("derived" if m.endswith("amortised") else "estimate") for m, r in rows.items())
    # 2 rubrics and, at the plan's 8 items a rubric, 8 x 8 questions, against 8 RM scores: 66 / 8
    assert re.search(r"DynamicRubric per_item\s+estimate\s+66 .*\s-\s+-\s+8\.25x", table)
    assert "estimated (harness plan's estimate; no wall time)" in table

    def compute(method: str) -> float:
        return float(rows[method][-2].rstrip("x"))

    # The 70B RM reads the same tokens as the 27B one: 70.6 / 27.2 of its compute.
    assert compute("scalar RM (large)") == pytest.approx(70.6 / 27.2, abs=0.01)
    # The verifier (Qwen3-30B-A3B) weighs 3.3B a token; the 235B-A22B static generator 22B, the DR one 8.2B.
    assert compute("DynamicRubric per_item") < compute("static rubric (RaR)")
    # Over two epochs the static rubric's generation is made once: half its calls stay in a step's share.
    assert float(rows["static rubric (RaR), amortised"][1]) == float(rows["static rubric (RaR)"][1]) - 1
    assert compute("static rubric (RaR), amortised") < compute("static rubric (RaR)")


def _bench(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "bench", "supervision", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HARNESS_CACHE_DIR": str(cache)})


@pytest.mark.parametrize(("args", "message"), [
    (("--measure", "--estimate"), "error: --measure and --estimate: give one"),
    (("--estimate", "--head", "nonsense"), "error: scalar RM: scalar-rm: unknown head 'nonsense'; valid: "
                                            "classifier, lm-token0"),
    (("--preset", "paper", "--generator", "nosuch:model"), "error: DynamicRubric per_item: unknown backend kind "
                                                            "'nosuch' in model spec 'nosuch:model'"),
    (("--preset", "paper", "--static-generator", "nosuch:model"), "error: static rubric (RaR): unknown backend "
                                                                   "kind 'nosuch' in model spec 'nosuch:model'"),
    (("--estimate", "--verifier", "nosuch-alias"), "error: static rubric (RaR): unknown model alias 'nosuch-alias'"),
    (("--generator", "nosuch:model"), "error: DynamicRubric per_item: unknown backend kind 'nosuch'"),
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


def test_the_rewards_share_of_a_policy_runs_grpo_steps_and_each_methods_projection(tmp_path: Path):
    """`--grpo-log RUN`: the share is the run's own (mean reward seconds over mean step time); a method's projection
    puts its measured wall time against the run's time outside the reward, scaled to the bench's completions."""
    import json

    from harness.commands.bench_supervision import Cost, grpo_share

    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "eval_loss": 0.1},  # an evaluation line: no step time
        {"step": 1, "step_time": 10.0, "dr/reward_seconds": 6.0},
        {"step": 2, "step_time": 14.0, "dr/reward_seconds": 8.0}]) + "\n")
    settings = {"generator": "g", "verifier": "v", "verify_mode": "per_item",
                "grpo": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}}
    (run / "dr_manifest.json").write_text(json.dumps({"settings": settings}))
    costs = [Cost("scalar RM", "s", "measured", 8, 10, 0, 1.0, 8), Cost("x", "s", "estimate", 8, 10, 0, None, None)]
    lines = grpo_share(run, costs, completions=8)
    assert "12.0 s a step, the reward 7.0 s: 58% of the step" in lines[0] and "mode=per_item" in lines[0]
    # outside the reward: 5 s for 4 completions, 10 s for the bench's 8; the RM's 1 s is 1/11 of such a step
    assert lines[1].split()[-1] == "9%" and len(lines) == 2
    (run / "dr_manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="--grpo-log .*not a policy run's directory"):
        grpo_share(run, costs, completions=8)
    with pytest.raises(ConfigError, match="no training log"):
        grpo_share(tmp_path, costs, completions=8)
