"""Each local vLLM engine starts with the plan's numbers: `max_model_len` the run's longest request of it (never
the model's own limit), and, with devices, `max_num_seqs`, `max_num_batched_tokens`, `kv_cache_memory_bytes` and
`gpu_memory_utilization` as `harness.vllm_memory` computes them; `harness plan` prints each of them.

The engine class is replaced by one that records its keyword arguments (a stand-in `vllm` module here; vLLM's own
`LLM` under `make test-vllm`, where the arguments are also built into vLLM's config and its one-sequence check).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_models import build_tiny_lm

from harness.backends.base import BackendOptions
from harness.contexts import (PART_TOKENS, TEMPLATE_TOKENS, Ask, TokenCounter, fit_contexts, longest_tokens,
                              utf8_bytes)
from harness.plan import Devices, local_models, place, placements, plan_phases
from harness.vllm_memory import GIB, engine_kwargs, engine_memory, kv_bytes_per_token
from harness.weights import attention_shape

NUMBERS = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
           "max_num_batched_tokens", "kv_cache_memory_bytes")
ENGINE_ARGS = ("model", "enable_prefix_caching", "tensor_parallel_size", "gpu_memory_utilization", "dtype",
               "max_logprobs", "enforce_eager", "revision", "max_model_len", "max_num_seqs", "max_num_batched_tokens")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
ROW = "Qwen3-8B zero-shot"
"""A row of table1, given another evaluator by the config."""


class Started(Exception):
    """Raised by the recording engine once it has the arguments: nothing else of an engine is needed."""


def recording_vllm(monkeypatch: pytest.MonkeyPatch, *, takes_kv_bytes: bool = True) -> list[dict]:
    """A stand-in `vllm` module on a CUDA platform whose `LLM` records its keyword arguments and stops."""
    seen: list[dict] = []

    class LLM:
        def __init__(self, **kwargs):
            seen.append(kwargs)
            raise Started

    names = ENGINE_ARGS + (("kv_cache_memory_bytes",) if takes_kv_bytes else ())
    module = types.ModuleType("vllm")
    module.__version__ = "0.32.0"  # type: ignore[attr-defined]
    module.LLM = LLM  # type: ignore[attr-defined]
    module.EngineArgs = dataclasses.make_dataclass("EngineArgs", [(n, object, None) for n in names])  # type: ignore
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(device_type="cuda")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    return seen


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose own limit is Qwen3's 40,960 tokens (head_dim 32: vLLM's CPU attention takes it)."""
    return build_tiny_lm(tmp_path_factory.mktemp("engine-args") / "model", head_dim=32, context=40960)


def placed_pool(tiny: Path, *, max_model_len: int, options: BackendOptions | None = None):
    """A pool holding `vllm:tiny`, given `max_model_len` and placed on one 80 GiB device as the runner places it."""
    from harness.pool import BackendPool

    pool, key = BackendPool(options=options), f"vllm:{tiny}"
    pool.get(key)
    inner = pool.backend(key).backend
    inner.options = dataclasses.replace(inner.options, max_model_len=max_model_len)
    devices = Devices(gpus=1, gpu_memory_gib=80.0)
    models = local_models(pool, [key], devices)
    place(pool, placements(plan_phases([frozenset({key})], models, devices), models, devices))
    return pool, key, models[key]


def test_an_engine_starts_with_the_plans_numbers(tiny: Path, monkeypatch: pytest.MonkeyPatch):
    pool, key, sized = placed_pool(tiny, max_model_len=3000)
    seen = recording_vllm(monkeypatch)
    with pytest.raises(Started):
        pool.backend(key).backend.load()
    (got,) = seen
    planned = engine_kwargs(sized.engine, 80.0)
    assert {n: got[n] for n in NUMBERS} == {n: planned[n] for n in NUMBERS}
    # The same numbers computed here from the config, not read back from the plan.
    config = json.loads((tiny / "config.json").read_text())
    memory = engine_memory(config, tp=1, max_model_len=3000, kv_cache_gib=4.0)
    assert (got["max_model_len"], got["max_num_seqs"], got["max_num_batched_tokens"]) == (3000, 256, 8192)
    assert got["kv_cache_memory_bytes"] == int(memory.kv_cache_gib * GIB) == int(4.0 * GIB)  # the 4 GiB floor
    assert got["gpu_memory_utilization"] == memory.gpu_memory_utilization(80.0) < 0.2
    assert got["tensor_parallel_size"] == 1 and got["model"] == str(tiny)


def test_a_vllm_without_kv_cache_memory_bytes_gets_the_rest(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture):
    pool, key, _ = placed_pool(tiny, max_model_len=3000)
    seen = recording_vllm(monkeypatch, takes_kv_bytes=False)
    with pytest.raises(Started):
        pool.backend(key).backend.load()
    assert "kv_cache_memory_bytes" not in seen[0] and seen[0]["max_num_seqs"] == 256
    assert "this vLLM takes no kv_cache_memory_bytes" in caplog.text


