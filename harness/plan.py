"""Device memory of a run's local models and the phases they run in, known before any model loads.

A *local* model runs in this process (`hf:`, `vllm:`); a served one (`openai:`) takes this machine no memory.
Each local model's weights come from its `config.json` (`harness.weights`: parameters x dtype bytes, an MoE
model counted whole). In-process engines share the process's devices: an engine spans `devices` of them (a
`vllm:` engine its `tensor_parallel_size`, every visible GPU when none is set; an `hf:` model every GPU with
`device: auto`, one with `cuda:N`), and takes, on each, its weights' share plus `kv_cache_gib` for its cache and
activations. A device offers `gpu_memory_gib x usable`. `plan_phases` packs the units' model sets into phases
that fit (`harness.schedule`), and each vLLM engine is given its share of a device as its
`gpu_memory_utilization`, so the engines of a phase start side by side instead of each claiming 0.85 of it.

Without devices (a CPU machine, or none given) nothing is bounded and everything runs in one phase.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError
from harness.schedule import DoesNotFit, Phase, schedule

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Devices:
    """The accelerators a run may use (`--gpus`, `--gpu-memory`, or `devices:` in a config)."""

    gpus: int
    gpu_memory_gib: float
    """Memory of one device."""
    kv_cache_gib: float = 4.0
    """What each engine takes on each of its devices besides its weights (KV cache, activations)."""
    usable: float = 0.92
    """Share of a device's memory the engines may take together (the rest: fragmentation, other processes)."""
    free_gib: float | None = None
    """The least memory free on any of the devices when the plan was made (None: not measured, all of it)."""

    def __post_init__(self) -> None:
        finite = all(math.isfinite(v) for v in (self.gpu_memory_gib, self.kv_cache_gib, self.usable))
        if self.free_gib is not None and not (math.isfinite(self.free_gib) and self.free_gib >= 0):
            raise ConfigError(f"devices: free memory must be finite and >= 0, got {self.free_gib}")
        if (not finite or self.gpus < 1 or not self.gpu_memory_gib > 0 or self.kv_cache_gib < 0
                or not 0 < self.usable <= 1):
            raise ConfigError(f"devices: need gpus >= 1, finite gpu_memory > 0, finite kv_cache >= 0 and "
                              f"0 < usable <= 1; got {self.gpus}, {self.gpu_memory_gib}, {self.kv_cache_gib}, "
                              f"{self.usable}")

    @property
    def budget_gib(self) -> float:
        """What the engines of one phase may take of one device together: `usable` x what is free."""
        free = self.gpu_memory_gib if self.free_gib is None else min(self.free_gib, self.gpu_memory_gib)
        return free * self.usable


@dataclass(frozen=True, slots=True)
class LocalModel:
    """One local model as the plan sees it."""

    key: str
    """The pool's key (the model spec, with its overrides)."""
    kind: str
    source: str
    """The checkpoint folder or hub id its config was read from."""
    params: int
    """Every parameter (all experts)."""
    dtype: str
    weights_gib: float
    devices: int
    """Devices the engine spans."""
    per_device_gib: float
    """What it takes of each of its devices: a vLLM engine's `engine.per_device_gib`, else weights / devices +
    the KV cache allowance."""
    engine: Any = None
    """A vLLM engine's `harness.vllm_memory.EngineMemory` (sized with devices; None otherwise)."""


def resolve_devices(config: Any, *, gpus: int | None, gpu_memory: float | None) -> Devices | None:
    """The run's devices: `--gpus`/`--gpu-memory` over the config's `devices:` (`harness.config.DevicesConfig`),
    else the GPUs nvidia-smi lists, else None (a CPU machine: unbounded).

    Raises:
        ConfigError: for one of the two flags without the other and no config to complete it.
    """
    found = {"gpus": config.gpus, "gpu_memory_gib": config.gpu_memory, "kv_cache_gib": config.kv_cache,
             "usable": config.usable} if config is not None else {}
    if gpus is not None:
        found["gpus"] = gpus
    if gpu_memory is not None:
        found["gpu_memory_gib"] = gpu_memory
    if not found:
        return detect_devices()
    if "gpus" not in found or "gpu_memory_gib" not in found:
        raise ConfigError("devices: give both --gpus and --gpu-memory (or devices: {gpus, gpu_memory} in the config)")
    return Devices(**found)


