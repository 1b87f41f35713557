"""`harness.weights`: a config's parameter count equals that of the model transformers builds from it, the
paper's models come out at their published sizes, and `read_config` reads what it should or says why not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from paper_configs import PAPER_MODELS, QWEN3_8B, SKYWORK_GEMMA2_27B

from harness.errors import ConfigError
from harness.weights import ModelSize, ParameterCount, dtype_bytes, model_size, parameter_count, read_config

# --- exact counts against tiny random models ---------------------------------------------------------------

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 128,
}

TINY: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False},
    # SmolLM2 is a llama with tied embeddings and no GQA field in old exports
    "smollm_tied": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": True,
        "num_key_value_heads": None,
    },
    "llama_head_dim": {"model_type": "llama", "head_dim": 32},
    "llama_biases": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "mistral_null_head_dim": {"model_type": "mistral", "head_dim": None},
    "qwen2_biases": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
    "qwen2_tied": {"model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "head_dim": 24},
    "qwen3_no_head_dim": {"model_type": "qwen3"},  # transformers' default, 128, not hidden / heads
    "gemma": {"model_type": "gemma", "head_dim": 16},
    "gemma2": {"model_type": "gemma2", "head_dim": 16},
    "gemma2_untied": {"model_type": "gemma2", "head_dim": 16, "tie_word_embeddings": False},
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 16, "sliding_window": 16},
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    # layer 0 dense (mlp_only_layers), layer 1 MoE with a shared expert; q/k/v biases by default
    "qwen2_moe_shared": {
        "model_type": "qwen2_moe",
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 48,
        "mlp_only_layers": [0],
    },
    "qwen2_moe_sparse_step": {
        "model_type": "qwen2_moe",
        "num_hidden_layers": 4,
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 40,
        "decoder_sparse_step": 2,
        "qkv_bias": False,
    },
    # layers 1, 3 and 5 by the step; 1 listed dense (twice), 2 listed but dense anyway, 99 beyond the layers
    "qwen2_moe_listed": {
        "model_type": "qwen2_moe",
        "num_hidden_layers": 6,
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 40,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [1, 1, 2, 99],
    },
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "llama_reward": {
        "model_type": "llama",
        "architectures": ["LlamaForSequenceClassification"],
        "id2label": {"0": "LABEL_0"},
    },
    "gemma2_reward": {
        "model_type": "gemma2",
        "head_dim": 16,
        "architectures": ["Gemma2ForSequenceClassification"],
        "id2label": {"0": "LABEL_0"},
    },
    # no id2label: transformers' default of two labels
    "qwen3_classifier": {"model_type": "qwen3", "architectures": ["Qwen3ForSequenceClassification"]},
    "qwen3_moe_reward": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForSequenceClassification"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "id2label": {"0": "LABEL_0"},
    },
}


def _tiny(name: str) -> dict[str, Any]:
    return {**_BASE, **TINY[name]}


def _build(config: dict[str, Any], tmp_path: Path):
    """The random model transformers builds from `config`, read from a config.json as a checkpoint's is."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    (tmp_path / "config.json").write_text(json.dumps(config))
    hf_config = AutoConfig.from_pretrained(tmp_path)
    classifier = any(a.endswith("ForSequenceClassification") for a in config.get("architectures", ()))
    auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    return auto.from_config(hf_config)


def _inactive_experts(model, top_k: int) -> int:
    """Parameters of the experts a token skips, read off the built model's expert tensors."""
    skipped = 0
    for name, module in model.named_modules():
        if name.endswith("mlp.experts"):
            size = sum(p.numel() for p in module.parameters())
            skipped += size * (module.num_experts - top_k) // module.num_experts
    return skipped


@pytest.mark.parametrize("name", sorted(TINY))
def test_total_equals_the_parameters_transformers_builds(name: str, tmp_path: Path) -> None:
    config = _tiny(name)
    model = _build(config, tmp_path)
    count = parameter_count(config)
    # model.parameters() yields a tied weight once, as the count does
    assert count.total == sum(p.numel() for p in model.parameters())
    if "num_experts_per_tok" in config:
        assert count.active < count.total
        assert count.total - count.active == _inactive_experts(model, config["num_experts_per_tok"])
    else:
        assert count.active == count.total


