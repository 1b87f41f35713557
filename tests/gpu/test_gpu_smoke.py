"""`make gpu-smoke`: memory the plan predicts against what CUDA shows, on tiny models built from configs here
(nothing downloads). Skipped without CUDA. Figures go to one JSON: `$HARNESS_GPU_SMOKE_JSON`, else
`runs/gpu-smoke.json`. Part 2 (vLLM's engine) skips where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CONFIG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024,
          "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 64, "vocab_size": 151936, "max_position_embeddings": 4096, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
FIGURES: dict[str, object] = {}


def _record(name: str, value: object) -> None:
    FIGURES[name] = value
    out = Path(os.environ.get("HARNESS_GPU_SMOKE_JSON", "runs/gpu-smoke.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(FIGURES, indent=2))


def test_a_model_loads_at_its_planned_size_and_its_memory_comes_back():
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from harness.weights import model_size

    torch.cuda.empty_cache()
    free_before, _ = torch.cuda.mem_get_info()
    model = AutoModelForCausalLM.from_config(Qwen3Config(**CONFIG), dtype=torch.bfloat16).to("cuda")
    taken = torch.cuda.memory_allocated()
    planned = model_size(CONFIG).weight_bytes
    _record("weights", {"planned_bytes": planned, "allocated_bytes": taken})
    assert abs(taken - planned) < 0.02 * planned
    del model
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    _record("release", {"free_before": free_before, "free_after": free_after})
    assert free_after >= free_before - 64 * 2**20


def test_training_activations_stay_under_the_plans_estimate():
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from harness.plan import activation_gib

    model = AutoModelForCausalLM.from_config(Qwen3Config(**CONFIG), dtype=torch.bfloat16).to("cuda")
    model.gradient_checkpointing_enable()
    batch, prompt, completion = 4, 768, 256
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, prompt + completion), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logits = model(ids).logits[:, -completion:].float()
    logits.log_softmax(-1).mean().backward()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    planned = activation_gib(CONFIG, batch=batch, prompt_tokens=prompt, completion_tokens=completion,
                             checkpointing=True)
    _record("activations", {"peak_gib": peak, "planned_gib": planned})
    assert peak <= planned * 1.5


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="part 2 needs vLLM's CUDA build (.[vllm])")
def test_vllm_engine_memory_matches_the_plan():
    pytest.skip("part 2 (vLLM engine started with engine_kwargs, its KV cache and peak read back) is not written")
