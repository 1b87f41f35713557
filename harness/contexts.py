"""The `max_model_len` each local vLLM engine of a run starts with: the longest request the run makes of it.

vLLM sizes an engine's KV cache for one `max_model_len` sequence at least, and refuses to start when the cache
cannot hold it (`harness.vllm_memory`); left unset, `max_model_len` is the model's own limit (40,960 for Qwen3),
many times what a run asks. So before any engine starts, the runner (and `harness plan`) gives each local vLLM
engine without a `max_model_len` its longest request (`fit_contexts`):

- **What a model reads** (`Ask`, per row and model, from the loaded items): an evaluator's models the item's
  prompt and every response (the DR-Generator's request quotes them all; a verifier or pairwise judge reads
  fewer, so this bounds theirs), plus the rubric a verifier quotes (`gen_max_tokens`); a policy its messages; a
  policy table's judge the messages, every text of the item's meta (a reference or baseline answer, a
  checklist, criteria) and the answer it judges (the generation's `max_tokens`).
- **Counted with the engine's own tokenizer** where it loads from the checkpoint (a folder, or the Hub cache),
  else as UTF-8 bytes: a byte-level BPE or a SentencePiece tokenizer with byte fallback never makes more tokens
  than bytes (each merge joins two tokens into one), so bytes bound the count from above.
- **Plus what is not in the items**: `TEMPLATE_TOKENS` (the longest prompt template, Arena-Hard's system and user
  messages, is 1.6K characters of English: ~400 tokens; the chat template's markup; a re-ask's instructions
  and complaint), `PART_TOKENS` for each quoted text's label and separators, and a re-ask's copy of the first
  answer (one more `max_tokens`: judges re-ask once, with their first answer in the chat).
- **Completion**: the largest `max_tokens` the row asks of the model (the DR-Generator's `gen_max_tokens`, a
  verification sheet's `verify_max_tokens` x `RUBRIC_ITEMS`, a judge's `max_tokens`, the generation's).

`max_model_len` = prompt + completion (`harness.vllm_memory.context_length`), never past the model's own limit
(`max_position_embeddings`): where the bound exceeds it, the limit stands (vLLM takes no longer request anyway).
A `max_model_len` the config or the command line sets is kept. Should a request exceed the count after all, the
`vllm` backend records it as a failure ("prompt has N tokens; the model's context is M") or gives its completion
what the context leaves; the bound is built so that neither happens.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TEMPLATE_TOKENS = 1024
"""Tokens of a request that are not the item's: the prompt template, the chat template's markup and a re-ask's
instructions and complaint (see the module docstring)."""
PART_TOKENS = 8
"""Tokens around each quoted text: its label (`[Response A]`) and separators."""
RUBRIC_ITEMS = 20
"""Items of the longest rubric (the rubric schema's bound, `judges.rubric.MAX_ITEMS`): a verification sheet's
budget is `verify_max_tokens` x this."""
PROBE = "The longest request."
"""A text any real tokenizer makes tokens of."""
ENCODE_BATCH = 256
"""Texts a tokenizer encodes per call."""


@dataclass(frozen=True, slots=True)
class Ask:
    """What one row asks of one model at most, per item."""

    texts: Sequence[tuple[str, ...]]
    """Per item: the texts one request quotes whole."""
    quoted: int
    """Tokens a request quotes besides the item's (a rubric, an answer it judges)."""
    max_tokens: int
    """The largest completion budget."""
    reask: bool = True
    """Whether a parse failure re-asks with the first answer in the chat (one more `max_tokens` read)."""


@dataclass(frozen=True, slots=True)
class Context:
    """The `max_model_len` one engine starts with, and how it was found."""

    key: str
    prompt_tokens: int
    """The longest prompt the run makes of it: the items' texts counted, and the allowances."""
    max_tokens: int
    max_model_len: int
    counted_with: str
    """The tokenizer the texts were counted with, or `UTF-8 bytes` (an upper bound)."""
    model_limit: int | None = None
    """The model's own limit where `max_model_len` was held to it (the bound exceeded it)."""

    def describe(self) -> str:
        """One line, as `harness plan` prints it."""
        held = (f"; held to the model's limit of {self.model_limit}" if self.model_limit is not None else "")
        return (f"max_model_len {self.max_model_len}: the run's longest request, {self.prompt_tokens} prompt + "
                f"{self.max_tokens} completion tokens (texts counted with {self.counted_with}; templates and a "
                f"re-ask's first answer included){held}")


def _budget(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def evaluator_ask(evaluator: Any, items: Iterable[Any]) -> Ask:
    """What an evaluator asks of each of its models at most (see the module docstring)."""
    settings = evaluator.settings if isinstance(getattr(evaluator, "settings", None), Mapping) else {}
    rubric = _budget(getattr(evaluator, "gen_max_tokens", 0))
    budget = max(rubric, _budget(getattr(evaluator, "verify_max_tokens", 0)) * RUBRIC_ITEMS,
                 _budget(getattr(evaluator, "max_tokens", 0)), _budget(settings.get("max_tokens")), 1)
    return Ask([(item.prompt, *item.responses) for item in items], rubric, budget)


def policy_asks(items: Iterable[Any], *, max_tokens: int, judge_max_tokens: int | None) -> tuple[Ask, Ask | None]:
    """What a policy and its judge ask at most of one benchmark's items (the judge: None without one)."""
    items = list(items)
    policy = Ask([tuple(m.content for m in item.messages) for item in items], 0, max_tokens, reask=False)
    if judge_max_tokens is None:
        return policy, None
    quoted = [tuple(m.content for m in item.messages) + _meta_texts(item.meta) for item in items]
    return policy, Ask(quoted, max_tokens, max(1, judge_max_tokens))


def _meta_texts(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """Every text of an item's meta a judge may quote (a reference or baseline answer, a checklist, criteria): a
    superset, which bounds the count from above."""
    return tuple(v if isinstance(v, str) else str(v) for v in meta.values()
                 if isinstance(v, str) or isinstance(v, (list, tuple)))


def run_asks(plan: Any, ready: Any, key_of: Callable[[Any], str]) -> dict[str, list[Ask]]:
    """Pool key -> what the run's rows ask of that model (`plan` a `RunPlan`, `ready` its `Prepared`; `key_of`
    the pool's key of a backend)."""
    found: dict[str, list[Ask]] = {}
    for bench, items in ready.items.items():
        if plan.policy:
            judge = ready.judges.get(bench)
            settings = getattr(judge, "settings", None)
            judge_budget = (_budget(settings.get("max_tokens")) or 1) if isinstance(settings, Mapping) else 1
            judged = judge is not None and ready.judge_backend is not None
            for backend in ready.policies.values():
                policy, asked = policy_asks(items, max_tokens=plan.generation.max_tokens,
                                            judge_max_tokens=judge_budget if judged else None)
                found.setdefault(key_of(backend), []).append(policy)
                if asked is not None:
                    found.setdefault(key_of(ready.judge_backend), []).append(asked)
        else:
            for spec, evaluator in ready.evaluators.items():
                ask = evaluator_ask(evaluator, items)
                for key in ready.needs.get(spec, ()):
                    found.setdefault(key, []).append(ask)
    return found


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """Counts tokens of many texts at once."""

    counted_with: str
    count: Callable[[Sequence[str]], list[int]]


def utf8_bytes() -> TokenCounter:
    """The bound that needs no tokenizer: a text's UTF-8 bytes."""
    return TokenCounter("UTF-8 bytes (an upper bound)", lambda texts: [len(t.encode("utf-8")) for t in texts])


def token_counter(path: str, *, revision: str | None = None) -> TokenCounter:
    """The tokenizer of the checkpoint at `path` (a folder or a Hub id, from the cache), else `utf8_bytes`."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
        if not tokenizer(PROBE, add_special_tokens=False)["input_ids"]:
            # transformers 5 builds an empty tokenizer where a checkpoint has a config but no vocabulary files
            raise ValueError(f"its tokenizer makes no tokens of {PROBE!r} (no vocabulary files)")
    except Exception as exc:  # noqa: BLE001 - no tokenizer files, no transformers, offline: the bound stands
        log.debug("counting %s's prompts as UTF-8 bytes (its tokenizer did not load: %s)", path,
                 str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return utf8_bytes()
    tokenizer.model_max_length = int(1e30)  # a long text is what is being measured: no warning about it

    def count(texts: Sequence[str]) -> list[int]:
        out: list[int] = []
        for start in range(0, len(texts), ENCODE_BATCH):
            chunk = list(texts[start:start + ENCODE_BATCH])
            out += [len(ids) for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]]
        return out

    return TokenCounter(f"{path}'s tokenizer", count)


def longest_tokens(items: Sequence[tuple[str, ...]], counter: TokenCounter, *, per_part: int = 0) -> int:
    """The most tokens any item's texts make together (`per_part` more for each text); 0 for no items.

    Only the items that can still be the longest are counted: a text makes at most its UTF-8 bytes in tokens
    (and one more for a SentencePiece tokenizer's leading `▁`), so the items are taken by that bound, longest
    first, until the next one's bound cannot reach the longest count so far.
    """
    def bound(parts: tuple[str, ...]) -> int:
        return sum(len(t.encode("utf-8")) + 1 + per_part for t in parts)

    ranked = sorted(((bound(parts), parts) for parts in items), key=lambda pair: pair[0], reverse=True)
    tokens: dict[str, int] = {}
    best = 0
    for start in range(0, len(ranked), ENCODE_BATCH):
        chunk = ranked[start:start + ENCODE_BATCH]
        if chunk[0][0] <= best:
            break
        fresh = list({t for _, parts in chunk for t in parts if t not in tokens})
        tokens.update(zip(fresh, counter.count(fresh)))
        best = max(best, *(sum(tokens[t] + per_part for t in parts) for _, parts in chunk))
    return best


def longest_request(asks: Sequence[Ask], counter: TokenCounter) -> tuple[int, int]:
    """(longest prompt, its completion budget) over `asks`, in tokens, allowances included: the request for
    which prompt + completion is largest; (0, 0) without items."""
    best = (0, 0)
    for ask in asks:
        longest = longest_tokens(ask.texts, counter, per_part=PART_TOKENS)
        if not ask.texts:
            continue
        prompt = longest + TEMPLATE_TOKENS + ask.quoted + (ask.max_tokens if ask.reask else 0)
        if prompt + ask.max_tokens > sum(best):
            best = (prompt, ask.max_tokens)
    return best


def fit_contexts(pool: Any, asks: Mapping[str, Sequence[Ask]], *,
                 counter: Callable[[Any], TokenCounter] | None = None) -> dict[str, Context]:
    """Give each local vLLM engine among `asks` without a `max_model_len` its longest request (module
    docstring); returns key -> `Context` of each engine given one.

    Args:
        counter: The engine's `TokenCounter` from its backend (default: `token_counter` of its checkpoint).

    Raises:
        ConfigError: a request count below 1 (`context_length`).
    """
    from harness.errors import ConfigError
    from harness.vllm_memory import context_length, model_limit
    from harness.weights import read_config

    fitted = {}
    for key, wanted in sorted(asks.items()):
        backend = pool.backend(key)
        inner = backend.backend
        if not backend.local or inner.kind != "vllm" or inner.options.max_model_len is not None:
            continue
        source = inner.source
        counting = counter(inner) if counter is not None else token_counter(source.path, revision=source.revision)
        prompt, budget = longest_request(wanted, counting)
        if not prompt:
            continue
        try:
            limit = model_limit(read_config(source.path, revision=source.revision))
        except ConfigError:
            limit = None  # the engine's own start names what is wrong with the checkpoint
        length = context_length(prompt, budget)
        held = limit if limit is not None and length > limit else None
        length = min(length, held or length)
        inner.options = dataclasses.replace(inner.options, max_model_len=length)
        fitted[key] = Context(key, prompt, budget, length, counting.counted_with, held)
    return fitted