def test_tied_embeddings_count_the_lm_head_once() -> None:
    untied = parameter_count(_tiny("llama"))
    tied = parameter_count({**_tiny("llama"), "tie_word_embeddings": True})
    assert untied.total - tied.total == 128 * 64
    # Gemma ties by default; saying so explicitly changes nothing
    explicit = {**_tiny("gemma2"), "tie_word_embeddings": True}
    assert parameter_count(_tiny("gemma2")) == parameter_count(explicit)


def test_qwen2_biases_and_qwen3_qk_norms() -> None:
    qwen2 = parameter_count(_tiny("qwen2_biases")).total
    as_llama = parameter_count({**_tiny("qwen2_biases"), "model_type": "llama"}).total
    assert qwen2 - as_llama == 2 * (64 + 2 * 32)  # q, k and v biases per layer; o has none
    qwen3 = parameter_count({**_tiny("qwen3"), "head_dim": 16}).total
    assert qwen3 - as_llama == 2 * 2 * 16  # q_norm and k_norm of head_dim each per layer


def test_multimodal_config_is_counted_from_its_text_config(tmp_path: Path) -> None:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = _tiny("gemma3_text")
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
    }
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": text,
        "vision_config": vision,
        "mm_tokens_per_image": 4,
    }
    model = Gemma3ForConditionalGeneration(Gemma3Config(**config))
    language = sum(p.numel() for p in model.model.language_model.parameters())
    assert parameter_count(config).total == language == parameter_count(text).total


def test_unknown_architecture_names_the_supported_ones() -> None:
    with pytest.raises(ConfigError, match=r"'phi3'.*supported: gemma, gemma2"):
        parameter_count({**_BASE, "model_type": "phi3"})
    with pytest.raises(ConfigError, match="lacks 'vocab_size'"):
        parameter_count({k: v for k, v in _tiny("llama").items() if k != "vocab_size"})


# --- the paper's models (their configs: tests/paper_configs.py) --------------------------------------------


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_paper_models_match_their_published_sizes(name: str) -> None:
    config, published_total, published_active = PAPER_MODELS[name]
    size = model_size(config)
    assert size.params.total == pytest.approx(published_total, rel=0.02)
    if published_active is None:
        assert size.params.active == size.params.total
    else:
        assert size.params.active == pytest.approx(published_active, rel=0.02)
    assert size.dtype == "bfloat16"
    assert size.weight_bytes == size.params.total * 2


def test_reward_head_replaces_the_lm_head() -> None:
    count = parameter_count(SKYWORK_GEMMA2_27B).total
    as_causal_untied = parameter_count(
        {**SKYWORK_GEMMA2_27B, "architectures": ["Gemma2ForCausalLM"], "tie_word_embeddings": False}
    ).total
    assert as_causal_untied - count == 256000 * 4608 - 4608 * 1


# --- dtypes and sizes -------------------------------------------------------------------------------------


def test_dtype_bytes() -> None:
    names = ("float32", "bfloat16", "float16", "fp8", "int8", "int4")
    assert [dtype_bytes(n) for n in names] == [4, 2, 2, 1, 1, 0.5]
    assert dtype_bytes("torch.bfloat16") == dtype_bytes("bf16") == 2
    with pytest.raises(ConfigError, match="unknown weight dtype 'int3'"):
        dtype_bytes("int3")


def test_model_size_dtype_from_config_or_argument() -> None:
    config = {**_tiny("llama")}
    total = parameter_count(config).total
    assert model_size(config) == ModelSize(ParameterCount(total, total), "bfloat16", 2.0)  # names none: bf16
    # transformers 5 writes `dtype`, earlier versions `torch_dtype`
    assert model_size({**config, "dtype": "float32"}).weight_bytes == 4 * total
    assert model_size({**config, "torch_dtype": "float16"}, dtype="auto").dtype == "float16"
    size = model_size({**config, "dtype": "float32"}, dtype="int4")
    assert (size.dtype, size.weight_bytes) == ("int4", total // 2)
    assert size.gib == pytest.approx(total / 2 / 2**30)
    quantized = {**config, "dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"}}
    with pytest.raises(ConfigError, match="quantized.*'fp8'.*pass dtype="):
        model_size(quantized)
    assert model_size(quantized, dtype="fp8").weight_bytes == total


