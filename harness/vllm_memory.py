"""What a vLLM engine takes of each device, computed as vLLM 0.32 computes it, before any engine starts.

An engine's share of a device is five terms (`EngineMemory`), each following vLLM's own code (paths under
`vllm/`; the CUDA worker ships as Python in the CPU build too):

- **Weights**: parameters x dtype bytes / tensor_parallel_size (`harness.weights`).
- **KV cache**: `kv_bytes_per_token` = layers x KV heads per device x head dim x 2 (K and V) x dtype bytes. KV
  heads per device are `max(1, kv_heads // tp)` (`config/model.py:1650-1670`, `get_num_kv_heads`: replicated
  when TP exceeds them); a page is `block_size` tokens of that (`v1/kv_cache_interface.py:543-560`,
  `AttentionSpec.page_size_bytes`), and one sequence of `max_model_len` takes `cdiv(max_model_len, block_size)`
  pages of a full-attention layer (`:602-607`, `FullAttentionSpec.max_memory_usage_bytes`) and
  `cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1` of a sliding-window layer
  (`:862-896`, `SlidingWindowSpec`). vLLM refuses to start when the cache cannot hold one such sequence
  (`v1/core/kv_cache_utils.py:1104-1137`, `check_enough_kv_cache_memory`, which first holds back BlockPool's
  null block). The plan gives the cache `max(kv_cache_gib, one sequence + one block)` and passes it as
  `kv_cache_memory_bytes` (`v1/worker/gpu_worker.py:649-675`: the profile is then not taken from the budget).
- **Profiling peak**: `profile_run` (`v1/worker/gpu_model_runner.py:6133`) runs one forward over
  `max_num_batched_tokens` tokens, then the sampler over `max_num_seqs` rows of the whole vocabulary
  (`_dummy_sampler_run`, `:5927-5995`): logits in the model dtype, cast to float32 (`v1/sample/sampler.py:96-97`),
  sorted with int64 indices and soft-maxed for top-k/top-p (`v1/sample/ops/topk_topp_sampler.py:494-514`), then
  a second pass with a generator (probabilities and exponential noise, `:333-341`): `SAMPLER_BYTES_PER_LOGIT`.
  The forward's transient tensors per token: `FORWARD_WIDTHS` x hidden, the q/k/v projections and the gated MLP
  (gate and up, and their product) over the device's share of the heads and of the MLP width, in the model
  dtype. Both scale with what the plan passes: `max_num_seqs` (default `MAX_NUM_SEQS`) and
  `max_num_batched_tokens` (`MAX_NUM_BATCHED_TOKENS`), never vLLM's own defaults for an H100/H200 (1024 and
  16384 offline, `engine/arg_utils.py:2933-2941`, `get_batch_defaults`).
- **CUDA graphs**: captured graphs' memory is profiled and charged to the budget by default
  (`v1/worker/gpu_worker.py:700-743`; `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`, `envs.py:2221`, default 1);
  it cannot be computed from a config, so the plan holds `CUDA_GRAPH_GIB` for it (none under `enforce_eager`).
- **CUDA context**: the context and, with tensor parallelism, NCCL's buffers exist before vLLM's memory
  snapshot (`v1/worker/gpu_worker.py:524-537`) and so lie outside `gpu_memory_utilization` x total
  (`v1/worker/utils.py:716-771`, `request_memory`): `CUDA_CONTEXT_GIB` and `NCCL_GIB` per engine process and
  device. `gpu_memory_utilization` is the share less this term.

`max_model_len` is the longest request the run makes: its longest prompt plus its `max_tokens`
(`context_length`), never the model's own 40,960 (Qwen3) default. Where the plan's caller does not know the
longest prompt, it takes `DEFAULT_PROMPT_TOKENS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError
from harness.weights import AttentionShape, attention_shape, dtype_bytes, model_size

GIB = 2**30
BLOCK_SIZE = 16
"""Tokens a KV-cache page holds: the CUDA attention backends' block size (`config/cache.py:74` sets it late)."""
MAX_NUM_SEQS = 256
"""`max_num_seqs` the plan passes (vLLM's default on an H100/H200 is 1024)."""
MAX_NUM_BATCHED_TOKENS = 8192
"""`max_num_batched_tokens` the plan passes (vLLM's offline default on an H100/H200 is 16384)."""
SAMPLER_BYTES_PER_LOGIT = 23
"""Bytes a logit takes at the sampler warm-up's peak: model-dtype logits (2), their float32 copy (4), the sorted
copy (4) and its int64 indices (8), softmax probabilities (4) and a boolean mask (1)."""
FORWARD_WIDTHS = 4
"""Hidden-wide tensors a token holds at once in the forward (residual, normed input, attention and MLP output)."""
CUDA_GRAPH_GIB = 1.0
"""Captured CUDA graphs' pool (vLLM profiles it; 0.5-1 GiB for 8B-32B models at 67 capture sizes)."""
CUDA_CONTEXT_GIB = 0.6
"""The CUDA context and cuBLAS workspaces of one engine process on one device."""
NCCL_GIB = 0.4
"""NCCL's communicator buffers of one process on one device, with tensor parallelism."""
DEFAULT_PROMPT_TOKENS = 8192
"""The longest prompt assumed where the plan's caller does not know the run's."""
DEFAULT_MAX_TOKENS = 2048
"""The completion budget assumed where the plan's caller does not know the run's."""


