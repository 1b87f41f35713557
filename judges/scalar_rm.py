"""`scalar-rm`: a scalar reward model scores each response of a set on its own (the paper's RM baselines).

Spec: `scalar-rm:model=NAME[,with_responses=true][,head=classifier|lm-token0][,batch_size=8][,max_length=8192]
[,dtype=auto][,device=auto]`. NAME is a hub id (optionally `repo@revision`) or a local checkpoint folder; a
leading `hf:` is accepted and dropped; a model alias (`smollm2-135m`) resolves to its converted checkpoint. Examples: `scalar-rm:model=Skywork/Skywork-Reward-Gemma-2-27B-v0.2`
and, for the "w/ responses" rows, the same with `with_responses=true`.

How a response is scored:
- The conversation `[user: prompt, assistant: response]` is rendered with the tokenizer's chat template
  (`add_generation_prompt=False`: the conversation ends with the scored assistant turn) and tokenized without
  adding special tokens (the template writes any BOS itself). A tokenizer without a template gets the plain
  text `User: {prompt}\\n\\nAssistant: {response}`, tokenized with special tokens.
- `head=classifier` (default): an `AutoModelForSequenceClassification` checkpoint with `num_labels=1`
  (Skywork-Reward, most open RMs); the score is the logit, read where the model's own head reads it (the last
  token that is not the pad token). A checkpoint whose `config.architectures` is not a sequence classifier is
  refused: transformers would otherwise attach a randomly initialised head and return noise.
- `head=lm-token0`: a causal LM whose reward is the next-token logit of token id 0 after the whole
  conversation, the convention of `nvidia/Llama-3.1-Nemotron-70B-Reward-HF` (a `LlamaForCausalLM` checkpoint,
  not a classifier).
- The score is the raw logit (float32), uncalibrated: only differences between responses to the same prompt
  mean anything. A non-finite logit is a failure, not a score.

"w/ responses" (`with_responses=true`) is our construction of the paper's baseline, whose exact input format
the paper does not give. The user turn shown to the RM for response k is the prompt followed by the other K-1
candidates:

    {prompt}

    Other candidate responses for reference:

    [Candidate 1]
    {other response}

    [Candidate 2]
    {other response}

The assistant turn is response k itself. The other candidates are listed in a seeded shuffle of the set
(`seed` drives it; `trace.order` records the permutation, and response k is skipped in it), so the AVG@k
repeats see different orders. With K=1 there are no others and the input is the plain conversation.

Conventions and choices:
- Inputs longer than `max_length` tokens (clamped to the model's `max_position_embeddings`) are cut from the
  left, keeping a leading BOS: the end of the scored response, where the score is read, always survives; the
  prompt (and, with responses, the other candidates) is what gets cut. Each cut is noted in
  `trace.raw["truncated"]`.
- Batches are right-padded (classifier) or left-padded with explicit position ids (lm-token0), sorted by
  length; in float32 what shares a response's batch moves its score by rounding only (seen: under 1e-6 relative, which
  can decide nothing but exact ties). A classifier whose config
  has no `pad_token_id` runs with batch size 1 (its head cannot find the last token of a padded row).
- `dtype=auto` is float32 on CPU and bfloat16 on CUDA (see `harness.backends.local.pick_dtype`). `device=auto`
  uses CUDA when present, spreading a model too large for one GPU over all visible GPUs (`device_map="auto"`);
  `cuda:N` pins one GPU.
- Building the evaluator locates and identifies the model and checks its `config.json` against `head`, so a
  missing or unfit model stops a run before it starts; the weights load on the first score the call cache
  cannot answer, so a fully cached run loads none. Loaded models are shared in this process by (model,
  revision, head, dtype, device): the plain and "w/ responses" evaluators of one RM hold one copy. The copy is
  freed when the last evaluator using it is closed.
- Scores go through the run's call cache (`pool.cache`), keyed by the weights' identity (local fingerprint or
  hub commit), the head, the dtype as asked for (`auto` names no precision: set `dtype` to keep CPU float32 and
  GPU bfloat16 scores apart in a shared cache), the conversation and the `max_length` setting, so AVG@k
  repeats of the plain RM (whose inputs do not change) cost one forward pass. A cache entry keeps the score and
  the input's token counts, so a cached score's trace says what a computed one says. Failures are never cached.
  `trace.calls` counts the sequences actually run through the model.
- Blocking work runs in `asyncio.to_thread`; one lock per loaded model serialises forward passes. torch and
  transformers are imported inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harness.errors import (
    BackendUnavailableError,
    ConfigError,
    Failure,
    FailureCategory,
    ModelNotFoundError,
)
from harness.registry import register
from judges.base import SetScores, StageFailure, Trace, format_evaluator_spec, resolve_settings

if TYPE_CHECKING:
    from harness.cache import CallCache
    from harness.pool import BackendPool

__all__ = ["CONTEXT_HEADER", "HEADS", "ScalarRM", "build", "with_responses_prompt"]

KIND = "scalar-rm"
HEADS = ("classifier", "lm-token0")
"""Where the score comes from: a sequence-classification logit, or a causal LM's next-token logit of id 0."""
CONTEXT_HEADER = "Other candidate responses for reference:"
"""Heading of the other candidates in the "w/ responses" input (see the module docstring)."""
RUNTIME_SETTINGS = ("batch_size", "device")
"""Settings that do not change scores: left out of the spec, so changing them keeps the evaluator's name."""