def test_without_devices_only_max_model_len_is_set(tiny: Path, monkeypatch: pytest.MonkeyPatch):
    """A CPU run: no placement, so vLLM keeps its own batch sizes and profiles its cache; the context is fitted."""
    from harness.pool import BackendPool

    pool = BackendPool()
    key = f"vllm:{tiny}"
    pool.get(key)
    fit_contexts(pool, {key: [Ask([("x" * 100,)], 0, 50)]}, counter=lambda backend: utf8_bytes())
    seen = recording_vllm(monkeypatch)
    with pytest.raises(Started):
        pool.backend(key).backend.load()
    assert seen[0]["max_model_len"] == 100 + PART_TOKENS + TEMPLATE_TOKENS + 2 * 50
    assert not {"max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes"} & set(seen[0])


# --- the run's longest request -----------------------------------------------------------------------------------


def _schedule(tiny: Path, shared_data: Path, *, options: BackendOptions | None = None, devices: Devices | None = None):
    """The runner's schedule of a pairwise-judge row on `vllm:tiny` over three UltraFeedback items."""
    from harness.commands.runner import Prepared, RunPlan, _load_one, build_models, schedule_rows
    from harness.pool import BackendPool

    plan = RunPlan(rows={"R": f"pairwise-judge:model=vllm:{tiny}"}, benchmarks=("ultrafeedback",), seeds=1,
                   limit=3, data_dir=shared_data, devices=devices)
    pool, ready = BackendPool(options=options), Prepared()
    ready.items["ultrafeedback"] = _load_one("ultrafeedback", plan)
    build_models(plan, pool, ready)
    return schedule_rows(plan, ready, pool), pool, ready.items["ultrafeedback"]