def context_length(longest_prompt: int, max_tokens: int, *, model_limit: int | None = None) -> int:
    """`max_model_len` for a run: its longest prompt plus its `max_tokens`.

    Raises:
        ConfigError: a count below 1, or a sum past the model's own limit (vLLM refuses it at start).
    """
    if longest_prompt < 1 or max_tokens < 1:
        raise ConfigError(f"context length: prompt {longest_prompt} and max_tokens {max_tokens} must be >= 1")
    need = longest_prompt + max_tokens
    if model_limit is not None and need > model_limit:
        raise ConfigError(f"the longest request ({longest_prompt} prompt + {max_tokens} completion tokens = {need}) "
                          f"exceeds the model's {model_limit}; lower max_tokens or the prompts' length")
    return need


def model_limit(config: Mapping[str, Any]) -> int | None:
    """The model's own context limit (`max_position_embeddings`), or None."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    limit = text.get("max_position_embeddings")  # type: ignore[union-attr]
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def kv_heads_per_device(shape: AttentionShape, tp: int) -> int:
    """`ModelConfig.get_num_kv_heads` (`config/model.py:1670`): replicated where TP exceeds them."""
    return max(1, shape.kv_heads // tp)


def page_bytes(shape: AttentionShape, *, kv_dtype: str, tp: int, block_size: int = BLOCK_SIZE) -> int:
    """One layer's KV page on one device (`AttentionSpec.page_size_bytes`, K and V of `block_size` tokens)."""
    return int(block_size * kv_heads_per_device(shape, tp) * 2 * shape.head_dim * dtype_bytes(kv_dtype))


def kv_bytes_per_token(shape: AttentionShape, *, kv_dtype: str, tp: int) -> int:
    """Every layer's K and V of one token on one device."""
    return shape.layers * page_bytes(shape, kv_dtype=kv_dtype, tp=tp, block_size=1)


def sequence_kv_bytes(shape: AttentionShape, *, kv_dtype: str, tp: int, max_model_len: int,
                      max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, block_size: int = BLOCK_SIZE) -> int:
    """What one `max_model_len` sequence takes of a device's cache: full layers' pages for the whole sequence,
    sliding layers' for the window plus a batch (`FullAttentionSpec` / `SlidingWindowSpec.max_memory_usage_bytes`)."""
    page = page_bytes(shape, kv_dtype=kv_dtype, tp=tp, block_size=block_size)
    full = shape.layers - shape.sliding_layers
    blocks = full * math.ceil(max_model_len / block_size)
    if shape.sliding_layers:
        held = min(shape.sliding_window - 1 + max_num_batched_tokens, max_model_len)  # type: ignore[operator]
        blocks += shape.sliding_layers * (math.ceil(held / block_size) + 1)
    return blocks * page


def sampler_peak_bytes(shape: AttentionShape, *, max_num_seqs: int) -> int:
    """The sampler warm-up's peak: `max_num_seqs` rows over the whole vocabulary."""
    return max_num_seqs * shape.vocab * SAMPLER_BYTES_PER_LOGIT


def forward_peak_bytes(shape: AttentionShape, *, dtype: str, tp: int, max_num_batched_tokens: int) -> int:
    """The profiling forward's transient tensors over `max_num_batched_tokens` tokens on one device."""
    qkv = (shape.heads + 2 * kv_heads_per_device(shape, 1)) * shape.head_dim / tp
    width = FORWARD_WIDTHS * shape.hidden + qkv + 3 * shape.intermediate / tp
    return int(max_num_batched_tokens * width * dtype_bytes(dtype))


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """What one vLLM engine takes of each of its devices, and the numbers it is started with."""

    tensor_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    weights_gib: float
    """Its share of the weights."""
    kv_per_token_bytes: int
    sequence_gib: float
    """One `max_model_len` sequence's cache."""
    kv_cache_gib: float
    """The cache it is given (`kv_cache_memory_bytes`): at least one sequence."""
    forward_gib: float
    sampler_gib: float
    cuda_graph_gib: float
    context_gib: float
    """CUDA context and NCCL buffers: outside `gpu_memory_utilization`."""

    @property
    def profile_gib(self) -> float:
        """The profiling peak beside weights and cache (forward and sampler)."""
        return self.forward_gib + self.sampler_gib

    @property
    def per_device_gib(self) -> float:
        """Everything it takes of one device."""
        return self.weights_gib + self.kv_cache_gib + self.profile_gib + self.cuda_graph_gib + self.context_gib

    @property
    def kv_cache_memory_bytes(self) -> int:
        return int(self.kv_cache_gib * GIB)

    def gpu_memory_utilization(self, device_gib: float) -> float:
        """The share of a device's total memory to request (`request_memory`): all but the context, rounded up."""
        return math.ceil((self.per_device_gib - self.context_gib) / device_gib * 1e4) / 1e4

    def describe(self) -> str:
        """One line of the terms, as `harness plan` prints them."""
        return (f"max_model_len {self.max_model_len}, max_num_seqs {self.max_num_seqs}, max_num_batched_tokens "
                f"{self.max_num_batched_tokens}; per device: weights {self.weights_gib:.1f}, KV cache "
                f"{self.kv_cache_gib:.2f} ({self.kv_per_token_bytes / 1024:.0f} KiB a token, one sequence "
                f"{self.sequence_gib:.2f}), profiling peak {self.profile_gib:.2f} (forward {self.forward_gib:.2f}, "
                f"sampler {self.sampler_gib:.2f}), CUDA graphs {self.cuda_graph_gib:.1f}, CUDA context "
                f"{self.context_gib:.1f} = {self.per_device_gib:.1f} GiB")