DEFAULTS: dict[str, Any] = {
    "with_responses": False,
    "head": "classifier",
    "batch_size": 8,
    "max_length": 8192,
    "dtype": "auto",
    "device": "auto",
}
"""Settings and their defaults; `model` is required."""


def with_responses_prompt(prompt: str, others: Sequence[str]) -> str:
    """The user turn of the "w/ responses" input: the prompt, then the other candidates, numbered from 1.

    With no others it is the prompt unchanged.
    """
    if not others:
        return prompt
    blocks = [f"[Candidate {n}]\n{text}" for n, text in enumerate(others, start=1)]
    return "\n\n".join([prompt, CONTEXT_HEADER, *blocks])


def render_conversation(tokenizer: Any, prompt: str, response: str) -> list[int]:
    """Token ids of `[user: prompt, assistant: response]`: chat template, else `User:`/`Assistant:` text."""
    from harness.backends.local import has_chat_template

    if has_chat_template(tokenizer):
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(f"User: {prompt}\n\nAssistant: {response}", add_special_tokens=True))


def truncate_left(ids: list[int], max_length: int, bos_id: int | None) -> list[int]:
    """The last `max_length` tokens of `ids`, keeping a leading BOS in front when `ids` starts with one."""
    if len(ids) <= max_length:
        return ids
    if bos_id is not None and ids and ids[0] == bos_id and max_length > 1:
        return [ids[0], *ids[len(ids) - max_length + 1 :]]
    return ids[len(ids) - max_length :]


# ------------------------------------------------------------------------------------------------------------
# Loaded models, shared in this process


