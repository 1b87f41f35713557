"""`scalar-rm`: a scalar reward model scores each response of a set on its own (the paper's RM baselines).

Spec: `scalar-rm:model=NAME[,with_responses=true][,head=classifier|lm-token0][,batch_size=N][,max_length=8192]
[,dtype=auto][,device=auto]`. NAME is a model spec as everywhere (`harness.backends`): a hub id (optionally
`repo@revision`) or a local checkpoint folder, run by `hf` (a leading `hf:` is accepted and dropped from the
evaluator's name), `vllm:NAME` for vLLM's engine, or a model alias (`smollm2-135m`). Examples:
`scalar-rm:model=Skywork/Skywork-Reward-Gemma-2-27B-v0.2` and, for the "w/ responses" rows, the same with
`with_responses=true`.

How a response is scored: the conversation `[user: prompt, assistant: response]` goes to the backend's `score`
operation (`harness.backends.base.ScoreRequest`, which says how it is rendered, cut to `max_length` and read by
each head; `hf` runs it as `harness.backends.hf_reward` describes):
- `head=classifier` (default): an `AutoModelForSequenceClassification` checkpoint with `num_labels=1`
  (Skywork-Reward, most open RMs); the score is its logit. A checkpoint whose `config.architectures` is not a
  sequence classifier is refused: transformers would otherwise attach a randomly initialised head and return
  noise.
- `head=lm-token0`: a causal LM whose reward is the next-token logit of token id 0 after the whole
  conversation, the convention of `nvidia/Llama-3.1-Nemotron-70B-Reward-HF` (a `LlamaForCausalLM` checkpoint,
  not a classifier). `hf` only: vLLM's engine does not expose raw logits (see `harness.backends.vllm_backend`).
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
- Inputs longer than `max_length` tokens (clamped to the model's context) are cut from the left, keeping a
  leading BOS: the end of the scored response, where the score is read, always survives; the prompt (and, with
  responses, the other candidates) is what gets cut. Each cut is noted in `trace.raw["truncated"]`.
- The model is the run's backend for its spec (`pool.get`): it is located, identified and checked against
  `head` from its `config.json` when the evaluator is built, so a missing or unfit model stops a run before it
  starts; its weights load on the first score the call cache cannot answer, so a fully cached run loads none.
  The plain and "w/ responses" evaluators of one RM, and any other role of the same spec, share that backend,
  hence one copy of the weights; the pool frees it at the end of the run.
- `dtype`, `device` and `batch_size` are load-time choices of that backend: `auto` (and an unset `batch_size`)
  take the run's backend options (`--dtype`, `--device`, `--batch-size`); an explicit value that differs from
  them asks the pool for a backend of its own (`pool.get(spec, overrides=...)`, a second copy of the weights
  when another evaluator uses the same model with the run's options). The backend's `dtype=auto` is float32 on
  CPU and bfloat16 on CUDA (`harness.backends.local.pick_dtype`); a dtype other than `auto` enters the backend's
  identity, so CPU float32 and GPU bfloat16 scores are cached apart only when one of them is named. `device`
  and `batch_size` do not change scores and stay out of the evaluator's name; `dtype` is in it when set.
- Batches are sorted by length; in float32 what shares a response's batch (merged with concurrent sets) moves
  its score by rounding only (seen: under 1e-6 relative), which can decide nothing but exact ties.
- Scores go through the run's call cache like every model call (`harness.cache.CachedBackend.score`), keyed by
  the backend's identity (weights fingerprint or hub commit, and the dtype when set), the conversation, the
  head and `max_length`, so AVG@k repeats of the plain RM (whose inputs do not change) cost one forward pass.
  A cache entry keeps the score and the input's token counts, so a cached score's trace says what a computed
  one says. Failures are never cached. `trace.calls` counts the conversations the cache could not answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.backends.base import SCORE_HEADS, Message, ScoreRequest
from harness.errors import ConfigError, ModelNotFoundError
from judges.base import SetScores, StageFailure, Trace, format_evaluator_spec, resolve_settings

if TYPE_CHECKING:
    from harness.cache import CachedBackend
    from harness.pool import BackendPool

__all__ = ["CONTEXT_HEADER", "HEADS", "ScalarRM", "build", "with_responses_prompt"]

KIND = "scalar-rm"
SUBJECT = "model"
"""The setting under test when two runs of a row are compared (`judges.held_fixed`)."""
HEADS = SCORE_HEADS
"""Where the score comes from: a sequence-classification logit, or a causal LM's next-token logit of id 0."""
CONTEXT_HEADER = "Other candidate responses for reference:"
"""Heading of the other candidates in the "w/ responses" input (see the module docstring)."""
RUNTIME_SETTINGS = ("batch_size", "device")
"""Settings that do not change scores: left out of the spec, so changing them keeps the evaluator's name."""

DEFAULTS: dict[str, Any] = {
    "with_responses": False,
    "head": "classifier",
    "batch_size": None,
    "max_length": 8192,
    "dtype": "auto",
    "device": "auto",
}
"""Settings and their defaults; `model` is required. `batch_size` unset, `dtype=auto` and `device=auto` take the
run's backend options."""