# --- read_config ------------------------------------------------------------------------------------------


def test_read_config_from_a_directory_or_a_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    assert read_config(tmp_path) == QWEN3_8B
    assert read_config(str(tmp_path / "config.json")) == QWEN3_8B


def test_read_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json in this directory"):
        read_config(tmp_path)
    with pytest.raises(ConfigError, match="no such file or directory"):
        read_config(tmp_path / "missing" / "config.json")
    with pytest.raises(ConfigError, match="no such file or directory"):
        read_config("./not-here")
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",')
    with pytest.raises(ConfigError) as caught:
        read_config(tmp_path)
    assert str(bad) in str(caught.value) and "not valid JSON" in str(caught.value)
    assert "\n" not in str(caught.value)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        read_config(bad)


def test_read_config_hub_id_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # the hub reads these at import, so set the module values too; an empty cache has no copy to fall back to
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as caught:
        read_config("Qwen/Qwen3-8B")
    message = str(caught.value)
    assert "Qwen/Qwen3-8B" in message and "offline" in message and "local checkpoint directory" in message
    assert "\n" not in message


# --- malformed configs: one-line errors, never a traceback or a hang -------------------------------------------

_INT_BAD = ("8", 1.5, True, -1, [8], {"n": 8}, 10**9)
_FLAG_BAD = ("false", 0, 1, [True], {"on": True})
_TEXT_BAD = (["x"], {"x": 1}, 5, 1.5, True)
_MAPPING_BAD = ("x", 5, ["x"], 1.5, True)
_FIELDS = {  # field -> (the tiny config that reads it, wrong values)
    **{key: ("llama", _INT_BAD) for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim", "intermediate_size")},
    **{key: ("llama", _FLAG_BAD) for key in ("attention_bias", "mlp_bias", "tie_word_embeddings")},
    **{key: ("llama", _TEXT_BAD) for key in ("model_type", "dtype", "torch_dtype")},
    "architectures": ("llama", ("LlamaForCausalLM", 5, {"x": 1}, [5], [True])),
    "quantization_config": ("llama", _MAPPING_BAD),
    "text_config": ("llama", _MAPPING_BAD),
    "qkv_bias": ("qwen2_moe_shared", _FLAG_BAD),
    **{key: ("qwen2_moe_shared", _INT_BAD) for key in ("num_experts", "decoder_sparse_step", "moe_intermediate_size",
                                                       "num_experts_per_tok", "shared_expert_intermediate_size")},
    "mlp_only_layers": ("qwen2_moe_shared", ("0", 5, {"0": 1}, [1.5], [True], ["0"])),
    "num_local_experts": ("mixtral", _INT_BAD),
    "id2label": ("llama_reward", _MAPPING_BAD),
    "num_labels": ("qwen3_classifier", _INT_BAD),
}


@pytest.mark.parametrize("key", sorted(_FIELDS))
def test_every_field_read_of_the_wrong_type_is_a_one_line_error(key: str) -> None:
    name, values = _FIELDS[key]
    parameter_count(_tiny(name))  # the config counts as it is: each error below is the field's
    for value in values:
        with pytest.raises(ConfigError) as caught:
            model_size({**_tiny(name), key: value})
        assert "\n" not in str(caught.value), (key, value)


def test_a_multimodal_config_s_text_model_type_must_be_a_string() -> None:
    with pytest.raises(ConfigError, match="text_config.model_type must be a string"):
        parameter_count({"model_type": "gemma3", "text_config": {**_tiny("gemma3_text"), "model_type": ["x"]}})


def test_sizes_are_counted_per_layer_kind_not_walked_layer_by_layer() -> None:
    from harness.weights import MAX_SIZE

    # As many layers as a config may name: the count comes at once and scales exactly with the layers.
    for name in ("llama", "qwen2_moe_sparse_step", "mixtral"):
        few, many = (parameter_count({**_tiny(name), "num_hidden_layers": n}) for n in (4, MAX_SIZE))
        none = parameter_count({**_tiny(name), "num_hidden_layers": 0})
        assert many.total - none.total == (few.total - none.total) * (MAX_SIZE // 4)
    with pytest.raises(ConfigError, match="'num_hidden_layers' is 1000000000, more than any model has"):
        parameter_count({**_tiny("llama"), "num_hidden_layers": 10**9})
