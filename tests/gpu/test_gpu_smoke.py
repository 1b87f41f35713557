"""`make gpu-smoke`: memory the plan predicts against what CUDA shows, on tiny models built from configs here
(nothing downloads). Skipped without CUDA. Figures go to one JSON: `$HARNESS_GPU_SMOKE_JSON`, else
`runs/gpu-smoke.json`. Part 2 (vLLM's engine) is `tests/gpu/test_gpu_vllm.py`."""

from __future__ import annotations

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


# ------------------------------------------------------------------------------------------------------------
# Part 1, the `hf` backend: placement against the plan beside another allocation, its three paths in bf16, and
# its memory back after a release (`harness.backends.gate`, `harness.backends.local.hf_placement`).

GIB = 2**30
HF_SHAPE = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 8, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128}
"""About 0.4 B parameters (0.75 GiB in bf16): enough to read in `mem_get_info`, small enough to build in seconds.
The vocabulary is the test tokenizer's (a few hundred tokens), so every generated id decodes."""
OTHER_GIB = 4.0
"""The other allocation the model loads beside (what a neighbour engine would hold)."""


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A Qwen3-shaped random causal LM with the tests' byte-level tokenizer (llguidance reads it), saved in bf16."""
    import torch
    from tiny_models import CORPUS, tiny_tokenizer
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tmp_path_factory.mktemp("hf-smoke") / "model"
    tok = tiny_tokenizer(CORPUS, vocab_size=400, specials=["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"],
                         bos="<|im_start|>", byte_level=True)
    config = Qwen3Config(vocab_size=len(tok), max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=False,
                         initializer_range=0.3, **HF_SHAPE)
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 0.4 B parameters on the GPU takes a second, not a minute
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    del model
    torch.cuda.empty_cache()
    return path


def _visible_devices(free: dict[int, float]):
    """The plan's devices: nvidia-smi's reading (`harness.plan.detect_devices`), else torch's."""
    import torch

    from harness.plan import Devices, detect_devices

    found = detect_devices()
    if found is not None:
        return found, "nvidia-smi"
    total = min(torch.cuda.mem_get_info(d)[1] for d in free) / GIB
    return Devices(gpus=len(free), gpu_memory_gib=total, free_gib=min(free.values())), "torch"