def with_responses_prompt(prompt: str, others: Sequence[str]) -> str:
    """The user turn of the "w/ responses" input: the prompt, then the other candidates, numbered from 1.

    With no others it is the prompt unchanged.
    """
    if not others:
        return prompt
    blocks = [f"[Candidate {n}]\n{text}" for n, text in enumerate(others, start=1)]
    return "\n\n".join([prompt, CONTEXT_HEADER, *blocks])


def model_spec(name: str) -> str:
    """The backend spec of the `model` setting: a spec or alias as given, anything else `hf:NAME`."""
    from harness.registry import names

    kind, sep, _ = name.partition(":")
    if (sep and kind in names("backend")) or name in names("model"):
        return name
    return f"hf:{name}"


def explicit_settings(settings: dict[str, str]) -> dict[str, str]:
    """The settings with `model` as the backend spec the run records it under (`hf:NAME`, an alias as is)."""
    out = dict(settings)
    if "model" in out:
        out["model"] = model_spec(out["model"].strip().removeprefix("hf:"))
    return out


def backend_overrides(settings: dict[str, Any]) -> dict[str, Any]:
    """The `BackendOptions` an evaluator's settings ask for (see the module docstring)."""
    found: dict[str, Any] = {k: settings[k] for k in ("dtype", "device") if settings[k] != "auto"}
    if settings["batch_size"] is not None:
        found["batch_size"] = settings["batch_size"]
    return found


class ScalarRM:
    """A scalar reward model as an evaluator (see the module docstring for the input format and conventions).

    Args:
        settings: Resolved settings (`resolve_settings` output: `model` plus every key of `DEFAULTS`).
        backend: The reward model's backend (from the run's pool).
    """

    def __init__(self, settings: dict[str, Any], *, backend: CachedBackend) -> None:
        self.settings = settings
        self.spec = format_evaluator_spec(KIND, settings, defaults=DEFAULTS, runtime=RUNTIME_SETTINGS)
        self.backend = backend
        self.with_responses: bool = settings["with_responses"]
        self.head = settings["head"]
        self.max_length: int = settings["max_length"]
        """The `max_length` setting; the model's context clamps it when the model loads."""

    async def score_set(self, prompt: str, responses: Sequence[str], *, seed: int,
                        reference: str | None = None) -> SetScores:
        """Score every response with the RM; a response that fails gets None and a `StageFailure`.

        Args:
            prompt: The user prompt.
            responses: The candidate set (K >= 1).
            seed: Shuffles the other candidates' order in "w/ responses" mode; unused otherwise.
            reference: Not read (a set's reference answer is for checks that need one: `judges.rule`).
        """
        del reference
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
        requests = [
            ScoreRequest((Message("user", c), Message("assistant", r)), self.head, self.max_length)
            for c, r in zip(contexts, responses, strict=True)
        ]
        results = await self.backend.score(requests)
        failures = tuple(
            StageFailure("score", r.error, response=i) for i, r in enumerate(results) if r.error is not None
        )
        raw: dict[str, Any] = {"input_tokens": [r.tokens for r in results], "max_length": self.max_length}
        truncated = [
            {"response": i, "tokens": r.tokens, "kept": r.kept} for i, r in enumerate(results) if r.truncated
        ]
        if truncated:
            raw["truncated"] = truncated
        return SetScores(
            tuple(r.score for r in results),
            Trace(failures=failures, order=order, raw=raw, calls=sum(not r.cached for r in results)),
        )

    async def close(self) -> None:
        """Nothing to release: the backend belongs to the pool, which closes it."""


def build(settings: dict[str, str], pool: BackendPool) -> ScalarRM:
    """`scalar-rm:model=SPEC[,with_responses=true,head=classifier|lm-token0]`: a reward model's scalar.

    The model comes from `pool.get` (its scores are cached in `pool.cache`).

    Raises:
        ConfigError: for unknown or malformed settings (see `DEFAULTS`; `model` is required) or a model that
            cannot score with `head`.
        ModelNotFoundError: when the model cannot be found.
        BackendUnavailableError: when the backend's libraries are not installed.
    """
    resolved = resolve_settings(KIND, settings, DEFAULTS, required=("model",))
    given = str(resolved["model"]).strip()
    name = given.removeprefix("hf:")
    if not name:
        raise ConfigError(f"{KIND}: empty model setting")
    if resolved["head"] not in HEADS:
        raise ConfigError(f"{KIND}: unknown head {resolved['head']!r}; valid: {', '.join(HEADS)}")
    if resolved["batch_size"] is not None:
        try:
            resolved["batch_size"] = int(resolved["batch_size"])
        except ValueError:
            raise ConfigError(f"{KIND}: batch_size must be an integer, got {resolved['batch_size']!r}") from None
        if resolved["batch_size"] < 1:
            raise ConfigError(f"{KIND}: batch_size must be >= 1, got {resolved['batch_size']}")
    if resolved["max_length"] < 2:
        raise ConfigError(f"{KIND}: max_length must be >= 2, got {resolved['max_length']}")
    try:
        backend = pool.get(model_spec(name), overrides=backend_overrides(resolved))
        backend.check_score(resolved["head"])
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"{KIND}: {exc}".replace("hf model", "reward model")) from None
    except ConfigError as exc:
        raise ConfigError(f"{KIND}: {exc}") from None
    return ScalarRM({**resolved, "model": name}, backend=backend)
