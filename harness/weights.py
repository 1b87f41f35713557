"""A model's weight memory from its Hugging Face `config.json`, without loading any weights.

Used to plan which models fit on which GPUs. `parameter_count` counts, from the config's fields, exactly the
tensors transformers builds for that config: `total` equals `sum(p.numel() for p in model.parameters())` of
the model `AutoModelFor*.from_config` makes (the tests hold it to that for every supported architecture).

Counting rules:

- Attention: q and o are hidden x (heads * head_dim), k and v hidden x (kv_heads * head_dim) (GQA). `head_dim`
  is the config's own when it names one, else the architecture's default (Qwen3 128, Gemma 256), else
  hidden / heads. Biases where the architecture has them: all four projections under `attention_bias`
  (Llama, Qwen3, Gemma), q/k/v always for Qwen2 and under `qkv_bias` for Qwen2-MoE, none for Mistral and
  Mixtral. Qwen3 and Gemma3 add a head_dim-wide RMSNorm on q and on k in every layer.
- MLP: gated, three matrices hidden x intermediate (biases only under Llama's `mlp_bias`).
- MoE layers: a router (experts x hidden) and every expert's three matrices; Qwen2-MoE adds an always-on
  shared expert and its hidden x 1 gate. Qwen-MoE layers listed in `mlp_only_layers`, or off
  `decoder_sparse_step`, are dense. `active` is `total` less the experts a token is not routed to
  (experts - `num_experts_per_tok` per MoE layer); embeddings, attention, router and shared expert count as
  active.
- Norms: RMSNorm weights only (no biases): two per layer (four for Gemma2 and Gemma3) and one final norm.
- Head: a causal LM's `lm_head` is vocab x hidden, counted once with the embeddings when `tie_word_embeddings`
  (default true for the Gemma family, false otherwise); an `...ForSequenceClassification` reward model has a
  `score` head of hidden x num_labels instead and no LM head.
- A multimodal config that nests its language model under `text_config` is counted from that text config: the
  vision tower and projector are not counted.

Not counted: activations, the KV cache and the engine's own buffers (the plan counts those separately), and
the scales and zero points a quantized format stores next to its weights (`model_size` of a quantized
checkpoint wants an explicit `dtype`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import TOO_DEEP, ConfigError


@dataclass(frozen=True, slots=True)
class ParameterCount:
    """How many parameters a model has."""

    total: int
    """Every parameter, tied weights once; an MoE model with all its experts."""
    active: int
    """Parameters one token passes through: `total` for a dense model, the routed experts' share for MoE."""


@dataclass(frozen=True, slots=True)
class _Arch:
    qkv_bias: str | None
    """Config key that turns on q/k/v biases (None: never); "always" for Qwen2, which hard-codes them."""
    o_bias: bool
    """Whether o shares the q/k/v bias switch (Llama, Qwen3, Gemma: `attention_bias` covers all four)."""
    qk_norm: bool = False
    layer_norms: int = 2
    head_dim: int | None = None
    """transformers' default head_dim when the config names none (None: hidden / heads)."""
    tie_default: bool = False
    moe: str | None = None
    """"mixtral" (every layer MoE), "qwen" (sparse step, dense-only layers), "qwen_shared" (+ shared)."""


_ARCHS: dict[str, _Arch] = {
    "llama": _Arch(qkv_bias="attention_bias", o_bias=True),
    "mistral": _Arch(qkv_bias=None, o_bias=False),
    "qwen2": _Arch(qkv_bias="always", o_bias=False),
    "qwen3": _Arch(qkv_bias="attention_bias", o_bias=True, qk_norm=True, head_dim=128),
    "gemma": _Arch(qkv_bias="attention_bias", o_bias=True, head_dim=256, tie_default=True),
    "gemma2": _Arch(qkv_bias="attention_bias", o_bias=True, layer_norms=4, head_dim=256, tie_default=True),
    "gemma3_text": _Arch(
        qkv_bias="attention_bias", o_bias=True, qk_norm=True, layer_norms=4, head_dim=256, tie_default=True
    ),
    "qwen3_moe": _Arch(qkv_bias="attention_bias", o_bias=True, qk_norm=True, moe="qwen"),
    "qwen2_moe": _Arch(qkv_bias="qkv_bias", o_bias=False, moe="qwen_shared"),
    "mixtral": _Arch(qkv_bias=None, o_bias=False, moe="mixtral"),
}
# A multimodal config whose `text_config` omits its own model_type.
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}
_REQUIRED = object()


