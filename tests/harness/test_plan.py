"""`harness plan`: the paper preset's models sized from their config.json files (written here into a Hub cache),
phases and shares on an 8-GPU node, the same plan refused on one GPU with its numbers and the ways out, and `run`
making the same check before any model call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paper_configs import HUB_CONFIGS, QWEN3_8B, hub_cache

from harness.weights import model_size


@pytest.fixture()
def node(tmp_path: Path) -> dict[str, str]:
    """An offline machine whose Hub cache holds the paper models' configs, and a DR-Generator checkpoint folder."""
    hub_cache(tmp_path / "hub")
    ckpt = tmp_path / "checkpoints" / "dr-generator-8b"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(QWEN3_8B))
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}


def harness(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, **env, "PYTHONPATH": str(Path.cwd())})


def gib(repo: str) -> float:
    return model_size(HUB_CONFIGS[repo]).gib


def test_the_paper_preset_on_one_8_gpu_node(tmp_path: Path, node: dict[str, str], shared_data: Path):
    done = harness("plan", "table1", "--data-dir", str(shared_data), "--skip-unavailable", "--preset", "paper",
                   "--gpus", "8", "--gpu-memory", "80", cwd=tmp_path, env=node)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "devices: 8 x 80 GiB; engines may take 73.6 GiB of each together" in out
    # Every weight figure is parameters x 2 bytes (bf16), within 5% of the published parameter count x 2.
    published = {"Qwen/Qwen3-8B": 8.2e9, "Qwen/Qwen3-32B": 32.8e9, "Qwen/Qwen3-30B-A3B": 30.5e9,
                 "nvidia/Llama-3.1-Nemotron-70B-Reward-HF": 70.6e9, "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": 27.2e9}
    for repo, params in published.items():
        line = next(line for line in out.splitlines() if repo in line and "parameters" in line)
        shown = float(line.split(", ")[2].removesuffix(" GiB;").split()[0])
        assert shown == pytest.approx(gib(repo), abs=0.05)
        assert shown == pytest.approx(params * 2 / 2**30, rel=0.05)
    assert "vllm:Qwen/Qwen3-30B-A3B: 30.53B parameters, bfloat16, 56.9 GiB; spans 8 device(s)" in out
    assert "vllm:checkpoints/dr-generator-8b: 8.19B parameters" in out
    assert "phases:\n  1. rows: Skywork-27B," in out
    assert "tensor_parallel_size 8, gpu_memory_utilization" in out
    assert "requests and tokens" in out