@dataclass(eq=False)
class _LoadedRM:
    """A reward model in memory, with what scoring needs to know about it."""

    model: Any
    tokenizer: Any
    torch: Any
    head: str
    pad_id: int | None
    """The id the classifier head treats as padding (None: batch size 1); for lm-token0 any id (masked)."""
    bos_id: int | None
    context_length: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Serialises forward passes on this model."""
    users: int = 0
    """Live evaluators holding this model; freed at zero."""


_LOADED: dict[tuple[str, str | None, str, str, str], _LoadedRM] = {}
_LOADED_LOCK = threading.Lock()


def _load(path: str, revision: str | None, name: str, *, head: str, dtype: str, device: str) -> _LoadedRM:
    try:
        import torch
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{KIND} needs torch and transformers ({exc.name} missing): "
            'pip install "dynamicrubric-harness[hf]"'
        ) from exc
    from harness.backends.local import pick_device, pick_dtype

    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    try:
        config = AutoConfig.from_pretrained(path, **kwargs)
        _check_config({**config.to_dict(), "num_labels": config.num_labels}, name, head=head)
        tok = AutoTokenizer.from_pretrained(path, **kwargs)
        extra: dict[str, Any] = {}
        if dev.startswith("cuda"):
            extra["device_map"] = "auto" if device == "auto" else dev
        auto = AutoModelForSequenceClassification if head == "classifier" else AutoModelForCausalLM
        model = auto.from_pretrained(path, dtype=torch_dtype, **kwargs, **extra)
    except OSError as exc:  # hub id unknown, gated, or not cached while offline
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"cannot load reward model {name!r}: {first}") from exc
    if not dev.startswith("cuda"):
        model = model.to(dev)
    model.eval()
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if head == "classifier":
        pad_id = getattr(text_config, "pad_token_id", None)
    else:
        pad_id = next((i for i in (tok.pad_token_id, tok.eos_token_id) if i is not None), 0)
    return _LoadedRM(
        model=model,
        tokenizer=tok,
        torch=torch,
        head=head,
        pad_id=pad_id,
        bos_id=tok.bos_token_id,
        context_length=getattr(text_config, "max_position_embeddings", None),
    )


def _acquire(key: tuple[str, str | None, str, str, str], name: str) -> _LoadedRM:
    with _LOADED_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            path, revision, head, dtype, device = key
            loaded = _load(path, revision, name, head=head, dtype=dtype, device=device)
            _LOADED[key] = loaded
        loaded.users += 1
        return loaded


def _release(key: tuple[str, str | None, str, str, str]) -> None:
    import gc

    with _LOADED_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            return
        loaded.users -= 1
        if loaded.users > 0:
            return
        del _LOADED[key]
    with loaded.lock:
        cuda = loaded.torch.cuda.is_available()
        loaded.model = None
        gc.collect()
        if cuda:
            loaded.torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------------
# The evaluator


@dataclass(frozen=True, slots=True)
class _Input:
    """One conversation to score."""

    response: int
    ids: list[int]
    key: str | None
    """Call-cache key (None without a cache)."""


class ScalarRM:
    """A scalar reward model as an evaluator (see the module docstring for the input format and conventions).

    Args:
        settings: Resolved settings (`resolve_settings` output: `model` plus every key of `DEFAULTS`).
        cache: The run's call cache, or None to score without one.

    Raises:
        ModelNotFoundError: for a missing local folder or a hub id that cannot be loaded.
        ConfigError: for a bad setting value or a checkpoint that does not fit `head`.
        BackendUnavailableError: when torch or transformers is not installed.
    """

    def __init__(self, settings: dict[str, Any], *, cache: CallCache | None = None) -> None:
        from harness.backends import parse_spec
        from harness.backends.local import locate_model
        from harness.registry import names

        name = given = str(settings["model"]).strip()
        if name in names("model"):  # an alias such as smollm2-135m: its converted checkpoint (CPU stand-ins)
            name = parse_spec(name)[1]
        name = name.removeprefix("hf:")
        if not name:
            raise ConfigError(f"{KIND}: empty model setting")
        head: Literal["classifier", "lm-token0"] = settings["head"]
        if head not in HEADS:
            raise ConfigError(f"{KIND}: unknown head {head!r}; valid: {', '.join(HEADS)}")
        if settings["batch_size"] < 1:
            raise ConfigError(f"{KIND}: batch_size must be >= 1, got {settings['batch_size']}")
        if settings["max_length"] < 2:
            raise ConfigError(f"{KIND}: max_length must be >= 2, got {settings['max_length']}")
        if Path(name).expanduser().is_file():
            raise ModelNotFoundError(
                f"{KIND}: model {name!r} is a file; give a checkpoint folder or a hub id"
            )
        # An alias keeps its name in the spec, so the evaluator's name is the same on every machine.
        self.settings = {**settings, "model": given if given in names("model") else name}
        self.spec = format_evaluator_spec(KIND, self.settings, defaults=DEFAULTS, runtime=RUNTIME_SETTINGS)
        self.with_responses: bool = settings["with_responses"]
        self.batch_size: int = settings["batch_size"]
        try:
            source = locate_model(name, kind=KIND)
        except ModelNotFoundError as exc:
            raise ModelNotFoundError(f"{KIND}: {exc}".replace("hf model", "reward model")) from None
        _check_architecture(source.path, source.revision, name, head=head)
        self._name = name
        self._key = (source.path, source.revision, head, settings["dtype"], settings["device"])
        self._rm: _LoadedRM | None = None
        self._closed = False
        self._hold_lock = threading.Lock()
        # Known without loading the model, so a fully cached run loads none: the weights' fingerprint or hub commit,
        # the head, and the dtype as asked for (`auto` is float32 on CPU and bfloat16 on CUDA).
        self._identity = {**source.identity, "kind": KIND, "head": head, "dtype": settings["dtype"]}
        self.max_length: int = settings["max_length"]
        """The `max_length` setting; the model's context clamps it when the model loads."""
        self._cache = cache

    def _held(self) -> _LoadedRM:
        """The loaded model, loading (or sharing) it on first use."""
        with self._hold_lock:
            if self._closed:
                raise BackendUnavailableError(f"{self.spec} is closed")
            if self._rm is None:
                self._rm = _acquire(self._key, self._name)
            return self._rm

    def identity(self) -> dict[str, str]:
        """What identifies the scores' source: weights fingerprint or hub revision, head and dtype."""
        return dict(self._identity)

    async def score_set(self, prompt: str, responses: Sequence[str], *, seed: int) -> SetScores:
        """Score every response with the RM; a response that fails gets None and a `StageFailure`.

        Args:
            prompt: The user prompt.
            responses: The candidate set (K >= 1).
            seed: Shuffles the other candidates' order in "w/ responses" mode; unused otherwise.
        """
        if not responses:
            return SetScores(())
        k = len(responses)
        order: list[int] | None = None
        contexts = [prompt] * k
        if self.with_responses and k > 1:
            order = random.Random(seed).sample(range(k), k)
            contexts = [
                with_responses_prompt(prompt, [responses[j] for j in order if j != i]) for i in range(k)
            ]
        return await asyncio.to_thread(self._score_sync, contexts, list(responses), order)

    async def close(self) -> None:
        """Release this evaluator's hold on the model (freed when no other evaluator uses it)."""
        with self._hold_lock:
            self._closed = True
            held, self._rm = self._rm, None
        if held is not None:
            await asyncio.to_thread(_release, self._key)

    # --------------------------------------------------------------------------------------------------------

    def _score_sync(self, contexts: list[str], responses: list[str], order: list[int] | None) -> SetScores:
        from harness.cache import cache_key

        k = len(responses)
        scores: list[float | None] = [None] * k
        n_tokens: list[int | None] = [None] * k
        kept: list[int | None] = [None] * k
        keys: list[str | None] = [None] * k
        if self._cache is not None:
            for i, (context, response) in enumerate(zip(contexts, responses, strict=True)):
                payload = {"user": context, "assistant": response, "max_length": self.max_length}
                keys[i] = cache_key(self._identity, "reward_score", payload)
            found = self._cache.get_many([key for key in keys if key is not None])
        else:
            found = {}
        todo = []
        for i, key in enumerate(keys):
            if key in found:
                scores[i], n_tokens[i], kept[i] = _stored_score(found[key])
            else:
                todo.append(i)
        if self._cache is not None:
            self._cache.count(hits=k - len(todo), misses=len(todo))
        failures: list[StageFailure] = []
        inputs: list[_Input] = []
        rm = self._held() if todo else None  # the model loads only for what the cache cannot answer
        for i in todo:
            try:
                ids = render_conversation(rm.tokenizer, contexts[i], responses[i])
            except Exception as exc:  # e.g. a template that rejects the conversation
                failures.append(
                    _failure("score", f"cannot render the conversation: {type(exc).__name__}: {exc}", i)
                )
                continue
            n_tokens[i] = len(ids)
            limit = min(self.max_length, rm.context_length) if rm.context_length else self.max_length
            ids = truncate_left(ids, limit, rm.bos_id)
            kept[i] = len(ids)
            inputs.append(_Input(i, ids, keys[i]))
        inputs.sort(key=lambda x: -len(x.ids))
        size = self.batch_size if rm is not None and (rm.pad_id is not None or rm.head != "classifier") else 1
        to_store: list[tuple[str, str, object]] = []
        for start in range(0, len(inputs), size):
            batch = inputs[start : start + size]
            try:
                with rm.lock:
                    if rm.model is None:
                        raise BackendUnavailableError(f"{self.spec} is closed")
                    values = _forward(rm, [x.ids for x in batch])
            except Exception as exc:  # e.g. out of memory: fail this batch, keep the rest
                for x in batch:
                    failures.append(
                        _failure("score", f"forward pass failed: {type(exc).__name__}: {exc}", x.response)
                    )
                continue
            for x, value in zip(batch, values, strict=True):
                if not math.isfinite(value):
                    failures.append(_failure("score", f"the reward model returned {value}", x.response))
                    continue
                scores[x.response] = value
                if x.key is not None:
                    stored = {"score": value, "tokens": n_tokens[x.response], "kept": len(x.ids)}
                    to_store.append((x.key, f"{KIND}:{self._identity['model']}", stored))
        if self._cache is not None:
            self._cache.put_many(to_store)
        raw: dict[str, Any] = {"input_tokens": n_tokens, "max_length": self.max_length}
        truncated = [
            {"response": i, "tokens": n, "kept": c}
            for i, (n, c) in enumerate(zip(n_tokens, kept))
            if n is not None and c is not None and c < n
        ]
        if truncated:
            raw["truncated"] = truncated
        failures.sort(key=lambda f: f.response if f.response is not None else -1)
        return SetScores(
            tuple(scores), Trace(failures=tuple(failures), order=order, raw=raw, calls=len(inputs))
        )


