"""A thinking model's reasoning taken out of its answer: what a judge, a verifier or a rubric generator sees.

One function for every reader of a policy's answers: the policy tables (`judges.policy`) and training, whose frozen
models read the generator's response sets and the policy's completions (`training.grpo.read_sets`,
`training.rewards.PolicyReward`). This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import re

_OPEN, _CLOSE = "<think>", "</think>"
_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_thinking(text: str) -> str:
    """The answer a judge sees: `text` without its reasoning.

    Every `<think>...</think>` block goes; text before a `</think>` without an opening tag goes too (chat
    templates that open the block in the prompt, as Qwen3's); an opening tag never closed (the budget ran out
    while reasoning) cuts the rest, so the judge sees whatever came before it, usually nothing. Surrounding
    whitespace is stripped.
    """
    text = _BLOCK.sub("", text)
    if _CLOSE in text:
        text = text[text.rfind(_CLOSE) + len(_CLOSE):]
    if _OPEN in text:
        text = text[: text.find(_OPEN)]
    return text.strip()