def engine_memory(config: Mapping[str, Any], *, tp: int, max_model_len: int, dtype: str | None = None,
                  kv_cache_gib: float = 0.0, enforce_eager: bool = False, max_num_seqs: int = MAX_NUM_SEQS,
                  max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS) -> EngineMemory:
    """One engine's memory per device (module docstring) for a `config.json`, at tensor parallelism `tp`.

    Raises:
        ConfigError: a config that cannot be read or counted.
    """
    size = model_size(config, dtype=dtype)
    shape = attention_shape(config)
    sequence = sequence_kv_bytes(shape, kv_dtype=size.dtype, tp=tp, max_model_len=max_model_len,
                                 max_num_batched_tokens=max_num_batched_tokens)
    floor = (sequence + shape.layers * page_bytes(shape, kv_dtype=size.dtype, tp=tp)) / GIB  # + the null block
    return EngineMemory(
        tensor_parallel_size=tp, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, weights_gib=size.gib / tp,
        kv_per_token_bytes=kv_bytes_per_token(shape, kv_dtype=size.dtype, tp=tp), sequence_gib=sequence / GIB,
        kv_cache_gib=max(kv_cache_gib, floor),
        forward_gib=forward_peak_bytes(shape, dtype=size.dtype, tp=tp,
                                       max_num_batched_tokens=max_num_batched_tokens) / GIB,
        sampler_gib=sampler_peak_bytes(shape, max_num_seqs=max_num_seqs) / GIB,
        cuda_graph_gib=0.0 if enforce_eager else CUDA_GRAPH_GIB,
        context_gib=CUDA_CONTEXT_GIB + (NCCL_GIB if tp > 1 else 0.0))


def engine_kwargs(memory: EngineMemory, device_gib: float, *, takes_kv_bytes: bool = True) -> dict[str, Any]:
    """The `vllm.LLM(...)` keyword arguments that start an engine with exactly the plan's numbers
    (`kv_cache_memory_bytes` only where the installed vLLM takes it: `takes_kv_bytes`)."""
    kwargs: dict[str, Any] = {"tensor_parallel_size": memory.tensor_parallel_size,
                              "max_model_len": memory.max_model_len, "max_num_seqs": memory.max_num_seqs,
                              "max_num_batched_tokens": memory.max_num_batched_tokens,
                              "gpu_memory_utilization": memory.gpu_memory_utilization(device_gib)}
    if takes_kv_bytes:
        kwargs["kv_cache_memory_bytes"] = memory.kv_cache_memory_bytes
    return kwargs


def server_flags(memory: EngineMemory, device_gib: float, *, takes_kv_bytes: bool = True) -> list[str]:
    """The same numbers as `vllm serve` flags."""
    return [f"--{k.replace('_', '-')}={v}" for k, v in engine_kwargs(memory, device_gib,
                                                                     takes_kv_bytes=takes_kv_bytes).items()]


def installed_takes_kv_bytes() -> bool:
    """Whether the installed vLLM's `EngineArgs` has `kv_cache_memory_bytes` (0.11 on); False without vLLM."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return any(f.name == "kv_cache_memory_bytes" for f in dataclasses.fields(EngineArgs))


def tensor_parallel_sizes(shape: AttentionShape, gpus: int) -> list[int]:
    """Every TP size up to `gpus` vLLM accepts for the model: dividing the attention heads
    (`config/model.py:1544-1550`) and dividing, or being a multiple of, the KV heads (replicated beyond them)."""
    return [n for n in range(1, gpus + 1) if shape.heads % n == 0
            and (shape.kv_heads % n == 0 or n % shape.kv_heads == 0)]


def largest_tensor_parallel(shape: AttentionShape, gpus: int) -> int:
    """The largest usable TP size on `gpus` devices (1 always divides)."""
    return tensor_parallel_sizes(shape, gpus)[-1]