MAX_SIZE = 2**24
"""The largest value a size field may hold (a layer count, a width, a vocabulary, an expert count): far above
any real model's, low enough that a count stays exact and a GiB figure a float."""


def _field(config: Mapping[str, Any], key: str, model_type: str, default: Any = _REQUIRED) -> Any:
    value = config.get(key)
    if value is None:  # transformers writes unset optional fields (mistral's head_dim) as null
        if default is _REQUIRED:
            raise ConfigError(f"config of model_type {model_type!r} lacks {key!r} (needed to count weights)")
        return default
    return value


def _size(config: Mapping[str, Any], key: str, model_type: str, default: Any = _REQUIRED) -> int:
    value = _field(config, key, model_type, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config of model_type {model_type!r}: {key!r} must be an int >= 0, not {value!r}")
    if value > MAX_SIZE:
        raise ConfigError(f"config of model_type {model_type!r}: {key!r} is {value}, more than any model has "
                          f"(at most {MAX_SIZE})")
    return value


def _flag(config: Mapping[str, Any], key: str, model_type: str, default: bool) -> bool:
    value = _field(config, key, model_type, default)
    if not isinstance(value, bool):
        raise ConfigError(f"config of model_type {model_type!r}: {key!r} must be true or false, not {value!r}")
    return value


def _model_type(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"config: {where} must be a string, not {value!r}")
    return value


def _text_config(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    top_type = _model_type(config.get("model_type"), "model_type")
    text = config.get("text_config")
    if text is None:
        return config, str(top_type)
    if not isinstance(text, Mapping):
        raise ConfigError(f"config: text_config must be a mapping, not {text!r}")
    own = _model_type(text.get("model_type"), "text_config.model_type")
    return text, own or _TEXT_MODEL_TYPES.get(str(top_type), str(top_type))


def _num_labels(config: Mapping[str, Any], model_type: str) -> int:
    # transformers derives num_labels from id2label and omits both for its default of two labels.
    id2label = config.get("id2label")
    if id2label is not None and not isinstance(id2label, Mapping):
        raise ConfigError(f"config of model_type {model_type!r}: 'id2label' must be a mapping, not {id2label!r}")
    if id2label:
        return len(id2label)
    return _size(config, "num_labels", model_type, 2)


def architectures(config: Mapping[str, Any]) -> list[str]:
    """The config's `architectures` (none: an empty list).

    Raises:
        ConfigError: `architectures` is not a list of strings.
    """
    names = config.get("architectures")
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
        raise ConfigError(f"config: 'architectures' must be a list of class names, not {names!r}")
    return names


def _is_classifier(config: Mapping[str, Any]) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in architectures(config))


def parameter_count(config: Mapping[str, Any]) -> ParameterCount:
    """Count a model's parameters from its `config.json` contents (see the module docstring for the rules).

    Args:
        config: The parsed `config.json` of a checkpoint (`read_config`).

    Returns:
        The total and the per-token active parameter counts.

    Raises:
        ConfigError: The config's `model_type` is not one this module counts, or a field it reads is missing,
            of the wrong type, or larger than any model's (`MAX_SIZE`).
    """
    text, model_type = _text_config(config)
    arch = _ARCHS.get(model_type)
    if arch is None:
        supported = ", ".join(sorted(_ARCHS))
        raise ConfigError(f"cannot count the parameters of model_type {model_type!r}; supported: {supported}")
    hidden = _size(text, "hidden_size", model_type)
    layers = _size(text, "num_hidden_layers", model_type)
    vocab = _size(text, "vocab_size", model_type)
    heads = _size(text, "num_attention_heads", model_type)
    if heads == 0:
        raise ConfigError(f"config of model_type {model_type!r}: 'num_attention_heads' must be positive")
    # An older config without GQA names no kv heads: every query head has its own.
    kv_heads = _size(text, "num_key_value_heads", model_type, heads)
    head_dim = _size(text, "head_dim", model_type, arch.head_dim or hidden // heads)
    q_width, kv_width = heads * head_dim, kv_heads * head_dim

    attention = 2 * hidden * q_width + 2 * hidden * kv_width
    # Qwen2-MoE's `qkv_bias` defaults to true, Llama's, Qwen3's and Gemma's `attention_bias` to false.
    bias_on = arch.qkv_bias == "always" or (
        arch.qkv_bias is not None and _flag(text, arch.qkv_bias, model_type, arch.qkv_bias == "qkv_bias")
    )
    if bias_on:
        attention += q_width + 2 * kv_width + (hidden if arch.o_bias else 0)
    if arch.qk_norm:
        attention += 2 * head_dim
    per_layer = attention + arch.layer_norms * hidden

    moe_layers = _moe_layers(text, model_type, arch, layers)
    dense_layers = layers - moe_layers
    total = active = layers * per_layer
    if dense_layers:
        width = _size(text, "intermediate_size", model_type)
        # Llama's mlp_bias puts a bias on gate and up (width each) and on down (hidden).
        biased = model_type == "llama" and _flag(text, "mlp_bias", model_type, False)
        mlp = 3 * hidden * width + ((2 * width + hidden) if biased else 0)
        total, active = total + dense_layers * mlp, active + dense_layers * mlp
    if moe_layers:
        all_params, inactive = _moe_block(text, model_type, arch, hidden)
        total, active = total + moe_layers * all_params, active + moe_layers * (all_params - inactive)

    embeddings = vocab * hidden + hidden  # token embeddings and the final norm
    if _is_classifier(config):
        head = hidden * _num_labels(config, model_type)
    else:
        # A multimodal model ties through its top-level config; a plain one through its own.
        tied = _flag(text, "tie_word_embeddings", model_type, arch.tie_default)
        if config is not text:
            tied = _flag(config, "tie_word_embeddings", model_type, tied)
        head = 0 if tied else vocab * hidden
    return ParameterCount(total=total + embeddings + head, active=active + embeddings + head)


def _moe_layers(text: Mapping[str, Any], model_type: str, arch: _Arch, layers: int) -> int:
    """How many of the `layers` decoder layers hold an MoE block (counted, not walked: any layer count is quick)."""
    if arch.moe is None or layers == 0:
        return 0
    if arch.moe == "mixtral":
        return layers
    experts = _size(text, "num_experts", model_type)
    step = _size(text, "decoder_sparse_step", model_type, 1)
    dense_only = _field(text, "mlp_only_layers", model_type, [])
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                    for i in dense_only):
        raise ConfigError(f"config of model_type {model_type!r}: 'mlp_only_layers' must be a list of layer "
                          f"indices, not {dense_only!r}")
    if experts == 0 or step == 0:
        return 0
    # Layer i is MoE when (i + 1) is a multiple of the step and i is not listed as dense.
    listed = {i for i in dense_only if 0 <= i < layers and (i + 1) % step == 0}
    return layers // step - len(listed)


def _moe_block(text: Mapping[str, Any], model_type: str, arch: _Arch, hidden: int) -> tuple[int, int]:
    """(all parameters, those of the experts a token skips) of one MoE block."""
    if arch.moe == "mixtral":
        experts = _size(text, "num_local_experts", model_type)
        width = _size(text, "intermediate_size", model_type)
    else:
        experts = _size(text, "num_experts", model_type)
        width = _size(text, "moe_intermediate_size", model_type)
    top_k = _size(text, "num_experts_per_tok", model_type)
    if top_k > experts:
        raise ConfigError(f"config of model_type {model_type!r} routes to {top_k} of only {experts} experts")
    expert = 3 * hidden * width
    params = experts * hidden + experts * expert  # router and experts
    if arch.moe == "qwen_shared":
        shared = _size(text, "shared_expert_intermediate_size", model_type)
        params += 3 * hidden * shared + hidden  # shared expert and its sigmoid gate
    return params, (experts - top_k) * expert


_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "float8_e5m2fnuz": "fp8",
    "uint8": "int8",
}