def _stored_score(value: object) -> tuple[float, int | None, int | None]:
    """(score, input tokens, tokens kept) of a cache entry."""
    if isinstance(value, dict):
        return float(value["score"]), value.get("tokens"), value.get("kept")
    return float(value), None, None  # type: ignore[arg-type]


def _check_architecture(path: str, revision: str | None, name: str, *, head: str) -> None:
    """Refuse a checkpoint that does not fit `head`, from its config.json alone (no weights, no torch).

    Raises:
        ConfigError: a classifier head on a causal LM (or the reverse), or a classifier with num_labels != 1.
    """
    config = _read_config(path, revision)
    if config is not None:  # else not readable without downloading: checked when the model loads
        _check_config(config, name, head=head)


def _check_config(config: dict, name: str, *, head: str) -> None:
    archs = list(config.get("architectures") or [])
    want = "ForSequenceClassification" if head == "classifier" else "ForCausalLM"
    if archs and not any(a.endswith(want) for a in archs):
        hint = " (a causal-LM reward model such as Nemotron-70B-Reward-HF needs head=lm-token0)"
        raise ConfigError(
            f"{KIND}: {name!r} is a {'/'.join(archs)} checkpoint, not a *{want} one as head={head} needs"
            + (hint if head == "classifier" else "")
        )
    labels = config.get("num_labels") or len(config.get("id2label") or {}) or 1
    if head == "classifier" and labels != 1:
        raise ConfigError(f"{KIND}: {name!r} has num_labels={labels}; a scalar RM needs 1")


