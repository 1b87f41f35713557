"""`harness train` and `harness bench reward`: bad input (config, data file, a stage of a co-evolution) is one clear
error line (exit 2) before any model loads; Nectar comes from a data dir; the GPU path (vLLM colocated generation,
bf16) runs where CUDA is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "train", *args], capture_output=True, text=True,
                          timeout=120)


def _write(path: Path, config: dict) -> Path:
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    """The run's only stderr line, checked to be an `error:` line of exit code 2."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    return lines[0]


def test_bad_configs_are_one_line_errors(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\nlearning_rate: 1\n")
    unknown = _train("policy", "--config", str(config))
    assert unknown.returncode == 2 and "learning_rate: Extra inputs are not permitted" in unknown.stderr
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\ngenerator: smollm2-135m\n")
    no_data = _train("policy", "--config", str(config), "--data-dir", str(tmp_path / "missing"))
    assert f"benchmark data folder not found: {tmp_path / 'missing' / 'nectar'}; the data is on the Hugging Face Hub" \
        in _one_error_line(no_data)
    verb = _train("critic", "--config", str(config))
    assert verb.returncode == 2 and "expected generator, policy, coevolve or plot" in verb.stderr
    gone = _train("policy", "--config", str(config), "--nectar", str(tmp_path / "rows.jsonl"))
    assert gone.returncode == 2 and "No such option: --nectar" in gone.stderr


def test_generator_training_needs_the_policy_sets(tmp_path: Path, nectar_dir: Path):
    config = tmp_path / "c.yaml"
    config.write_text("model: smollm2-135m\noutput_dir: out\nverifier: smollm2-135m\ndata: {limit: 1}\n")
    found = _train("generator", "--config", str(config), "--data-dir", str(nectar_dir), "--output-dir",
                   str(tmp_path / "g"))
    assert found.returncode == 2 and "data.sets: generator training needs the policy" in found.stderr


def test_nectar_is_read_from_the_data_dir_where_the_benchmark_reads_it(tmp_path: Path, nectar_dir: Path,
                                                                       tiny_lm: Path):
    """`--data-dir DIR` reads `DIR/nectar/rlaif.jsonl`, as the `nectar_lmsys` benchmark does; so does the config's
    `data.data_dir`."""
    config = _write(tmp_path / "c.yaml", {"model": f"hf:{tiny_lm}", "output_dir": str(tmp_path / "p"),
                                          "verifier": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}",
                                          "data": {"policy_rules": {"max_prompt_chars": 1}}})
    from training.data import read_nectar

    rows = list(read_nectar(nectar_dir / "nectar" / "rlaif.jsonl"))
    short = sum(len(r.prompt) <= 50 for r in rows)  # these rows carry no source: no short-prompt exemption
    found = _train("policy", "--config", str(config), "--data-dir", str(nectar_dir))
    assert found.returncode == 2 and "no Nectar row passed the rules" in found.stderr
    assert f"dropped by max_prompt_chars: {len(rows) - short}" in found.stderr
    assert f"dropped by min_prompt_chars: {short}" in found.stderr
    _write(config, {**json.loads(config.read_text()), "data": {"data_dir": str(nectar_dir), "policy_rules": {
        "max_prompt_chars": 1}}})
    assert f"dropped by max_prompt_chars: {len(rows) - short}" in _train("policy", "--config", str(config)).stderr