def test_the_runner_gives_an_engine_the_runs_longest_request(tiny: Path, shared_data: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    scheduled, pool, items = _schedule(tiny, shared_data)
    key = f"vllm:{tiny}"
    context = scheduled.contexts[key]
    tok = AutoTokenizer.from_pretrained(tiny)
    longest = max(sum(len(tok(t, add_special_tokens=False)["input_ids"]) + PART_TOKENS
                      for t in (item.prompt, *item.responses)) for item in items)
    judge_budget = 512  # pairwise-judge's max_tokens; a re-ask quotes the first answer once more
    assert (context.prompt_tokens, context.max_tokens) == (longest + TEMPLATE_TOKENS + judge_budget, judge_budget)
    assert pool.backend(key).backend.options.max_model_len == context.max_model_len == longest + TEMPLATE_TOKENS + 1024
    assert context.max_model_len < 40960 and context.model_limit is None
    assert context.counted_with == f"{tiny}'s tokenizer"
    assert scheduled.to_json()["contexts"][key]["max_model_len"] == context.max_model_len  # into the manifest


def test_a_set_max_model_len_is_kept_and_the_models_limit_bounds_the_fit(tmp_path: Path, tiny: Path,
                                                                          shared_data: Path):
    scheduled, pool, _ = _schedule(tiny, shared_data, options=BackendOptions(max_model_len=777))
    assert scheduled.contexts == {} and pool.backend(f"vllm:{tiny}").backend.options.max_model_len == 777
    short = build_tiny_lm(tmp_path / "short", head_dim=32, context=256)
    scheduled, pool, _ = _schedule(short, shared_data)
    context = scheduled.contexts[f"vllm:{short}"]
    assert context.max_model_len == 256 == context.model_limit and context.prompt_tokens > 256
    assert "held to the model's limit of 256" in context.describe()


def test_the_longest_count_reads_only_what_can_still_be_longest():
    """Tokens never exceed UTF-8 bytes (+1), so items whose bytes cannot reach the best count are never encoded;
    the answer is the one a full count gives."""
    import random

    rng = random.Random(0)
    items = [tuple(" ".join("w" * rng.randint(1, 9) for _ in range(rng.randint(1, 300))) for _ in range(3))
             for _ in range(2000)]
    encoded: list[str] = []

    def words(texts):
        encoded.extend(texts)
        return [len(t.split()) for t in texts]

    got = longest_tokens(items, TokenCounter("words", words), per_part=PART_TOKENS)
    assert got == max(sum(len(t.split()) + PART_TOKENS for t in parts) for parts in items)
    assert len(encoded) < 3 * len(items)
    with_bytes = longest_tokens(items, TokenCounter("bytes", lambda ts: [len(t.encode()) for t in ts]))
    assert with_bytes == max(sum(len(t.encode()) for t in parts) for parts in items)


def test_a_policy_tables_judge_reads_the_answer_and_the_items_meta():
    from harness.contexts import policy_asks

    item = SimpleNamespace(messages=(SimpleNamespace(content="question"),),
                           meta={"uid": "u1", "baseline_answer": "b" * 40, "checklist": ["c1", "c2"]})
    policy, judge = policy_asks([item], max_tokens=300, judge_max_tokens=100)
    assert (policy.texts, policy.quoted, policy.max_tokens, policy.reask) == ([("question",)], 0, 300, False)
    assert judge is not None and judge.texts == [("question", "u1", "b" * 40, "['c1', 'c2']")]
    assert (judge.quoted, judge.max_tokens, judge.reask) == (300, 100, True)


# --- harness plan prints every number --------------------------------------------------------------------------


def test_plan_prints_the_numbers_each_engine_starts_with(tmp_path: Path, tiny: Path, shared_data: Path):
    import yaml

    config = tmp_path / "rows.yaml"
    config.write_text(yaml.safe_dump({"rows": {ROW: f"pairwise-judge:model=vllm:{tiny}"}, "only_rows": [ROW],
                                      "benchmarks": ["ultrafeedback"]}))
    done = subprocess.run([sys.executable, "-m", "harness", "plan", "table1", "--config", str(config), "--gpus", "1",
                           "--gpu-memory", "80", "--limit", "3", "--seeds", "1", "--data-dir", str(shared_data)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, **OFFLINE, "PYTHONPATH": str(Path.cwd())})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    line = next(line for line in out.splitlines() if "the run's longest request" in line)
    length = int(line.split("max_model_len ")[1].split(":")[0])
    assert f"+ 512 completion tokens (texts counted with {tiny}'s tokenizer" in line
    memory = engine_memory(json.loads((tiny / "config.json").read_text()), tp=1, max_model_len=length,
                           kv_cache_gib=4.0)
    kv = int(memory.kv_cache_gib * GIB)
    assert (f"vllm:{tiny} starts with tensor_parallel_size 1, gpu_memory_utilization "
            f"{memory.gpu_memory_utilization(80.0)}, max_model_len {length}, max_num_seqs 256, max_num_batched_tokens "
            f"8192, kv_cache_memory_bytes {kv} ({kv / GIB:.2f} GiB)") in out
    per_token = kv_bytes_per_token(attention_shape(json.loads((tiny / "config.json").read_text())), kv_dtype="float32",
                                   tp=1)
    assert f"vLLM engine: max_model_len {length}, max_num_seqs 256, max_num_batched_tokens 8192;" in out
    assert f"KV cache {memory.kv_cache_gib:.2f} ({per_token / 1024:.0f} KiB a token" in out


# --- vLLM's own engine arguments and checks (`make test-vllm`) ---------------------------------------------------


@pytest.mark.vllm
def test_vllm_builds_its_config_from_the_plans_numbers_and_its_one_sequence_check_holds(
        tiny: Path, monkeypatch: pytest.MonkeyPatch):
    import torch
    import vllm
    from vllm.v1.attention.backends.utils import record_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import check_enough_kv_cache_memory
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    pool, key, sized = placed_pool(tiny, max_model_len=3000, options=BackendOptions(dtype="float32"))
    seen: list[dict] = []

    class Recording:
        def __init__(self, **kwargs):
            seen.append(kwargs)
            raise Started

    monkeypatch.setattr(vllm, "LLM", Recording)
    # `make test-vllm` sets vLLM's CPU cache size for the engines it starts; on a GPU it is not read.
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with pytest.raises(Started):
        pool.backend(key).backend.load()
    (got,) = seen
    planned = engine_kwargs(sized.engine, 80.0)
    assert {n: got[n] for n in NUMBERS} == {n: planned[n] for n in NUMBERS}
    config = vllm.EngineArgs(**got).create_engine_config()  # every name is one vLLM takes, every value accepted
    assert config.model_config.max_model_len == 3000
    assert (config.scheduler_config.max_num_seqs, config.scheduler_config.max_num_batched_tokens) == (256, 8192)
    assert config.cache_config.kv_cache_memory_bytes == planned["kv_cache_memory_bytes"]
    # vLLM's start-up check: the cache the plan gives holds one max_model_len sequence (CUDA's 16-token pages);
    # the plan's floor for it is exact: one byte less is refused.
    record_kv_cache_layout(config.cache_config, "NHD")
    shape = attention_shape(json.loads((tiny / "config.json").read_text()))
    spec = {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(block_size=16, num_kv_heads=shape.kv_heads,
                                                                   head_size=shape.head_dim, dtype=torch.float32)
            for i in range(shape.layers)}
    floor = engine_memory(json.loads((tiny / "config.json").read_text()), tp=1, max_model_len=3000)
    check_enough_kv_cache_memory(config, spec, floor.kv_cache_memory_bytes)
    with pytest.raises(ValueError, match="max seq len"):
        check_enough_kv_cache_memory(config, spec, floor.kv_cache_memory_bytes - 1)
    check_enough_kv_cache_memory(config, spec, got["kv_cache_memory_bytes"])
