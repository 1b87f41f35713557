"""The published `config.json` of the paper's models (the fields that decide their size), for tests that plan
or count them without downloading anything."""

from __future__ import annotations

# The published config.json of each checkpoint on the Hugging Face Hub (fields that do not change the
# parameter count, such as rope scaling, token ids and generation settings, left out).
QWEN3_8B = {  # Qwen/Qwen3-8B config.json
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
QWEN3_32B = {  # Qwen/Qwen3-32B config.json
    **QWEN3_8B,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
LLAMA_31_8B_INSTRUCT = {  # meta-llama/Llama-3.1-8B-Instruct config.json
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
NEMOTRON_70B_REWARD = {  # nvidia/Llama-3.1-Nemotron-70B-Reward-HF config.json (Llama-3.1-70B's shape)
    **LLAMA_31_8B_INSTRUCT,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
}
SKYWORK_GEMMA2_27B = {  # Skywork/Skywork-Reward-Gemma-2-27B-v0.2 config.json
    "architectures": ["Gemma2ForSequenceClassification"],
    "model_type": "gemma2",
    "attention_bias": False,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "head_dim": 128,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 4608,
    "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0},
    "intermediate_size": 36864,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 46,
    "num_key_value_heads": 16,
    "query_pre_attn_scalar": 144,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
    "vocab_size": 256000,
}

# Published sizes: the model cards (Qwen3: 8.2B, 32.8B, 30.5B total / 3.3B activated; Llama 3.1: 8.03B and
# 70.6B as the Hub reports the safetensors; Gemma 2 27B: 27.2B).
PAPER_MODELS = {
    "Qwen3-8B": (QWEN3_8B, 8.2e9, None),
    "Qwen3-32B": (QWEN3_32B, 32.8e9, None),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, 30.5e9, 3.3e9),
    "Llama-3.1-8B-Instruct": (LLAMA_31_8B_INSTRUCT, 8.03e9, None),
    "Llama-3.1-Nemotron-70B-Reward-HF": (NEMOTRON_70B_REWARD, 70.6e9, None),
    "Skywork-Reward-Gemma-2-27B-v0.2": (SKYWORK_GEMMA2_27B, 27.2e9, None),
}

HUB_CONFIGS = {
    "Qwen/Qwen3-8B": QWEN3_8B,
    "Qwen/Qwen3-32B": QWEN3_32B,
    "Qwen/Qwen3-30B-A3B": QWEN3_30B_A3B,
    "meta-llama/Llama-3.1-8B-Instruct": LLAMA_31_8B_INSTRUCT,
    "nvidia/Llama-3.1-Nemotron-70B-Reward-HF": NEMOTRON_70B_REWARD,
    "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": SKYWORK_GEMMA2_27B,
}
"""Hub id -> its config, as `hub_cache` lays them out."""


def hub_cache(root, configs=None):
    """A Hugging Face Hub cache under `root` holding only each repo's config.json (as `huggingface_hub` lays a
    cache out: `models--ORG--NAME/refs/main` naming a snapshot), so offline look-ups find them; returns `root`."""
    import json
    from pathlib import Path

    root = Path(root)
    for n, (repo, config) in enumerate((configs or HUB_CONFIGS).items()):
        commit = f"{n:040x}"
        folder = root / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))
    return root