@pytest.mark.parametrize("name, content, problem", [
    ("rlaif.parquet", "prompt,answers\nthis is a CSV file, not parquet\n", "not a readable parquet file"),
    ("rlaif.jsonl", '{"prompt": "\\n\\nHuman: Hi\\n\\nAssistant: ", "answers": [\n', "rlaif.jsonl:1: invalid JSON"),
    ("rlaif.jsonl", '{"prompt": "\\n\\nHuman: Hi\\n\\nAssistant: ", "answers": "none"}\n',
     "rlaif.jsonl:1: field 'answers' must be a list"),
])
def test_a_malformed_data_file_is_one_line_naming_it(tmp_path: Path, tiny_lm: Path, name: str, content: str,
                                                     problem: str):
    (tmp_path / "data" / "nectar").mkdir(parents=True)
    (tmp_path / "data" / "nectar" / name).write_text(content)
    config = _write(tmp_path / "c.yaml", {"model": f"hf:{tiny_lm}", "output_dir": str(tmp_path / "p"),
                                          "verifier": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}"})
    line = _one_error_line(_train("policy", "--config", str(config), "--data-dir", str(tmp_path / "data")))
    assert str(tmp_path / "data" / "nectar" / name) in line and problem in line
    assert not (tmp_path / "p").exists()


def test_coevolve_modes_are_checked_when_the_config_loads(tmp_path: Path):
    config = _write(tmp_path / "co.yaml", {"policy": "smollm2-135m", "generator": "smollm2-135m",
                                           "verifier": "smollm2-135m", "output_dir": str(tmp_path / "co"),
                                           "verify_mode": "telepathy", "objective": "bogus"})
    line = _one_error_line(_train("coevolve", "--config", str(config)))
    assert "verify_mode: Input should be 'per_item', 'batched' or 'logprob'" in line
    assert "objective: Input should be 'both', 'disc' or 'anchor'" in line


def test_coevolve_checks_every_stage_before_training_the_first(tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    """A value TRL refuses in the policy's settings stops the run before G1 trains (it used to fail after)."""
    config = _write(tmp_path / "co.yaml", {
        "policy": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}", "verifier": f"hf:{tiny_lm}",
        "output_dir": str(tmp_path / "co"), "data": {"generator_limit": 2, "policy_limit": 2},
        "generator_grpo": {"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 1},
        "policy_grpo": {"num_generations": 3, "per_device_train_batch_size": 2, "max_steps": 1}})
    line = _one_error_line(_train("coevolve", "--config", str(config), "--data-dir", str(nectar_dir)))
    assert "stage P1: grpo: generation_batch_size (2) must be divisible by num_generations (3)" in line
    assert not (tmp_path / "co" / "G1").exists()


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

    from training.fit import fit
    from training.rewards import PolicyReward
    from judges.dynamic import RubricEvaluator

    model = build_tiny_lm(tmp_path / "p0", context=512, head_dim=32)
    scripted = ScriptedVerifier()
    evaluator = RubricEvaluator("dynamic-rubric:generator=scripted", generator=scripted, verifier=scripted,
                                dynamic=True, mode="logprob")
    rows = [{"prompt": [{"role": "user", "content": f"Say something {i}."}], "row": f"r{i}",
             "question": f"Say something {i}."} for i in range(4)]
    settings = _settings(use_vllm=True, vllm_mode="colocate", bf16=True, vllm_gpu_memory_utilization=0.2)
    log = fit(str(model), settings, rows, PolicyReward(evaluator, group_size=2), tmp_path / "p1").log
    assert log.is_file() and (tmp_path / "p1" / "model.safetensors").is_file()


def test_each_process_must_hold_whole_groups_and_frozen_engines_are_served(tmp_path: Path, monkeypatch):
    from types import SimpleNamespace

    from harness.errors import ConfigError
    from training.grpo import TrainConfig, _check_local_groups
    from training.job import _check_frozen_engines

    # Two processes of 2 completions each, groups of 4: TRL accepts the global batch of 4; each process would
    # reward half a group.
    args = SimpleNamespace(per_device_train_batch_size=2, steps_per_generation=1, num_generations=4,
                           eval_strategy="no", num_generations_eval=None, per_device_eval_batch_size=2)
    with pytest.raises(ConfigError, match=r"a process's generation batch \(per_device_train_batch_size x "
                                          r"steps_per_generation = 2\) must hold whole groups of num_generations"):
        _check_local_groups(args)
    _check_local_groups(SimpleNamespace(**{**vars(args), "steps_per_generation": 2}))
    with pytest.raises(ConfigError, match=r"per_device_eval_batch_size \(2\) must hold whole groups of 4"):
        _check_local_groups(SimpleNamespace(**{**vars(args), "steps_per_generation": 2, "eval_strategy": "steps"}))
    config = TrainConfig(model="m", output_dir=tmp_path / "p", verifier="vllm:Qwen/Qwen3-8B", generator="g")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"verifier vllm:Qwen/Qwen3-8B: under 2 training processes each would "
                                          r"start a vLLM engine of its own; serve it"):
        _check_frozen_engines("policy", config, {})
    _check_frozen_engines("policy", config, {"vllm:Qwen/Qwen3-8B": object()})  # served: fine
    monkeypatch.setenv("WORLD_SIZE", "1")
    _check_frozen_engines("policy", config, {})


def test_eval_every_needs_heldout_rows(tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    config = _write(tmp_path / "c.yaml", {"model": f"hf:{tiny_lm}", "output_dir": str(tmp_path / "p"),
                                          "verifier": f"hf:{tiny_lm}", "generator": f"hf:{tiny_lm}"})
    line = _one_error_line(_train("policy", "--config", str(config), "--data-dir", str(nectar_dir),
                                  "--eval-every", "2"))
    assert "eval_every: the held-out evaluation needs data.heldout rows" in line
    line = _one_error_line(_train("policy", "--config", str(config), "--seeds", "2"))
    assert "needs --eval-every K and data.heldout > 0" in line
