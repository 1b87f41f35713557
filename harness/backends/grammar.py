"""One grammar per `Constraint`, in llguidance's Lark dialect, for every local backend.

`hf` masks its logits with an llguidance matcher built from it (`TokenMask`); `vllm` passes the same text to its
`guidance` structured-output backend (llguidance too), so both local backends decode under the same grammar.

The grammar is `start: [think] ws body`: an optional reasoning block `<think>...</think>` when the constraint
allows one (`Constraint.think`: thinking models keep their reasoning and the constraint applies after it), then
optional whitespace, then the body: the JSON schema inlined with `%json` (compact: `, ` and `: ` separators and no
other whitespace between tokens), the regex as one lexeme, or the choices as alternatives. llguidance is imported inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import json
from typing import Any

from harness.backends.base import Constraint
from harness.errors import BackendUnavailableError, ConfigError

THINK_RULES = 'think: "<think>" thought\nthought[suffix="</think>"]: /(.|\\n)*/\n'


def lark_grammar(constraint: Constraint) -> str:
    """The constraint as an llguidance Lark grammar (see the module docstring)."""
    if constraint.kind == "json_schema":
        # Compact JSON (no free whitespace between tokens): a model cannot spend its budget on blank lines.
        schema = {**constraint.schema, "x-guidance": {"whitespace_flexible": False, "key_separator": ": ",
                                                      "item_separator": ", "}}
        body = "body: %json " + json.dumps(schema, sort_keys=True)
    elif constraint.kind == "regex":
        body = "body: BODY\nBODY: /" + constraint.spec.replace("/", "\\/") + "/"
    else:
        body = "body: " + " | ".join(json.dumps(o) for o in constraint.options)
    head = "start: think? /[ \\t\\r\\n]*/ body\n" + THINK_RULES if constraint.think else "start: body\n"
    return head + body + "\n"


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
    except ImportError:
        raise BackendUnavailableError(
            "structured output on the hf backend needs llguidance: pip install llguidance (in the `hf` extra)"
        ) from None
    return llguidance


class TokenMask:
    """Builds llguidance matchers for one tokenizer (the tokenizer's token table is converted once)."""

    def __init__(self, tokenizer: Any) -> None:
        llg = _llguidance()
        self._llg = llg
        self.tokenizer = llg.hf.from_tokenizer(tokenizer)
        self.vocab_size: int = self.tokenizer.vocab_size
        self._grammars: dict[Constraint, str] = {}

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for one generated sequence.

        Raises:
            ConfigError: a constraint llguidance cannot compile (an invalid schema or regex), with its message.
        """
        grammar = self._grammars.get(constraint)
        if grammar is None:
            grammar = self._grammars[constraint] = self._llg.LLMatcher.grammar_from_lark(lark_grammar(constraint))
        matcher = self._llg.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise ConfigError(f"cannot compile the {constraint.kind} constraint: {matcher.get_error()}")
        return matcher

    @property
    def words(self) -> int:
        """int32 words of one row's bitmask (32 tokens per word)."""
        return (self.vocab_size + 31) // 32

    def fill(self, matcher: Any, row: Any) -> None:
        """Write the tokens the matcher allows next into `row`, a contiguous int32 CPU tensor of `words` words
        (bit b of word w: token 32 w + b)."""
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