def test_an_hf_model_loads_within_the_plans_share_beside_another_allocation_and_its_memory_comes_back(hf_model):
    import asyncio

    import torch

    from harness.backends.base import BackendOptions
    from harness.backends.gate import GATE, Engines, cuda_free_gib
    from harness.backends.local import even_max_memory
    from harness.plan import local_models
    from harness.pool import BackendPool

    other = torch.empty(int(OTHER_GIB * GIB), dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    free_before = cuda_free_gib()
    devices, read_by = _visible_devices(free_before)
    pool = BackendPool(options=BackendOptions(device="auto", dtype="bfloat16"))
    key = f"hf:{hf_model}"
    backend = pool.get(key)
    sized = local_models(pool, [key], devices)[key]
    inner = backend.backend
    inner.max_memory = even_max_memory(sized.devices, sized.per_device_gib)  # what the run's scheduler gives it
    engines = Engines()
    asyncio.run(engines.start([(key, inner.load)]))
    taken = engines.held[key]
    placed = dict(getattr(inner._lm, "hf_device_map", None) or {"": str(next(inner._lm.parameters()).device)})
    on_device = {d: torch.cuda.memory_allocated(d) / GIB for d in free_before}
    figures = {
        "devices_read_by": read_by, "gpus": devices.gpus, "plan_free_gib": devices.free_gib,
        "torch_free_gib": free_before, "other_allocation_gib": OTHER_GIB, "planned_weights_gib": sized.weights_gib,
        "planned_per_device_gib": sized.per_device_gib, "plan_budget_gib": devices.budget_gib,
        "max_memory": inner.max_memory, "device_map": sorted({str(v) for v in placed.values()}),
        "taken_gib": taken, "allocated_gib": on_device, "gate": GATE.history[-2:],
    }
    _record("hf_placement", figures)
    assert GATE.history[-2:] == [("start", key), ("end", key)]
    assert not {str(v) for v in placed.values()} & {"cpu", "disk", "meta"}
    if read_by == "nvidia-smi":  # the plan sees the other allocation: its free memory agrees with CUDA's
        assert abs(devices.free_gib - min(free_before.values())) < 0.5
    assert sized.per_device_gib <= devices.budget_gib
    assert all(g <= sized.per_device_gib for g in taken.values())  # no device holds more than its share
    assert abs(sum(taken.values()) - sized.weights_gib) <= 0.1 * sized.weights_gib + 0.25
    if torch.cuda.device_count() > 1:  # spread over the GPUs (`balanced`), not all on GPU 0
        assert len({str(v) for v in placed.values()}) > 1

    asyncio.run(engines.release([key], pool.release))  # waits until the memory is back, or raises MemoryNotBack
    free_after = cuda_free_gib()
    _record("hf_release", {"free_before_load_gib": free_before, "free_after_release_gib": free_after,
                           "resident": inner.resident})
    assert not inner.resident
    assert all(free_after[d] >= free_before[d] - 0.25 for d in free_before)
    del other
    asyncio.run(pool.close())


def test_the_hf_backend_generates_scores_and_constrains_in_bf16_on_cuda(hf_model):
    import asyncio
    import math
    import re
    import time

    import torch

    from harness.backends.base import BackendOptions, Constraint, GenerateRequest, LogprobRequest, SamplingParams, \
        user_chat
    from harness.backends.hf import HFBackend

    backend = HFBackend(str(hf_model), BackendOptions(device="auto", dtype="bfloat16", batch_size=8))
    backend.load()
    weights = next(backend._lm.parameters())
    assert weights.is_cuda and weights.dtype == torch.bfloat16
    choice, regex = Constraint.choice(["yes", "no"]), Constraint.regex(r"[0-9]{2}-[a-c]{3}")
    schema = Constraint.json_schema({"type": "object", "properties": {"weight": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 5}},
                                     "required": ["weight"], "additionalProperties": False})
    requests = [GenerateRequest(user_chat("Hello there"), SamplingParams(max_tokens=32)),
                GenerateRequest(user_chat("Tell me"), SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=32,
                                                                     logprobs=3))]
    constrained = [GenerateRequest(user_chat("q"), SamplingParams(max_tokens=128, temperature=1.0, seed=s,
                                                                  constraint=c))
                   for s in range(4) for c in (choice, regex, schema)]
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    out = asyncio.run(backend.generate(requests + constrained))
    generated_s = time.perf_counter() - started
    logprob_requests = [LogprobRequest(user_chat("Is the answer Yes or No?")),
                        LogprobRequest(user_chat("Yes or No?"), branches=(" One.", " Two.", " Three."))]
    scored = asyncio.run(backend.next_token_logprobs(logprob_requests, ["Yes", "No"]))
    peak = torch.cuda.max_memory_allocated() / GIB
    asyncio.run(backend.close())

    assert all(c.ok for c in out), [c.error for c in out if not c.ok]
    plain, sampled = out[0], out[1]
    assert len(plain.texts) == 1 and len(sampled.texts) == 4 and plain.usage.completion_tokens > 0
    assert all(math.isfinite(t.logprob) and t.logprob <= 0 for sample in sampled.logprobs for t in sample)
    texts = [c.texts[0] for c in out[2:]]
    assert set(texts[0::3]) <= {"yes", "no"}
    assert all(re.fullmatch(r"[0-9]{2}-[a-c]{3}", t) for t in texts[1::3]), texts[1::3]
    assert all(1 <= json.loads(t)["weight"] <= 5 for t in texts[2::3]), texts[2::3]
    assert all(r.ok for r in scored), [r.error for r in scored]
    single, branched = scored
    probs = [math.exp(v) for v in single.logprobs.values()]
    assert all(0 < p <= 1 for p in probs) and sum(probs) <= 1 + 1e-3
    assert len(branched.branches) == 3 and all(math.isfinite(v) for b in branched.branches for v in b.values())
    _record("hf_paths_bf16", {"generate_s": generated_s, "peak_allocated_gib": peak,
                              "constrained": texts, "logprobs": single.logprobs})