def test_the_same_plan_on_one_gpu_is_refused_with_the_numbers_and_the_ways_out(tmp_path: Path, node: dict[str, str],
                                                                                shared_data: Path):
    done = harness("plan", "table1", "--data-dir", str(shared_data), "--skip-unavailable", "--preset", "paper",
                   "--gpus", "1", "--gpu-memory", "80", cwd=tmp_path, env=node)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: the plan does not fit: models needed together (")
    assert "hf:nvidia/Llama-3.1-Nemotron-70B-Reward-HF 135.4" in line and "exceed the budget of 73.6 per device" in line
    assert "ways out: serve the large models (`harness serve`" in line and "spread" in line
    # `run` checks the same before it calls any model (on the reward-model row: it needs no vLLM here)
    config = tmp_path / "nemotron.yaml"
    config.write_text("only_rows: [Nemotron-70B]\nbenchmarks: [ultrafeedback]\n")
    run = harness("run", "table1", "--preset", "paper", "--config", str(config), "--gpus", "1", "--gpu-memory", "80",
                  "--data-dir", str(shared_data), "--limit", "2", "--out", str(tmp_path / "run"), cwd=tmp_path,
                  env=node)
    assert run.returncode == 2 and "exceed the budget of 73.6 per device" in run.stderr, run.stderr
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_a_training_job_is_planned_per_gpu_and_refused_when_it_cannot_fit(tmp_path: Path, node: dict[str, str]):
    configs = Path(__file__).resolve().parents[2] / "training" / "configs"
    fits = harness("plan", "--train", "generator", "--config", str(configs / "generator-8b.yaml"), "--gpus", "6",
                   "--gpu-memory", "80", cwd=tmp_path, env=node)
    assert fits.returncode == 0, fits.stderr
    trained = 8.19e9 * 16 / 6 / 2**30  # Qwen3-8B: weights, gradients and Adam state, ZeRO-3 over 6 processes
    assert f"trained model Qwen/Qwen3-8B: {trained:.1f} GiB per GPU" in fits.stdout
    assert "TRL's colocated vLLM: 24.0 GiB" in fits.stdout  # vllm_gpu_memory_utilization 0.3 of 80 GiB
    assert "served: vllm:Qwen/Qwen3-30B-A3B" in fits.stdout and "fits: 64.0 of 73.6 GiB per GPU" in fits.stdout
    # The verifier loaded in every process instead of served: counted, and the job no longer fits.
    local = tmp_path / "local-verifier.yaml"
    text = (configs / "generator-8b.yaml").read_text()
    local.write_text(text[: text.index("models:")])
    refused = harness("plan", "--train", "generator", "--config", str(local), "--gpus", "6", "--gpu-memory", "80",
                      cwd=tmp_path, env=node)
    assert refused.returncode == 2
    assert "verifier vllm:Qwen/Qwen3-30B-A3B 60.9" in refused.stderr and "ways out: serve the frozen models" \
        in refused.stderr


# --- plan refuses what run refuses, and contradictory flags ------------------------------------------------------

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _one_error(done: subprocess.CompletedProcess) -> str:
    """The single `error:` line of a command that exited 2 (no traceback)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in done.stderr
    return line


def _rows(path: Path, rows: dict[str, str]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"rows": rows, "only_rows": list(rows), "benchmarks": ["ultrafeedback"]}))
    return path


@pytest.mark.parametrize("kind", ["missing path", "folder without config.json"])
def test_a_model_that_cannot_be_built_stops_plan_where_it_stops_run(tmp_path: Path, kind: str, shared_data: Path):
    folder = tmp_path / "rm"
    if kind != "missing path":
        folder.mkdir()
    config = _rows(tmp_path / "rm.yaml", {"Skywork-27B": f"scalar-rm:model=vllm:{folder}"})
    plan = harness("plan", "table1", "--data-dir", str(shared_data), "--config", str(config), cwd=tmp_path, env=OFFLINE)
    run = harness("run", "table1", "--config", str(config), "--data-dir", str(shared_data), "--limit", "2",
                  "--out", str(tmp_path / "run"), cwd=tmp_path, env=OFFLINE)
    line = _one_error(plan)
    assert str(folder) in line and "cannot be built" in line and "every model" not in plan.stdout
    assert run.returncode == 2 and line in run.stderr.splitlines()  # the same check, the same words
    # Told to leave out what cannot be built, both refuse a table with nothing left.
    plan = harness("plan", "table1", "--data-dir", str(shared_data), "--config", str(config), "--skip-unavailable",
                   cwd=tmp_path, env=OFFLINE)
    run = harness("run", "table1", "--config", str(config), "--skip-unavailable", "--data-dir", str(shared_data),
                  "--limit", "2", "--out", str(tmp_path / "run"), cwd=tmp_path, env=OFFLINE)
    assert "no evaluator could be loaded, nothing to plan" in _one_error(plan) and str(folder) in plan.stderr
    assert run.returncode == 2 and "no evaluator could be loaded" in run.stderr


@pytest.mark.parametrize("argv", [
    ("--bench-option", "nosuch.key=1"),
    ("--bench-option", "ultrafeedback.nosuchkey=1"),
    ("--item", "ultrafeedback:nope"),
    ("--data-dir", "/nonexistent"),
], ids=["option for no benchmark", "unknown option", "unknown item", "no data"])
def test_plan_refuses_the_benchmark_settings_run_refuses_with_the_same_line(tmp_path: Path, shared_data: Path,
                                                                            argv: tuple[str, ...]):
    config = _rows(tmp_path / "rows.yaml", {"Qwen3-8B zero-shot": "dynamic-rubric:generator=openai:g"})
    data = () if "--data-dir" in argv else ("--data-dir", str(shared_data))
    plan = harness("plan", "table1", "--config", str(config), *data, *argv, cwd=tmp_path, env=OFFLINE)
    run = harness("run", "table1", "--config", str(config), *data, *argv, "--out", str(tmp_path / "run"),
                  cwd=tmp_path, env=OFFLINE)
    line = _one_error(plan)
    assert run.returncode == 2 and line in run.stderr.splitlines() and not (tmp_path / "run").exists()
    if "--data-dir" in argv:  # told to leave out what cannot be loaded, plan shows it and refuses an empty table
        left = harness("plan", "table1", "--config", str(config), *argv, "--skip-unavailable", cwd=tmp_path,
                       env=OFFLINE)
        assert "no benchmark could be loaded, nothing to plan" in _one_error(left)


def _qwen3_moe(**changes) -> dict:
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "num_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 16}
    return {**config, **changes}


@pytest.mark.parametrize(("config", "said"), [
    (_qwen3_moe(mlp_only_layers=5), "'mlp_only_layers' must be a list of layer indices, not 5"),
    ({"model_type": "gemma3", "text_config": {"model_type": ["x"]}}, "text_config.model_type must be a string"),
    (_qwen3_moe(num_hidden_layers=10**9), "'num_hidden_layers' is 1000000000, more than any model has"),
], ids=["mlp_only_layers", "text_config.model_type", "num_hidden_layers"])
def test_a_malformed_config_json_is_one_line_naming_the_model(tmp_path: Path, config: dict, said: str,
                                                               shared_data: Path):
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    rows = _rows(tmp_path / "rows.yaml", {"Qwen3-8B zero-shot": f"dynamic-rubric:generator=vllm:{folder}"})
    done = harness("plan", "table1", "--data-dir", str(shared_data), "--config", str(rows), cwd=tmp_path, env=OFFLINE)
    line = _one_error(done)
    assert line.startswith(f"error: cannot size vllm:{folder}: ") and said in line


def test_contradictory_or_invalid_flags_are_refused(tmp_path: Path):
    configs = Path(__file__).resolve().parents[2] / "training" / "configs"
    policy = str(configs / "policy-8b.yaml")
    cases = {
        ("plan", "--train", "policy", "--config", policy, "--gpus", "1", "--gpu-memory", "80", "--processes", "64"):
            "--processes 64 needs 64 GPUs, one for each process, and there are 1",
        ("plan", "table1", "--train", "policy", "--config", policy):
            "a table (table1) or --train policy, not both",
        ("plan", "table1", "--processes", "4"): "--processes 4 is for --train",
    }
    listed = tmp_path / "listed.yaml"
    listed.write_text("models: [vllm:Qwen/Qwen3-30B-A3B]\n")
    cases[("plan", "--train", "policy", "--config", policy, "--gpus", "8", "--gpu-memory", "80", "--endpoints",
           str(listed))] = f"{listed}: models: a mapping of model spec -> endpoint, got list"
    for argv, said in cases.items():
        assert said in _one_error(harness(*argv, cwd=tmp_path, env=OFFLINE))
    infinite = harness("plan", "table1", "--gpus", "1", "--gpu-memory", "inf", cwd=tmp_path, env=OFFLINE)
    assert infinite.returncode == 2 and "--gpu-memory" in infinite.stderr and "not a finite number" in infinite.stderr
    assert "Traceback" not in infinite.stderr and "plan:" not in infinite.stdout


def test_devices_must_be_finite():
    from harness.errors import ConfigError
    from harness.plan import Devices

    for bad in ({"gpu_memory_gib": float("inf")}, {"gpu_memory_gib": float("nan")}, {"kv_cache_gib": float("inf")}):
        with pytest.raises(ConfigError, match="finite gpu_memory > 0"):
            Devices(**{"gpus": 1, "gpu_memory_gib": 80.0, **bad})


def test_an_endpoint_for_no_model_of_the_run_stops_plan(tmp_path: Path, shared_data: Path):
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_qwen3_moe()))
    rows = _rows(tmp_path / "rows.yaml", {"Qwen3-8B zero-shot": f"dynamic-rubric:generator=vllm:{folder}"})
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(json.dumps({"models": {f"vllm:{folder}/": {"base_url": "http://localhost:8001/v1"}}}))
    line = _one_error(harness("plan", "table1", "--data-dir", str(shared_data), "--config", str(rows), "--endpoints",
                              str(endpoints), cwd=tmp_path, env=OFFLINE))
    assert f"{endpoints}: models.vllm:{folder}/: no model of this run" in line
    assert f"differs from vllm:{folder} by a trailing slash" in line and "the run's models: " in line
    endpoints.write_text(json.dumps({"models": {f"vllm:{folder}": {"base_url": "http://localhost:8001/v1",
                                                                    "concurrency": "lots"}}}))
    line = _one_error(harness("plan", "table1", "--data-dir", str(shared_data), "--config", str(rows), "--endpoints",
                              str(endpoints), cwd=tmp_path, env=OFFLINE))
    assert line == f"error: {endpoints}: models.vllm:{folder}.concurrency: Input should be a valid integer, got 'lots'"
    endpoints.write_text(json.dumps({"models": {f"vllm:{folder}": {"base_url": "http://localhost:8001/v1"}}}))
    served = harness("plan", "table1", "--data-dir", str(shared_data), "--config", str(rows), "--endpoints",
                     str(endpoints), cwd=tmp_path, env=OFFLINE)
    assert served.returncode == 0, served.stderr
    assert f"vllm:{folder} (served)" in served.stdout and "every model the rows call is served" in served.stdout


# Free memory, GPU UUIDs, training activations, vLLM's range for TRL.

SMI = ("0, GPU-aaaa1111-0000, 81559, 81000\n1, GPU-bbbb2222-0000, 81559, 30000\n"
       "2, GPU-cccc3333-0000, 81559, 81000\n")


def test_cuda_visible_devices_of_gpu_uuids_select_those_gpus_and_free_memory_bounds_the_budget():
    from harness.plan import devices_from_smi

    found = devices_from_smi(SMI, "GPU-cccc3333,GPU-aaaa")
    assert found is not None and found.gpus == 2 and round(found.free_gib, 1) == 79.1
    busy = devices_from_smi(SMI, "1")  # a server holds 50 GiB of GPU 1
    assert busy is not None and busy.gpus == 1
    assert busy.budget_gib == pytest.approx(30000 / 1024 * 0.92)
    assert devices_from_smi(SMI, None).gpus == 3  # type: ignore[union-attr]


def test_activations_follow_sequence_batch_and_checkpointing():
    from harness.plan import activation_gib

    config = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}
    full = activation_gib(config, batch=8, prompt_tokens=3072, completion_tokens=1024, checkpointing=False)
    ckpt = activation_gib(config, batch=8, prompt_tokens=3072, completion_tokens=1024, checkpointing=True)
    tokens = 8 * 4096
    logits = 8 * 1024 * 151936 * 10
    assert ckpt * 2**30 == pytest.approx(36 * tokens * 4096 * 2 + tokens * 4096 * 34 + logits)
    assert full * 2**30 == pytest.approx(36 * tokens * 4096 * 34 + logits)
    assert ckpt > 4.0  # the flat 4 GiB allowance was short at the generator-8b settings


def test_doctor_names_a_vllm_outside_trls_range():
    from harness.commands.doctor import check_trl_vllm

    assert check_trl_vllm("1.16.0", "0.31.0")[0]  # type: ignore[index]
    bad = check_trl_vllm("1.16.0", "0.32.0")
    assert bad is not None and not bad[0] and "0.22.0-0.31.0" in bad[2]
    assert check_trl_vllm(None, "0.32.0") is None