def detect_devices() -> Devices | None:
    """The visible NVIDIA GPUs as nvidia-smi lists them (the smallest one's total, the least free), or None; no
    torch import, so a run the call cache answers stays light."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total,memory.free",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return devices_from_smi(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def devices_from_smi(out: str, visible: str | None) -> Devices | None:
    """`Devices` from nvidia-smi's `index,uuid,memory.total,memory.free` CSV (MiB), among `visible` (the
    `CUDA_VISIBLE_DEVICES` value: indices, or GPU UUIDs or their unique prefixes, as CUDA reads them)."""
    rows = [[v.strip() for v in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 4]
    if visible:
        chosen = []
        for wanted in (v.strip() for v in visible.split(",")):
            match = [r for r in rows if r[0] == wanted or (wanted.startswith(("GPU-", "MIG-"))
                                                           and r[1].startswith(wanted))]
            if len(match) != 1:
                break  # CUDA stops at the first entry it cannot resolve
            if match[0] not in chosen:
                chosen.append(match[0])
        rows = chosen
    try:
        total = min(float(r[2]) for r in rows) / 1024 if rows else 0.0
        free = min(float(r[3]) for r in rows) / 1024 if rows else 0.0
    except ValueError:
        return None
    if not rows or total <= 0:
        return None
    return Devices(gpus=len(rows), gpu_memory_gib=total, free_gib=free)


def local_models(pool: Any, keys: Iterable[str], devices: Devices | None) -> dict[str, LocalModel]:
    """Size every local model among `keys` from its config.json (nothing loads); a vLLM engine's memory as
    `harness.vllm_memory` computes it, with its `max_model_len` (the backend option, where
    `harness.contexts.fit_contexts` or the config set it; else `DEFAULT_PROMPT_TOKENS` + `DEFAULT_MAX_TOKENS`).

    Raises:
        ConfigError: naming the model whose config cannot be read or counted.
    """
    from harness.weights import model_size, read_config

    found = {}
    for key in keys:
        backend = pool.backend(key)
        if not backend.local:
            continue
        inner = backend.backend
        source = inner.source
        try:
            config = read_config(source.path, revision=source.revision)
            size = model_size(config, dtype=inner.options.dtype)
            spans = engine_devices(inner, devices, config=config)
            engine = (vllm_engine(config, inner.options, spans, devices)
                      if inner.kind == "vllm" and devices is not None else None)
        except ConfigError as exc:
            raise ConfigError(f"cannot size {key}: {exc}") from None
        kv = devices.kv_cache_gib if devices is not None else 0.0
        per_device = engine.per_device_gib if engine is not None else size.gib / spans + kv
        found[key] = LocalModel(key, inner.kind, source.path, size.params.total, size.dtype, size.gib, spans,
                                per_device, engine)
    return found


def vllm_engine(config: Mapping[str, Any], options: Any, tp: int, devices: Devices) -> Any:
    """A vLLM engine's `EngineMemory` on `tp` of `devices` (see `local_models`), with the options'
    `max_num_seqs` and `max_num_batched_tokens` where set (else the plan's). A sequence classifier's batch holds
    a whole sequence: vLLM runs some pooling models without chunked prefill, and then refuses a
    `max_num_batched_tokens` below `max_model_len` (`config/scheduler.py:314-325`, `verify_max_model_len`)."""
    from harness.backends.local import is_sequence_classifier
    from harness.vllm_memory import DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, \
        context_length, engine_memory, model_limit

    length = options.max_model_len or context_length(DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS,
                                                     model_limit=model_limit(config))
    batched = options.max_num_batched_tokens or MAX_NUM_BATCHED_TOKENS
    if options.max_num_batched_tokens is None and is_sequence_classifier(dict(config)):
        batched = max(batched, length)
    return engine_memory(config, tp=tp, max_model_len=length, dtype=options.dtype, kv_cache_gib=devices.kv_cache_gib,
                         enforce_eager=options.enforce_eager, max_num_seqs=options.max_num_seqs or MAX_NUM_SEQS,
                         max_num_batched_tokens=batched)


def engine_devices(backend: Any, devices: Devices | None, *, config: Mapping[str, Any] | None = None) -> int:
    """How many devices a local engine spans: a vLLM engine its `tensor_parallel_size`, else the largest its
    heads divide on the devices there are (with `config`; every device without); an `hf:` model one with
    `cuda:N`, every device otherwise."""
    gpus = devices.gpus if devices is not None else 1
    options = backend.options
    if backend.kind == "vllm":
        if options.tensor_parallel_size:
            return options.tensor_parallel_size
        if config is None:
            return gpus
        from harness.vllm_memory import largest_tensor_parallel
        from harness.weights import attention_shape

        return largest_tensor_parallel(attention_shape(config), gpus)
    return 1 if options.device.startswith("cuda:") else gpus


def plan_phases(groups: Iterable[frozenset[str]], models: Mapping[str, LocalModel],
                devices: Devices | None) -> list[Phase]:
    """The phases the units' model sets run in (one, without devices).

    Raises:
        ConfigError: for a model set that does not fit even alone, with the numbers and the ways out.
    """
    budget = devices.budget_gib if devices is not None else None
    cost = {key: m.per_device_gib for key, m in models.items()}
    try:
        return schedule(groups, cost=cost, budget=budget)
    except DoesNotFit as exc:
        raise ConfigError(f"{exc}; {ways_out(models, devices)}") from None  # type: ignore[arg-type]


def ways_out(models: Mapping[str, LocalModel], devices: Devices) -> str:
    """What makes an oversized plan fit, with the numbers for the largest model."""
    largest = max(models.values(), key=lambda m: m.weights_gib)
    need = largest.weights_gib + devices.kv_cache_gib * devices.gpus
    enough = next((n for n in (1, 2, 4, 8, 16, 32, 64) if largest.weights_gib / n + devices.kv_cache_gib
                   <= devices.budget_gib), None)
    spread = (f"spread {largest.key} over {enough} devices (tensor_parallel_size: {enough}, or --gpus {enough})"
              if enough is not None else f"{largest.key} needs about {need:.0f} GiB")
    return (f"ways out: serve the large models (`harness serve`, or any OpenAI-compatible server, named as "
            f"openai: with its own endpoint), {spread}, or run the rows apart (only_rows)")


def placements(phases: Iterable[Phase], models: Mapping[str, LocalModel],
               devices: Devices | None) -> dict[str, dict[str, Any]]:
    """Key -> the backend options each local vLLM engine starts with: its plan's numbers
    (`harness.vllm_memory.engine_kwargs`); none without devices."""
    if devices is None:
        return {}
    from harness.vllm_memory import engine_kwargs

    out: dict[str, dict[str, Any]] = {}
    for phase in phases:
        for key in phase.models:
            m = models[key]
            if m.kind == "vllm" and m.engine is not None:
                out[key] = engine_kwargs(m.engine, devices.gpu_memory_gib)
    return out


def place(pool: Any, placed: Mapping[str, Mapping[str, Any]]) -> None:
    """Give each local engine its placement before it loads (its options change; its identity does not); a
    number its options have no field for is left to `engine_kwargs` callers."""
    for key, options in placed.items():
        inner = pool.backend(key).backend
        known = {f.name for f in dataclasses.fields(inner.options)}
        inner.options = dataclasses.replace(inner.options, **{k: v for k, v in options.items() if k in known})


ADAM_BYTES_PER_PARAM = 16
"""What training holds per parameter with Adam in mixed precision: bf16 weights and gradients (2 + 2), fp32
master weights and two moments (4 + 4 + 4); ZeRO-3 shards all of it over the processes."""


@dataclass(frozen=True, slots=True)
class TrainingLoad:
    """What one training process puts on its GPU."""

    trained_gib: float
    """The trained model's weights, gradients and optimizer state: its share under ZeRO-3."""
    colocated_gib: float
    """TRL's colocated vLLM engine (its `vllm_gpu_memory_utilization` of the device)."""
    frozen_gib: dict[str, float]
    """Frozen models loaded in the process (a served one costs none)."""
    activations_gib: float
    activations_for: str = ""
    """What the activations were estimated for (batch, tokens, checkpointing), as `plan --train` prints it."""

    @property
    def total_gib(self) -> float:
        return self.trained_gib + self.colocated_gib + sum(self.frozen_gib.values()) + self.activations_gib


def training_load(params: int, *, processes: int, colocated_share: float, frozen: Mapping[str, float],
                  devices: Devices, activations_gib: float | None = None, activations_for: str = "") -> TrainingLoad:
    """The per-GPU load of a training job: `params` trained over `processes` ZeRO-3 ranks, TRL's colocated vLLM
    taking `colocated_share` of the device (0 without), `frozen` model -> its GiB where it is loaded in-process,
    and `activations_gib` (`activation_gib`, estimated `activations_for` a micro-batch; None: the device's
    `kv_cache_gib`, a flat allowance)."""
    flat = activations_gib is None
    return TrainingLoad(params * ADAM_BYTES_PER_PARAM / processes / GIB, colocated_share * devices.gpu_memory_gib,
                        dict(frozen), devices.kv_cache_gib if flat else activations_gib,  # type: ignore[arg-type]
                        "a flat allowance" if flat else activations_for)


ACTIVATION_BYTES_PER_HIDDEN = 34
"""Bytes one transformer layer keeps per token and hidden unit for its backward in 16-bit training, attention
scores not stored (flash/SDPA attention): Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.1, `sbh(34 + 5as/h)` less the `5as/h` scores term."""
LOGIT_BYTES = 10
"""Bytes a completion token's logit takes over the vocabulary: bf16 logits (2), their float32 copy (4) and the
float32 log-softmax TRL computes over them (4) (`trl/trainer/utils.py:538`, `selective_log_softmax`, called
from `GRPOTrainer._get_per_token_logps_and_entropies`, `trl/trainer/grpo_trainer.py:1419`)."""


def activation_gib(config: Mapping[str, Any], *, batch: int, prompt_tokens: int, completion_tokens: int,
                   checkpointing: bool) -> float:
    """Peak activations of one training micro-batch on one GPU: `batch` sequences of `prompt_tokens` +
    `completion_tokens`.

    Without gradient checkpointing every layer keeps `ACTIVATION_BYTES_PER_HIDDEN` x hidden a token; with it,
    each layer keeps only its bf16 input (2 x hidden a token) and one layer at a time is recomputed in full.
    On top: the logits of the completion tokens over the vocabulary (`LOGIT_BYTES` each).

    Raises:
        ConfigError: a config that cannot be read.
    """
    from harness.weights import attention_shape

    shape = attention_shape(config)
    tokens = batch * (prompt_tokens + completion_tokens)
    layer = tokens * shape.hidden * ACTIVATION_BYTES_PER_HIDDEN
    kept = shape.layers * tokens * shape.hidden * 2 + layer if checkpointing else shape.layers * layer
    logits = batch * completion_tokens * shape.vocab * LOGIT_BYTES
    return (kept + logits) / GIB


def check_training(load: TrainingLoad, devices: Devices) -> None:
    """Refuse a training job whose per-GPU load exceeds a device, with the numbers and the ways out.

    Raises:
        ConfigError: naming each part of the load.
    """
    if load.total_gib <= devices.budget_gib:
        return
    parts = [f"trained model {load.trained_gib:.1f}", f"colocated vLLM {load.colocated_gib:.1f}",
             f"activations {load.activations_gib:.1f}"] + [f"{k} {v:.1f}" for k, v in load.frozen_gib.items()]
    raise ConfigError(f"training needs {load.total_gib:.1f} GiB per GPU ({', '.join(parts)}) over the "
                      f"{devices.budget_gib:.1f} a device offers; ways out: serve the frozen models (models: or "
                      "--endpoints), more processes (accelerate launch --num_processes: ZeRO-3 shards the trained "
                      "model), a smaller grpo.vllm_gpu_memory_utilization; for the activations, "
                      "grpo.gradient_checkpointing: true and a smaller grpo.per_device_train_batch_size (more "
                      "gradient_accumulation_steps keep the batch)")