def _canonical_dtype(name: str) -> str:
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in _DTYPE_BYTES:
        raise ConfigError(f"unknown weight dtype {name!r}; known: {', '.join(_DTYPE_BYTES)}")
    return key


def dtype_bytes(name: str) -> float:
    """Bytes one parameter takes in `name`.

    Args:
        name: float32, bfloat16, float16, fp8, int8 or int4, an alias (bf16, fp16, ...), or a config's
            `dtype`/`torch_dtype` value ("bfloat16", "torch.float16").

    Raises:
        ConfigError: An unknown dtype.
    """
    return _DTYPE_BYTES[_canonical_dtype(name)]


def config_dtype(config: Mapping[str, Any]) -> str | None:
    """The dtype a config names for its weights (`dtype`, or `torch_dtype` before transformers 5), or None."""
    text = config.get("text_config")
    for source in (config, text if isinstance(text, Mapping) else {}):
        for key in ("dtype", "torch_dtype"):
            if source.get(key):
                if not isinstance(source[key], str):
                    raise ConfigError(f"config: {key!r} must be a dtype name, not {source[key]!r}")
                return source[key]
    return None


@dataclass(frozen=True, slots=True)
class ModelSize:
    """A model's parameters and the memory its weights take at one dtype."""

    params: ParameterCount
    dtype: str
    """Canonical dtype name: float32, bfloat16, float16, fp8, int8 or int4."""
    bytes_per_param: float

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (every expert of an MoE model: all of them stay resident)."""
        return math.ceil(self.params.total * self.bytes_per_param)

    @property
    def gib(self) -> float:
        """`weight_bytes` in GiB."""
        return self.weight_bytes / 2**30


def model_size(config: Mapping[str, Any], *, dtype: str | None = None) -> ModelSize:
    """The weight memory of the model a config describes.

    Args:
        config: The parsed `config.json`.
        dtype: The dtype the weights are held in; None or "auto" takes the config's own (bfloat16 when it
            names none).

    Raises:
        ConfigError: An uncountable architecture, an unknown dtype, or a quantized checkpoint with no explicit
            dtype (its config's dtype names the compute dtype, not the stored weights).
    """
    if dtype is None or dtype == "auto":
        quantization = config.get("quantization_config")
        if quantization is not None and not isinstance(quantization, Mapping):
            raise ConfigError(f"config: 'quantization_config' must be a mapping, not {quantization!r}")
        if isinstance(quantization, Mapping):
            method = quantization.get("quant_method", "unknown")
            raise ConfigError(
                f"the config is quantized (quant_method {method!r}): its dtype field is not the stored "
                "weights' width; pass dtype= (fp8, int8 or int4)"
            )
        dtype = config_dtype(config) or "bfloat16"
    name = _canonical_dtype(dtype)
    return ModelSize(params=parameter_count(config), dtype=name, bytes_per_param=_DTYPE_BYTES[name])


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What a config says about attention and the layer widths: the figures KV-cache and activation sizing read."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    """The MLP width a token passes through: the dense one, or an MoE layer's routed experts together."""
    vocab: int
    sliding_window: int | None
    """The window of the sliding-attention layers (None: every layer attends fully)."""
    sliding_layers: int
    """Layers with sliding-window attention (their cache holds the window, not the sequence)."""


def attention_shape(config: Mapping[str, Any]) -> AttentionShape:
    """The attention and layer widths of the model a `config.json` describes (its text model's, if nested).

    `head_dim` follows `parameter_count`'s rule. Sliding-window layers come from `layer_types` where the config
    lists it (Gemma3, Qwen3 with `use_sliding_window`), else Gemma2's every other layer.

    Raises:
        ConfigError: a field missing or of the wrong type.
    """
    text, model_type = _text_config(config)
    arch = _ARCHS.get(model_type)
    hidden = _size(text, "hidden_size", model_type)
    heads = _size(text, "num_attention_heads", model_type)
    kv_heads = _size(text, "num_key_value_heads", model_type, heads)
    default_head = arch.head_dim if arch is not None and arch.head_dim else hidden // heads
    head_dim = _size(text, "head_dim", model_type, default_head)
    layers = _size(text, "num_hidden_layers", model_type)
    experts = text.get("num_experts") or text.get("num_local_experts")
    if experts and text.get("moe_intermediate_size") is not None:
        intermediate = _size(text, "moe_intermediate_size", model_type) * _size(
            text, "num_experts_per_tok", model_type)
    else:
        intermediate = _size(text, "intermediate_size", model_type)
    window = text.get("sliding_window")
    kinds = text.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list) or len(kinds) != layers):
        # transformers refuses the same (`PreTrainedConfig.validate_layer_type`: one kind per layer)
        got = f"{len(kinds)} entries" if isinstance(kinds, list) else f"a {type(kinds).__name__}"
        raise ConfigError(f"{model_type}: layer_types must list one kind per layer ({layers} layers, "
                          f"num_hidden_layers), got {got}")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        sliding, window = 0, None
    elif isinstance(kinds, list):
        sliding = sum(1 for k in kinds if k == "sliding_attention")
    elif model_type == "gemma2":
        sliding = (layers + 1) // 2
    else:
        sliding = layers if text.get("use_sliding_window") else 0
    return AttentionShape(layers, heads, kv_heads, head_dim, hidden, intermediate,
                          _size(text, "vocab_size", model_type), window if sliding else None, sliding)


