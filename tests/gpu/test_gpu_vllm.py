"""`make gpu-smoke-vllm`, part 2: vLLM's CUDA engine with small real models from the Hub cache (Qwen/Qwen3-0.6B and
Qwen/Qwen3-1.7B; nothing downloads: `hf download` them first). Figures go to the same JSON as part 1.

- Two `vllm:` engines started at the same moment on one GPU with the plan's numbers take turns at the load gate,
  and each gets the KV cache the plan gave it (`kv_cache_memory_bytes`, read back as vLLM's block count).
- A released engine's memory comes back (free memory sampled until it does), and a third engine then starts
  with its planned cache.
- `harness serve` serves a generator, and `harness run` scores Table 1 cells through it.
- `harness train generator --max-steps 2` with TRL's colocated vLLM under ZeRO-3 (accelerate, one process), on
  sets of 8 responses of up to 2,048 tokens, the device's peak memory recorded against the plan.

Skipped with one line where vLLM, CUDA or a model is missing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="part 2 needs vLLM's CUDA build: make gpu-smoke-vllm installs it")

from gpu.test_gpu_smoke import _record  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

GIB = 2**30
SMALL, LARGER = "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"
KV_GIB = 2.0
"""The cache the plan gives each engine (`Devices.kv_cache_gib`)."""
MAX_MODEL_LEN = 4096
ROWS = "Qwen3-8B zero-shot"
"""A Table 1 row whose model the tests replace with the small one (`rows:` in a config)."""


def cached(repo: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss: not in the cache
        pytest.skip(f"part 2 needs {repo} in the Hub cache (hf download {repo})")


def planned(path: Path):
    """(BackendOptions, EngineMemory) of an engine for `path` on this GPU, as the plan makes them."""
    import torch

    from harness.backends.base import BackendOptions
    from harness.plan import Devices, vllm_engine
    from harness.vllm_memory import engine_kwargs, installed_takes_kv_bytes
    from harness.weights import read_config

    total = torch.cuda.mem_get_info()[1] / GIB
    devices = Devices(gpus=1, gpu_memory_gib=total, kv_cache_gib=KV_GIB)
    base = BackendOptions(dtype="bfloat16", max_model_len=MAX_MODEL_LEN, enforce_eager=True)
    memory = vllm_engine(read_config(path), base, 1, devices)
    kwargs = engine_kwargs(memory, total, takes_kv_bytes=installed_takes_kv_bytes())
    return dataclasses.replace(base, **kwargs), memory


def kv_gib(backend, path: Path) -> float:
    """The KV cache vLLM allocated: its block count (sent back by the engine core at startup) x a block's bytes
    over all layers."""
    from harness.vllm_memory import page_bytes
    from harness.weights import attention_shape, model_size, read_config

    cache = backend._llm.llm_engine.vllm_config.cache_config
    config = read_config(path)
    shape = attention_shape(config)
    block = page_bytes(shape, kv_dtype=model_size(config, dtype="bfloat16").dtype, tp=1, block_size=cache.block_size)
    return cache.num_gpu_blocks * shape.layers * block / GIB


def answers(backend) -> list[str]:
    from harness.backends.base import GenerateRequest, SamplingParams, user_chat

    out = asyncio.run(backend.generate([GenerateRequest(user_chat("Name a colour."),
                                                        SamplingParams(max_tokens=16))]))
    assert all(c.ok for c in out), [c.error for c in out]
    return [c.texts[0] for c in out]


@pytest.fixture(scope="module")
def engines():
    """Two engines on one GPU, started from two threads released at the same moment."""
    from harness.backends.gate import GATE
    from harness.backends.vllm_backend import VLLMBackend

    started = {}
    for repo in (SMALL, LARGER):
        path = cached(repo)
        options, memory = planned(path)
        started[repo] = (VLLMBackend(str(path), options), memory, path)
    barrier, failures = threading.Barrier(2), []

    def start(backend) -> None:
        barrier.wait()
        try:
            backend.load()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(b,)) for b, _, _ in started.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    specs = {f"vllm:{path}" for _, _, path in started.values()}
    yield started, [h for h in GATE.history if h[1] in specs]
    for backend, _, _ in started.values():
        asyncio.run(backend.close())


def test_two_engines_started_at_once_take_turns_at_the_gate_and_get_the_plans_cache(engines):
    started, history = engines
    first, second = history[0][1], history[2][1]
    assert history == [("start", first), ("end", first), ("start", second), ("end", second)], history
    figures = {}
    for repo, (backend, memory, path) in started.items():
        got = kv_gib(backend, path)
        figures[repo] = {"planned_kv_gib": memory.kv_cache_gib, "allocated_kv_gib": got,
                         "planned_per_device_gib": memory.per_device_gib, "engine": memory.describe(),
                         "answer": answers(backend)}
        assert abs(got - memory.kv_cache_gib) <= 0.05 * memory.kv_cache_gib + 0.05, (repo, got, memory)
    _record("vllm_two_engines", {"gate": history, **figures})


def test_a_released_engine_gives_its_memory_back_and_the_next_starts_with_its_plan(engines):
    import torch

    from harness.backends.gate import GATE, cuda_free_gib, wait_for_memory
    from harness.backends.vllm_backend import VLLMBackend

    started, _ = engines
    backend, memory, _ = started[LARGER]
    before = cuda_free_gib()
    t0, samples = time.monotonic(), []

    def read() -> dict[int, float]:
        free = cuda_free_gib()
        samples.append((round(time.monotonic() - t0, 2), round(free[0], 2)))
        return free

    asyncio.run(backend.release())
    need = {0: before[0] + 0.9 * (memory.per_device_gib - memory.context_gib)}
    asyncio.run(wait_for_memory(need, what=f"releasing vllm:{LARGER}", read_free=read))
    path = cached(LARGER)
    options, again = planned(path)
    third = VLLMBackend(str(path), options)
    third.load()
    got = kv_gib(third, path)
    _record("vllm_release", {"free_before_release_gib": before[0], "needed_gib": need[0],
                             "free_samples_s_gib": samples, "third_planned_kv_gib": again.kv_cache_gib,
                             "third_allocated_kv_gib": got, "device_total_gib": torch.cuda.mem_get_info()[1] / GIB,
                             "gate_last": GATE.history[-2:]})
    assert abs(got - again.kv_cache_gib) <= 0.05 * again.kv_cache_gib + 0.05
    assert answers(third)
    asyncio.run(third.close())


def _harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


def test_serve_a_generator_and_run_table1_through_it(tmp_path: Path, shared_data: Path):
    import yaml

    small = cached(SMALL)
    spec = f"vllm:{small}"
    config = tmp_path / "rows.yaml"
    config.write_text(yaml.safe_dump({"benchmarks": ["judgebench"], "only_rows": [ROWS],
                                      "rows": {ROWS: f"dynamic-rubric:generator={spec},verifier={spec}"}}))
    endpoints = tmp_path / "endpoints.yaml"
    common = ("--config", str(config), "--data-dir", str(shared_data), "--limit", "2", "--seeds", "1")
    server = subprocess.Popen(_harness("serve", "table1", *common, "--endpoints", str(endpoints), "--gpus", "1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    try:
        while not endpoints.exists():  # written once every server answers
            assert server.poll() is None, server.stdout.read()[-3000:]
            assert time.monotonic() - started < 900, "harness serve: no endpoints file within 900 s"
            time.sleep(1)
        ready_s = time.monotonic() - started
        done = subprocess.run(_harness("run", "table1", *common, "--endpoints", str(endpoints), "--out",
                                       str(tmp_path / "run")), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=120)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    _record("serve_then_run", {"serve_ready_s": ready_s, "run_summary": manifest.get("summary"),
                               "serve_exit": server.returncode})
    assert server.returncode == 0 and not endpoints.exists(), out[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results, "no results"


def test_generator_training_with_colocated_vllm_under_zero3(tmp_path: Path):
    pytest.importorskip("deepspeed", reason="ZeRO-3 needs deepspeed (make gpu-smoke-vllm installs it)")
    import torch
    from gpu.test_gpu_training import nectar_rows

    small = cached(SMALL)
    rows = nectar_rows(2, seed=1)
    for i, row in enumerate(rows):  # a prompt that asks for a long answer: sets of up to 2,048-token responses
        row["prompt"] = (f"\n\nHuman: Write a long, detailed essay (at least 1,500 words) on topic {i}: "
                         f"{row['answers'][0]['answer'][:200]}\n\nAssistant: ")
    data = tmp_path / "data" / "nectar"
    data.mkdir(parents=True)
    (data / "rlaif.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = f"hf:{small}"
    config = {"model": str(small), "output_dir": str(tmp_path / "gen"), "verifier": spec, "verify_mode": "per_item",
              "backend": {"dtype": "bfloat16"},
              "data": {"limit": 2, "sets": {"policy": spec, "set_size": 8, "max_tokens": 2048}},
              "grpo": {"num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 512,
                       "learning_rate": 1e-6, "epochs": 1, "bf16": True, "gradient_checkpointing": True,
                       "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
                       "report_to": [], "extra": {"chat_template_kwargs": {"enable_thinking": False}}}}
    path = tmp_path / "generator.yaml"
    path.write_text(json.dumps(config))
    lowest, stop = [torch.cuda.mem_get_info()[0] / GIB], threading.Event()
    total = torch.cuda.mem_get_info()[1] / GIB

    def sample() -> None:  # the device's least free memory while the job runs (another process's peak)
        while not stop.wait(0.5):
            lowest.append(torch.cuda.mem_get_info()[0] / GIB)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               "training/configs/accelerate-zero3.yaml", "--num_processes", "1", "-m", "harness", "train",
               "generator", "--config", str(path), "--data-dir", str(data.parent), "--max-steps", "2"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=540,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    finally:
        stop.set()
        sampler.join()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    from harness.config import backend_options
    from harness.plan import Devices
    from training.grpo import load_train_config
    from training.job import load, roles

    log = [json.loads(line) for line in (tmp_path / "gen" / "train_log.jsonl").read_text().splitlines()]
    job = load_train_config(path)
    plan = load("generator", job, backend_options(job.backend, where="backend"), {},
                Devices(gpus=1, gpu_memory_gib=total), processes=1)
    peak = total - min(lowest)
    _record("train_generator_colocated_zero3", {
        "device_peak_gib": peak, "device_total_gib": total, "loss_steps": sum("loss" in line for line in log),
        "planned_total_gib": plan.total_gib, "planned_activations_gib": plan.activations_gib,
        "planned_for": plan.activations_for, "roles": roles("generator", job)})
    assert sum("loss" in line for line in log) == 2
