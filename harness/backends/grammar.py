"""One grammar per `Constraint`, in llguidance's Lark dialect, for every local backend (and GBNF for llama.cpp's
servers, `gbnf_grammar`).

`hf` masks its logits with an llguidance matcher built from it (`TokenMask`); `vllm` passes the same text to its
`guidance` structured-output backend (llguidance too), so both local backends decode under the same grammar.

The grammar is `start: [think] ws body`: an optional reasoning block `<think>...</think>` when the constraint
allows one (`Constraint.think`: thinking models keep their reasoning and the constraint applies after it), then
optional whitespace, then the body: the constraint's own Lark grammar where it has one (`Constraint.lark`), else
the JSON schema inlined with `%json` (compact: `, ` and `: ` separators and no other whitespace between tokens), the regex as one lexeme, or the choices as alternatives. llguidance is imported inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import json
from typing import Any

from harness.backends.base import Constraint
from harness.errors import BackendUnavailableError, ConfigError

THINK_RULES = 'think: "<think>" thought\nthought[suffix="</think>"]: /(.|\\n)*/\n'


def lark_grammar(constraint: Constraint) -> str:
    """The constraint as an llguidance Lark grammar (see the module docstring)."""
    if constraint.lark:
        body = constraint.lark.rstrip("\n")
    elif constraint.kind == "json_schema":
        # Compact JSON (no free whitespace between tokens): a model cannot spend its budget on blank lines.
        schema = {**constraint.schema, "x-guidance": {"whitespace_flexible": False, "key_separator": ": ",
                                                      "item_separator": ", "}}
        body = "body: %json " + json.dumps(schema)  # property order kept: the model writes them in this order
    elif constraint.kind == "regex":
        body = "body: BODY\nBODY: /" + constraint.spec.replace("/", "\\/") + "/"
    else:
        body = "body: " + " | ".join(json.dumps(o) for o in constraint.options)
    head = "start: think? /[ \\t\\r\\n]*/ body\n" + THINK_RULES if constraint.think else "start: body\n"
    return head + body + "\n"


def gbnf_grammar(constraint: Constraint) -> str:
    """The constraint as a GBNF grammar (llama.cpp's servers: the `grammar` request field), for a choice or a
    regex of the common subset: literals and escapes, `.`, classes `[...]`, groups `(...)` / `(?:...)`,
    alternation and the quantifiers `? * + {m} {m,} {m,n}`. The reasoning block is not part of it (servers apply
    a constraint to the answer their reasoning parser leaves).

    Raises:
        ConfigError: for a JSON schema (servers take those as JSON-schema fields) or a regex outside the subset.
    """
    if constraint.kind == "choice":
        return "root ::= " + " | ".join(_gbnf_literal(o) for o in constraint.options) + "\n"
    if constraint.kind != "regex":
        raise ConfigError("a JSON schema is not sent as GBNF (servers take it in a response_format field)")
    parser = _RegexToGbnf(constraint.spec)
    body = parser.alternation()
    if parser.pos != len(parser.text):
        raise ConfigError(f"unbalanced ')' at {parser.pos} in the regex {constraint.spec!r}")
    return f"root ::= {body}\n"


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # GBNF strings take JSON's escapes (\n, \", \\)


class _RegexToGbnf:
    """A recursive-descent translation of the regex subset `gbnf_grammar` names (runs of plain characters become
    one string literal)."""

    _ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
    _CLASS_ESCAPES = "nrt\\]-^["

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def _fail(self, what: str) -> ConfigError:
        return ConfigError(f"the regex {self.text!r} uses {what} (at {self.pos}), which has no GBNF translation")

    def alternation(self) -> str:
        branches = [self.sequence()]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else "(" + " | ".join(b or '""' for b in branches) + ")"

    def sequence(self) -> str:
        parts: list[str] = []
        literal = ""  # plain characters not yet written
        while self.pos < len(self.text) and self.text[self.pos] not in "|)":
            atom, is_char = self.atom()
            quantifier = self.quantifier()
            if is_char and not quantifier:
                literal += atom
                continue
            if literal:
                parts.append(_gbnf_literal(literal))
                literal = ""
            parts.append((_gbnf_literal(atom) if is_char else atom) + quantifier)
        if literal:
            parts.append(_gbnf_literal(literal))
        return " ".join(parts)

    def atom(self) -> tuple[str, bool]:
        """The next atom: (a plain character, True) or (a GBNF expression, False)."""
        text, n = self.text, len(self.text)
        c = text[self.pos]
        self.pos += 1
        if c == "(":
            if text.startswith("?:", self.pos):
                self.pos += 2
            elif text.startswith("?", self.pos):
                raise self._fail("a group extension")
            inner = self.alternation()
            if self.pos >= n or text[self.pos] != ")":
                raise self._fail("an unclosed group")
            self.pos += 1
            return f"({inner or chr(34) * 2})", False
        if c == "[":
            i = self.pos + (self.pos < n and text[self.pos] == "^")
            i += i < n and text[i] == "]"  # a leading "]" is a member
            while i < n and text[i] != "]":
                if text[i] == "\\":
                    if i + 1 >= n or text[i + 1] not in self._CLASS_ESCAPES:
                        raise self._fail("an escape inside a class other than \\n \\r \\t \\\\ \\] \\- \\^ \\[")
                    i += 1
                i += 1
            if i >= n:
                raise self._fail("an unclosed class")
            body, self.pos = text[self.pos:i], i + 1
            return f"[{body}]", False
        if c == ".":
            return "[^\\n]", False
        if c == "\\":
            if self.pos >= n:
                raise self._fail("a trailing backslash")
            e = text[self.pos]
            self.pos += 1
            if e in self._ESCAPES:
                return self._ESCAPES[e], True
            if e.isalnum():
                raise self._fail(f"the escape \\{e}")
            return e, True
        if c in "^$":
            raise self._fail("an anchor")
        if c in "?*+{":
            raise self._fail("a quantifier with nothing before it")
        return c, True

    def quantifier(self) -> str:
        if self.pos >= len(self.text):
            return ""
        c = self.text[self.pos]
        if c in "?*+":
            self.pos += 1
            if self.pos < len(self.text) and self.text[self.pos] in "?+":
                raise self._fail("a lazy or possessive quantifier")
            return c
        if c == "{":
            end = self.text.find("}", self.pos)
            counts = [x.strip() for x in self.text[self.pos + 1:end].split(",")] if end > 0 else []
            if not 1 <= len(counts) <= 2 or not counts[0].isdigit() or not all(x.isdigit() or not x for x in counts):
                raise self._fail("a malformed {m,n}")
            self.pos = end + 1
            return "{" + ",".join(counts) + "}"
        return ""


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
        self._executor: Any = None
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

    def fill_rows(self, matchers: list[tuple[Any, int]], bitmask: Any) -> None:
        """Write the masks of several matchers at once: each (matcher, row) into that row of `bitmask` (a contiguous
        int32 CPU tensor of rows x `words`), in llguidance's thread pool, without the GIL."""
        import llguidance.torch

        if self._executor is None:
            self._executor = self._llg.LLExecutor()
        llguidance.torch.fill_next_token_bitmask_par(self._executor, matchers, bitmask)
