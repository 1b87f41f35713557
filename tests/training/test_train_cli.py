"""`harness train` and `harness bench reward`: bad input is one clear error line (exit 2) before any model loads;
the GPU path (vLLM colocated generation, bf16) runs where CUDA is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "train", *args], capture_output=True, text=True,
                          timeout=120)


def test_bad_configs_are_one_line_errors(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\nlearning_rate: 1\n")
    unknown = _train("policy", "--config", str(config))
    assert unknown.returncode == 2 and "learning_rate: Extra inputs are not permitted" in unknown.stderr
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\n")
    no_sets = _train("generator", "--config", str(config), "--nectar", str(tmp_path / "missing.jsonl"))
    assert no_sets.returncode == 2 and "data.nectar: no such file" in no_sets.stderr
    verb = _train("critic", "--config", str(config))
    assert verb.returncode == 2 and "expected generator, policy or coevolve" in verb.stderr


def test_generator_training_needs_the_policy_sets(tmp_path: Path, shared_data: Path):
    config = tmp_path / "c.yaml"
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\ndata: {limit: 1}\n")
    nectar = shared_data / "nectar" / "ablation_baseline_no_tiebreak_rankings.jsonl"
    found = _train("generator", "--config", str(config), "--nectar", str(nectar), "--output-dir", str(tmp_path / "g"))
    assert found.returncode == 2 and "data.sets: generator training needs the policy" in found.stderr


def test_nothing_left_after_the_rules_says_which_rules_dropped_what(tmp_path: Path, shared_data: Path):
    config = tmp_path / "c.yaml"
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\ngenerator: smollm2-135m\n"
                      "data: {policy_rules: {max_prompt_chars: 1}}\n")
    nectar = shared_data / "nectar" / "ablation_baseline_no_tiebreak_rankings.jsonl"
    found = _train("policy", "--config", str(config), "--nectar", str(nectar), "--output-dir", str(tmp_path / "p"))
    assert found.returncode == 2 and "no Nectar row passed the rules" in found.stderr
    assert "dropped by max_prompt_chars: 189" in found.stderr and "dropped by min_prompt_chars: 5" in found.stderr


def test_bench_reward_reports_the_ratio_of_one_run():
    from harness.commands.bench_reward import RewardTiming, format_bench_reward

    text = format_bench_reward([RewardTiming("per_item", 6.0, 60, [0.1, None]),
                                RewardTiming("logprob", 2.0, 24, [0.2, 0.3])], model="m")
    assert "per_item/logprob: 3.00x wall time, 2.50x requests (one run)" in text
    assert "per_item      6.00 s    60 verifier requests  1 scored" in text


@pytest.mark.gpu
def test_vllm_colocated_generation_and_bf16_on_a_gpu(tmp_path: Path):
    """GPU only: the same tiny generator run as the CPU smoke test, generating with vLLM in the training process."""
    pytest.importorskip("vllm")
    from test_grpo_smoke import ScriptedVerifier, _settings
    from tiny_models import build_tiny_lm

    from training.grpo import fit
    from training.rewards import PolicyReward
    from judges.dynamic import RubricEvaluator

    model = build_tiny_lm(tmp_path / "p0", context=512, head_dim=32)
    scripted = ScriptedVerifier()
    evaluator = RubricEvaluator("dynamic-rubric:generator=scripted", generator=scripted, verifier=scripted,
                                dynamic=True, mode="logprob")
    rows = [{"prompt": [{"role": "user", "content": f"Say something {i}."}], "row": f"r{i}",
             "question": f"Say something {i}."} for i in range(4)]
    settings = _settings(use_vllm=True, vllm_mode="colocate", bf16=True, vllm_gpu_memory_utilization=0.2)
    log = fit(str(model), settings, rows, PolicyReward(evaluator, group_size=2), tmp_path / "p1")
    assert log.is_file() and (tmp_path / "p1" / "model.safetensors").is_file()
