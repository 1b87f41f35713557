"""Tiny tokenizers and random causal LMs built from a config, for tests (no downloads)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(
    corpus: Sequence[str],
    *,
    vocab_size: int,
    specials: Sequence[str],
    bos: str,
    chat_template: bool = True,
    byte_level: bool = False,
):
    """A small BPE tokenizer trained on `corpus`: pad `<pad>`, unk `<unk>`, eos `<|im_end|>`.

    Metaspace (SentencePiece-style spaces) by default; `byte_level` makes it GPT-2-style byte-level, the kind
    grammar libraries read (SmolLM2, Qwen3)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token=None if byte_level else "<unk>"))
    if byte_level:
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        raw.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        raw.decoder = decoders.Metaspace()
        alphabet = [chr(c) for c in range(32, 127)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), initial_alphabet=alphabet)
    raw.train_from_iterator(list(corpus) * 5, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>", bos_token=bos
    )
    if chat_template:
        tok.chat_template = CHATML
    return tok


CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Is the answer Yes or No? Yes. No. Maybe.",
    "Hello, world! How are you today? I am fine, thank you.",
    "User: Assistant: System: one two three four five six seven eight nine ten",
)


def build_tiny_lm(
    path: Path,
    *,
    seed: int = 0,
    chat_template: bool = True,
    context: int = 256,
    arch: str = "llama",
    head_dim: int | None = None,
    byte_level: bool = False,
    corpus: Sequence[str] = CORPUS,
) -> Path:
    """Save a tiny random causal LM (hidden 64, 2 layers) with a small readable tokenizer into `path`.

    `corpus`: what the tokenizer is trained on (texts in it become few tokens).

    `arch`: `llama`, or `gemma3` (one sliding-window layer of width 8 and one global layer: a hybrid KV cache).
    `head_dim`: the llama's attention head width (default hidden / heads = 16; vLLM's CPU attention needs 32 or
    more, so its tests pass 32).
    `byte_level`: a byte-level tokenizer (see `tiny_tokenizer`), for structured-output tests.
    """
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer(
        corpus,
        vocab_size=400 if byte_level else 220,
        specials=["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"],
        bos="<|im_start|>",
        chat_template=chat_template,
        byte_level=byte_level,
    )
    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        initializer_range=0.3,  # well-separated logits, so argmax never hinges on rounding
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, **({"head_dim": head_dim} if head_dim else {})))
    elif arch == "gemma3":
        config = Gemma3TextConfig(
            **common, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
        )
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(f"unknown arch {arch!r}")
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


RM_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Is the answer Yes or No? Yes. No. Maybe.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Other candidate responses for reference: [Candidate 1] [Candidate 2]",
)


def build_tiny_rm(
    path: Path,
    *,
    chat_template: bool = True,
    pad: bool = True,
    causal: bool = False,
    seed: int = 0,
    head_dim: int | None = None,
) -> Path:
    """Save a tiny random Llama reward model (hidden 32, 2 layers, context 128) and its tokenizer into `path`.

    A `LlamaForSequenceClassification` with `num_labels=1` (`pad=False`: its config has no `pad_token_id`), or,
    with `causal`, a `LlamaForCausalLM` read by the `lm-token0` head. `head_dim` as in `build_tiny_lm`.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tok = tiny_tokenizer(
        RM_CORPUS,
        vocab_size=200,
        specials=["<pad>", "<unk>", "<s>", "<|im_start|>", "<|im_end|>"],
        bos="<s>",
        chat_template=chat_template,
    )
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tok.pad_token_id if pad else None,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=0.3,
        **({"head_dim": head_dim} if head_dim else {}),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config) if causal else LlamaForSequenceClassification(config)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path
