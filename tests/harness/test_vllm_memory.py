"""`harness.vllm_memory`: the KV cache, profiling peak and engine numbers as vLLM computes them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from harness.errors import ConfigError
from harness.vllm_memory import (BLOCK_SIZE, GIB, context_length, engine_kwargs, engine_memory, kv_bytes_per_token,
                                 largest_tensor_parallel, page_bytes, sampler_peak_bytes, sequence_kv_bytes)
from harness.weights import attention_shape

QWEN3_8B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
QWEN3_32B = {**QWEN3_8B, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
             "num_attention_heads": 64}
GEMMA3 = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 640,
          "intermediate_size": 2048, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
          "head_dim": 256, "vocab_size": 262144, "sliding_window": 512,
          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}


def test_kv_bytes_a_token_is_layers_kv_heads_head_dim_k_and_v_dtype_over_tp():
    shape = attention_shape(QWEN3_8B)
    assert kv_bytes_per_token(shape, kv_dtype="bfloat16", tp=1) == 36 * 8 * 128 * 2 * 2  # 144 KiB
    assert kv_bytes_per_token(shape, kv_dtype="bfloat16", tp=8) == 36 * 1 * 128 * 2 * 2
    assert kv_bytes_per_token(shape, kv_dtype="bfloat16", tp=16) == 36 * 1 * 128 * 2 * 2  # replicated KV heads


def test_one_full_length_sequence_of_qwen3_8b_at_tp1_is_5_6_gib():
    shape = attention_shape(QWEN3_8B)
    one = sequence_kv_bytes(shape, kv_dtype="bfloat16", tp=1, max_model_len=40960)
    assert one == 36 * (40960 // BLOCK_SIZE) * page_bytes(shape, kv_dtype="bfloat16", tp=1)
    assert round(one / GIB, 2) == 5.62


def test_sliding_layers_hold_the_window_plus_a_batch_not_the_sequence():
    shape = attention_shape(GEMMA3)
    assert (shape.sliding_layers, shape.sliding_window) == (5, 512)
    page = page_bytes(shape, kv_dtype="bfloat16", tp=1)
    got = sequence_kv_bytes(shape, kv_dtype="bfloat16", tp=1, max_model_len=32768, max_num_batched_tokens=8192)
    assert got == (1 * 32768 // 16 + 5 * (math.ceil((511 + 8192) / 16) + 1)) * page


def test_the_sampler_peak_grows_with_max_num_seqs_over_the_vocabulary():
    shape = attention_shape(QWEN3_8B)
    assert 2.5 < sampler_peak_bytes(shape, max_num_seqs=1024) / GIB < 5  # vLLM's H100 default of 1024
    assert sampler_peak_bytes(shape, max_num_seqs=256) * 4 == sampler_peak_bytes(shape, max_num_seqs=1024)


def test_context_length_is_the_longest_prompt_plus_max_tokens_within_the_model_limit():
    assert context_length(3000, 1024) == 4024
    with pytest.raises(ConfigError, match="exceeds the model's 4096"):
        context_length(4000, 1024, model_limit=4096)


def test_the_engine_gets_at_least_one_sequence_and_the_flat_allowance_is_no_longer_the_whole_story():
    engine = engine_memory(QWEN3_8B, tp=1, max_model_len=40960, kv_cache_gib=4.0)
    assert engine.kv_cache_gib > 5.6  # one sequence + the null block, more than the 4 GiB allowance
    assert engine.profile_gib > 0.5 and engine.context_gib > 0
    kwargs = engine_kwargs(engine, 79.2)
    assert kwargs["max_model_len"] == 40960 and kwargs["max_num_seqs"] == 256
    assert kwargs["kv_cache_memory_bytes"] == int(engine.kv_cache_gib * GIB)
    assert kwargs["gpu_memory_utilization"] * 79.2 >= engine.per_device_gib - engine.context_gib


def test_qwen3_32b_does_not_fit_one_80_gb_card_at_full_length():
    engine = engine_memory(QWEN3_32B, tp=1, max_model_len=40960)
    assert engine.per_device_gib > 0.92 * 79.2


def test_tensor_parallelism_divides_the_heads():
    shape = attention_shape(QWEN3_8B)
    assert largest_tensor_parallel(shape, 6) == 4  # 32 heads: 6 does not divide
    assert largest_tensor_parallel(shape, 8) == 8
    odd = attention_shape({**QWEN3_8B, "num_attention_heads": 40, "num_key_value_heads": 10})
    assert largest_tensor_parallel(odd, 8) == 5  # 8 and 4 divide the 40 heads, not the 10 KV heads


# vLLM's own functions (the CPU build ships them): `make test-vllm`.

@pytest.mark.vllm
def test_page_size_and_max_memory_match_vllms_full_attention_spec():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    shape = attention_shape(QWEN3_8B)
    for tp in (1, 2, 8):
        spec = FullAttentionSpec(block_size=16, num_kv_heads=max(1, 8 // tp), head_size=128, dtype=torch.bfloat16)
        assert page_bytes(shape, kv_dtype="bfloat16", tp=tp) == spec.page_size_bytes
        config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=40960),
                                 parallel_config=SimpleNamespace(decode_context_parallel_size=1))
        assert sequence_kv_bytes(shape, kv_dtype="bfloat16", tp=tp, max_model_len=40960) == \
            36 * spec.max_memory_usage_bytes(config)
    gemma = attention_shape(GEMMA3)
    window = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=256, dtype=torch.bfloat16,
                               sliding_window=512)
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=32768), max_in_flight_tokens=8192,
                             parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    assert sequence_kv_bytes(gemma, kv_dtype="bfloat16", tp=1, max_model_len=32768, max_num_batched_tokens=8192) \
        == 5 * window.max_memory_usage_bytes(config) + full.max_memory_usage_bytes(config)


@pytest.mark.vllm
def test_vllms_h100_defaults_are_the_ones_the_plan_overrides(monkeypatch):
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext

    h100 = SimpleNamespace(get_device_total_memory=lambda: 80 * 2**30, get_device_name=lambda: "NVIDIA H100",
                           is_tpu=lambda: False, is_cpu=lambda: False)
    monkeypatch.setattr(arg_utils, "current_platform", h100)
    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    assert seqs[UsageContext.LLM_CLASS] == 1024 and tokens[UsageContext.LLM_CLASS] == 16384
    engine = engine_memory(QWEN3_8B, tp=1, max_model_len=8192, max_num_seqs=seqs[UsageContext.LLM_CLASS])
    assert engine.sampler_gib > 2.5  # what the defaults would cost: why the plan passes its own


@pytest.mark.vllm
def test_kv_heads_per_device_match_vllms_rule_and_engine_args_take_kv_cache_memory_bytes():
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from harness.vllm_memory import installed_takes_kv_bytes, kv_heads_per_device

    assert installed_takes_kv_bytes()
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(engine_kwargs(engine_memory(QWEN3_8B, tp=2, max_model_len=4096), 79.2)) <= names
    shape = attention_shape(QWEN3_8B)
    for tp in (1, 2, 4, 8, 16):
        assert kv_heads_per_device(shape, tp) == max(1, 8 // tp)