# A Hub id: "name" or "namespace/name" (letters, digits, - _ .), never a path that happens not to exist.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def read_config(location: str | Path, *, revision: str | None = None) -> dict[str, Any]:
    """Read a checkpoint's `config.json`.

    Args:
        location: A local checkpoint directory, a path to a `config.json`, or a Hub id (only its `config.json`
            is fetched, through the Hub cache).
        revision: A Hub branch, tag or commit (Hub ids only).

    Returns:
        The config as a dict.

    Raises:
        ConfigError: No such file or directory, a file that is not a JSON object, or a Hub id that cannot be
            fetched (offline, unreachable, unknown, gated or without a config.json).
    """
    path = Path(location).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path.parent}: no config.json in this directory")
        return _load(path)
    if path.is_file():
        return _load(path)
    text = str(location)
    if isinstance(location, Path) or text.endswith(".json") or not _HUB_ID.fullmatch(text):
        raise ConfigError(f"{location}: no such file or directory (nor a Hub id)")
    return _load(_download(text, revision))


def _download(repo: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo}@{revision}" if revision else repo
    fix = f"pass a local checkpoint directory or download its config ('hf download {repo} config.json')"
    try:
        return Path(hf_hub_download(repo, "config.json", revision=revision))
    # LocalEntryNotFoundError is an EntryNotFoundError, GatedRepoError a RepositoryNotFoundError.
    except LocalEntryNotFoundError:
        raise ConfigError(f"{where}: cannot fetch config.json (offline or Hub unreachable); {fix}") from None
    except GatedRepoError:
        raise ConfigError(f"{where}: gated on the Hub (accept its licence and log in); {fix}") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"{where}: no such model on the Hub (or a private one); {fix}") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{where}: no such revision on the Hub") from None
    except EntryNotFoundError:
        raise ConfigError(f"{where}: the Hub repository has no config.json") from None
    except HFValidationError as exc:
        raise ConfigError(f"{repo!r} is neither a local path nor a Hub id: {_first_line(exc)}") from None
    except OSError as exc:  # any other HTTP or network failure
        raise ConfigError(f"{where}: cannot fetch config.json ({_first_line(exc)}); {fix}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno} col {exc.colno})") from None
    except RecursionError:
        raise ConfigError(f"{path}: {TOO_DEEP}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({_first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a JSON object, not {type(data).__name__}")
    return data
