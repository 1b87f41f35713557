"""The chat-completions format as servers differ in it: the fields a request is written in, and the reading of
the answers.

Requests: a structured-output constraint in each of `STRUCTURED_FORMS` (`structured_fields`), a prefilled
assistant turn in each of `PREFILL_FORMS` (`prefill_fields`); which form a server takes is probed by
`harness.backends.openai_backend`.

Answers: each reader takes the JSON body the transport returned (`harness.backends.openai_transport`) and gives
back what it holds, or says why it is not a usable completion (a message, or a `Failure` with its category):

- `choice_texts`: every choice's text in index order; a body without a usable completion is MALFORMED_RESPONSE
  to the caller.
- `choice_logprobs`: token logprobs of generated text (asked for with `logprobs: true, top_logprobs: k`), read
  from `choices[i].logprobs.content`: `token` is the entry's text (decoded from its `bytes` when every entry has
  them, so a character split over tokens goes to the token that completes it), `top` its `top_logprobs` (the
  larger value when a text repeats). When the tokens reach past the text (a server that reports the token
  holding a stop string), tokens that start at or after the text's end are dropped. An answer without them is
  UNSUPPORTED.
- `first_token_alternatives` and `match_candidates`: the next-token distribution a judge reads candidates from.
- `kept_constraint`: whether an answer keeps to a structured-output constraint (how a server that ignores a form
  it does not know is found out).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from harness.backends.base import Constraint, TokenLogprob
from harness.errors import Failure, FailureCategory

STRUCTURED_FORMS: dict[str, tuple[str, ...]] = {
    "json_schema": ("json_schema", "json_object_schema"),
    "regex": ("structured_outputs", "guided", "gbnf"),
    "choice": ("structured_outputs", "guided", "gbnf"),
}
"""How a constraint can be sent, in the order tried: OpenAI's `response_format` `json_schema`; the
`{"type": "json_object", "schema": ...}` extension (llama.cpp's servers); vLLM's `structured_outputs` field and
its older `guided_regex` / `guided_choice` fields (vLLM, SGLang); a GBNF `grammar` (llama.cpp's servers,
`harness.backends.grammar.gbnf_grammar`)."""


STRUCTURED_FIELD_NAMES: dict[str, tuple[str, ...]] = {
    "json_schema": ("response_format", "json_schema", "json schema"),
    "json_object_schema": ("response_format", "json_object"),
    "structured_outputs": ("structured_outputs", "structured output"),
    "guided": ("guided",),
    "gbnf": ("grammar", "gbnf"),
}
"""Words by which an error names the field of a form: an HTTP error that names it refuses the form; one that
names none is the server failing (or the request being wrong), which says nothing about the form."""


def structured_fields(constraint: Constraint, form: str) -> dict[str, Any]:
    """The request-body fields that send `constraint` in `form` (see `STRUCTURED_FORMS`).

    Raises:
        ConfigError: when the constraint cannot be written in that form (a regex outside GBNF's reach).
    """
    if form == "json_schema":
        schema = {"name": constraint.name, "schema": constraint.schema, "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if form == "json_object_schema":
        return {"response_format": {"type": "json_object", "schema": constraint.schema}}
    value: Any = constraint.options if constraint.kind == "choice" else constraint.spec
    if form == "structured_outputs":
        return {"structured_outputs": {constraint.kind: value}}
    if form == "guided":
        return {f"guided_{constraint.kind}": value}
    if form == "gbnf":
        from harness.backends.grammar import gbnf_grammar

        return {"grammar": gbnf_grammar(constraint)}  # ConfigError for a regex GBNF cannot say
    raise ValueError(f"unknown structured-output form {form!r}")


PREFILL_FORMS = ("continue_final_message", "prefix_flag", "trailing_message")
"""How a prefilled assistant turn can be sent, in the order probed: a trailing assistant message with vLLM's and
SGLang's `continue_final_message: true, add_generation_prompt: false`; with DeepSeek's `prefix: true` on the
message (its beta endpoint); the trailing message alone (servers that continue it by themselves)."""


def prefill_fields(
    messages: list[dict[str, Any]], prefix: str, form: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and extra body fields that send `prefix` as a prefilled assistant turn in `form`."""
    turn: dict[str, Any] = {"role": "assistant", "content": prefix}
    if form == "continue_final_message":
        return [*messages, turn], {"continue_final_message": True, "add_generation_prompt": False}
    if form == "prefix_flag":
        return [*messages, {**turn, "prefix": True}], {}
    if form == "trailing_message":
        return [*messages, turn], {}
    raise ValueError(f"unknown prefill form {form!r}")


_THINK_BLOCK = re.compile(r"\s*<think>.*?</think>\s*", re.DOTALL)


def kept_constraint(payload: dict[str, Any], constraint: Constraint) -> tuple[bool | None, str]:
    """Whether the first choice of `payload` keeps to `constraint` (True), breaks it, so the server ignored it
    (False, with why), or cannot tell (None: an answer cut at max_tokens, a regex Python cannot compile)."""
    texts = choice_texts(payload, len(payload.get("choices") or ()) or 1)
    if isinstance(texts, str) or payload["choices"][0].get("finish_reason") == "length":
        return None, ""
    text = texts[0]
    if constraint.think:
        text = _THINK_BLOCK.sub("", text, count=1) if text.lstrip().startswith("<think>") else text.lstrip()
    if constraint.kind == "choice":
        return (True, "") if text in constraint.options else (False, f"{text[:60]!r} is none of the choices")
    if constraint.kind == "regex":
        try:
            matched = re.fullmatch(constraint.spec, text)
        except re.error:
            return None, ""
        return (True, "") if matched else (False, f"{text[:60]!r} does not match the pattern")
    try:
        json.loads(text)
    except ValueError:
        return False, f"{text[:60]!r} is not JSON"
    return True, ""


def choice_texts(payload: dict[str, Any], n: int) -> tuple[str, ...] | str:
    """The text of every choice in index order, or a message saying why the body is not a completion."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        if isinstance(payload.get("error"), dict):
            return f"server answered 200 with an error: {payload['error'].get('message', payload['error'])}"
        return "response has no choices"
    if len(choices) != n:
        return f"asked for {n} choices, got {len(choices)} (the server may not support n > 1)"
    try:
        ordered = sorted(choices, key=lambda c: int(c.get("index", 0)))
        texts = tuple(c["message"]["content"] for c in ordered)
    except (TypeError, KeyError, ValueError, AttributeError):
        return "a choice lacks message.content or a valid index"
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            return f"choice {i} has no text content (content is {text!r}: a refusal or tool call?)"
    return texts


def choice_logprobs(
    payload: dict[str, Any], texts: tuple[str, ...], k: int
) -> tuple[tuple[TokenLogprob, ...], ...] | Failure:
    """The token logprobs of every choice in index order (`texts` from `choice_texts`), or why not."""
    ordered = sorted(payload["choices"], key=lambda c: int(c.get("index", 0)))
    result = []
    for i, (choice, text) in enumerate(zip(ordered, texts)):
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(content, list):
            return Failure(
                FailureCategory.UNSUPPORTED,
                f"the server did not return token logprobs for choice {i} (asked with logprobs=true, "
                f"top_logprobs={k}; it may not support them for this model)",
            )
        tokens = _token_logprobs(content, text, k)
        if isinstance(tokens, str):
            return Failure(FailureCategory.MALFORMED_RESPONSE, f"choice {i}: {tokens}")
        result.append(tokens)
    return tuple(result)


def _token_logprobs(content: list[Any], text: str, k: int) -> tuple[TokenLogprob, ...] | str:
    """TokenLogprobs of one choice's `logprobs.content` (see the module docstring), or what is wrong."""
    pieces: list[str] = []
    values: list[tuple[float, dict[str, float]]] = []
    for n, entry in enumerate(content):
        if not isinstance(entry, dict) or not _token_entry(entry):
            return f"logprobs.content[{n}] lacks a token or a numeric logprob"
        top: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or ():
            if isinstance(alt, dict) and _token_entry(alt):
                top[alt["token"]] = max(float(alt["logprob"]), top.get(alt["token"], -math.inf))
        pieces.append(entry["token"])
        values.append((float(entry["logprob"]), dict(sorted(top.items(), key=lambda t: -t[1])[:k])))
    raw = [entry.get("bytes") for entry in content]
    if raw and all(isinstance(b, list) and all(type(x) is int and 0 <= x < 256 for x in b) for b in raw):
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pieces = [decoder.decode(bytes(b)) for b in raw]
        pieces[-1] += decoder.decode(b"", final=True)
    keep = len(pieces)
    if "".join(pieces).startswith(text):  # otherwise the offsets mean nothing: keep every token
        keep = offset = 0
        while keep < len(pieces) and offset < len(text):
            offset += len(pieces[keep])
            keep += 1
    return tuple(TokenLogprob(piece, *value) for piece, value in zip(pieces[:keep], values))


def _token_entry(entry: dict[str, Any]) -> bool:
    """Whether `entry` has a string `token` and a numeric `logprob`."""
    logprob = entry.get("logprob")
    numeric = isinstance(logprob, (int, float)) and not isinstance(logprob, bool)
    return numeric and isinstance(entry.get("token"), str)


def first_token_alternatives(payload: dict[str, Any]) -> list[tuple[str, float]] | Failure:
    """(token, logprob) pairs ranked at the first generated position: `top_logprobs` and the chosen token."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Failure(FailureCategory.MALFORMED_RESPONSE, "response has no choices")
    logprobs = choices[0].get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return Failure(
            FailureCategory.UNSUPPORTED,
            "the server did not return logprobs (it may not support logprobs/top_logprobs for this model)",
        )
    first = content[0]
    entries = [*(first.get("top_logprobs") or []), first]
    pairs = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        token, logprob = entry.get("token"), entry.get("logprob")
        if isinstance(token, str) and isinstance(logprob, (int, float)) and not isinstance(logprob, bool):
            pairs.append((token, float(logprob)))
    if not pairs:
        return Failure(FailureCategory.MALFORMED_RESPONSE, "logprobs have no (token, logprob) entries")
    return pairs


def match_candidates(
    alternatives: Sequence[tuple[str, float]], candidates: Sequence[str]
) -> dict[str, float]:
    """Each candidate's log-probability among `alternatives`, comparing without leading whitespace.

    Several tokens can match one candidate (`Yes`, ` Yes`): the largest logprob wins. Unlisted -> `-inf`.
    """
    best: dict[str, float] = {}
    for token, logprob in alternatives:
        key = token.lstrip()
        if logprob > best.get(key, -math.inf):
            best[key] = logprob
    return {c: best.get(c.lstrip(), -math.inf) for c in candidates}