def _read_config(path: str, revision: str | None) -> dict | None:
    local = Path(path) / "config.json"
    if local.is_file():
        target = local
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(path, "config.json", revision=revision)
        except Exception:
            return None
        if not isinstance(found, str):
            return None
        target = Path(found)
    try:
        return json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _forward(rm: _LoadedRM, rows: list[list[int]]) -> list[float]:
    """Scores of token-id rows, one forward pass (rows already cut to the context)."""
    torch = rm.torch
    width = max(len(r) for r in rows)
    pad = rm.pad_id if rm.pad_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    left = rm.head != "classifier"
    for j, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[j, span] = torch.tensor(r, dtype=torch.long)
        mask[j, span] = 1
    device = rm.model.device
    ids, mask = ids.to(device), mask.to(device)
    with torch.inference_mode():
        if rm.head == "classifier":
            logits = rm.model(input_ids=ids, attention_mask=mask).logits[:, 0]
        else:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = rm.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
            logits = out.logits[:, -1, 0]
    return [float(v) for v in logits.float().cpu()]


def _failure(stage: str, message: str, response: int) -> StageFailure:
    return StageFailure(stage, Failure(FailureCategory.BACKEND, " ".join(message.split())), response=response)


@register("evaluator", KIND)
def build(settings: dict[str, str], pool: BackendPool) -> ScalarRM:
    """`scalar-rm:model=ID_OR_DIR[,with_responses=true,head=classifier|lm-token0]`: a reward model's scalar.

    Scores are cached in `pool.cache`.

    Raises:
        ConfigError: for unknown or malformed settings (see `DEFAULTS`; `model` is required).
        ModelNotFoundError: when the model cannot be found.
    """
    resolved = resolve_settings(KIND, settings, DEFAULTS, required=("model",))
    return ScalarRM(resolved, cache=pool.cache)
