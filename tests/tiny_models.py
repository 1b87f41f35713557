"""Tiny tokenizers for tests that build random models from a config (no downloads)."""

from __future__ import annotations

from collections.abc import Sequence

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
):
    """A small Metaspace BPE tokenizer trained on `corpus`: pad `<pad>`, unk `<unk>`, eos `<|im_end|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), initial_alphabet=[chr(c) for c in range(32, 127)]
    )
    raw.train_from_iterator(list(corpus) * 5, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>", bos_token=bos
    )
    if chat_template:
        tok.chat_template = CHATML
    return tok
