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


def test_the_paper_preset_on_one_8_gpu_node(tmp_path: Path, node: dict[str, str]):
    done = harness("plan", "table1", "--preset", "paper", "--gpus", "8", "--gpu-memory", "80", cwd=tmp_path, env=node)
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
    done = harness("plan", "table1", "--preset", "paper", "--gpus", "1", "--gpu-memory", "80", cwd=tmp_path, env=node)
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
    assert "served: vllm:Qwen/Qwen3-30B-A3B" in fits.stdout and "fits: 48.3 of 73.6 GiB per GPU" in fits.stdout
    # The verifier loaded in every process instead of served: counted, and the job no longer fits.
    local = tmp_path / "local-verifier.yaml"
    text = (configs / "generator-8b.yaml").read_text()
    local.write_text(text[: text.index("models:")])
    refused = harness("plan", "--train", "generator", "--config", str(local), "--gpus", "6", "--gpu-memory", "80",
                      cwd=tmp_path, env=node)
    assert refused.returncode == 2
    assert "verifier vllm:Qwen/Qwen3-30B-A3B 60.9" in refused.stderr and "ways out: serve the frozen models" \
        in refused.stderr
