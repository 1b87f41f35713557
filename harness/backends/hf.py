"""The `hf` backend: a transformers model in this process, on CPU or GPU, batched.

`hf:NAME` where NAME is a hub id (`Qwen/Qwen3-8B`, optionally `Qwen/Qwen3-8B@<revision>`), a local checkpoint
directory, or a `.gguf` file (converted once into a plain checkpoint by
`harness.backends.models.convert_gguf`). torch and transformers are imported inside functions, so importing
this module stays cheap.

The checkpoint's config decides what loads: a causal LM, or a reward model (`*ForSequenceClassification`) that
only scores (`score`, see `harness.backends.hf_reward`). Placement: `harness.backends.local.hf_placement` (an even
split over the GPUs with `device=auto`, within the plan's share of each); loads hold the process-wide load gate
(`harness.backends.gate`).

How generation behaves, and where it deviates from a plain `model.generate` call:
- Prompts are rendered with the tokenizer's chat template (`add_generation_prompt=True`). A tokenizer without
  a template (a base model such as gemma3-270m) gets a plain-text rendering instead: `Role: content` turns
  separated by blank lines, ending in `Assistant:`; generation then also stops at `"\\nUser:"` so a base model
  does not write the next user turn, and the answer is stripped of surrounding whitespace.
- Only the request's own parameters apply: the checkpoint's `generation_config.json` sampling defaults
  (temperature, top_k, repetition penalty, ...) are ignored, as with the other backends, so one request means
  the same thing everywhere.
- Rows (request x sample) are sorted by prompt length and run in left-padded batches of `options.batch_size`.
  Greedy requests (temperature 0) run once and repeat the text `n` times. Sampled rows draw from their own
  `torch.Generator` seeded with `sample_seed(params.seed, i)`, so sample i of a request is the same whatever
  else shares its batch and whatever `n` is; `seed=None` draws a fresh random seed. (Batching can still change
  the floating-point rounding of logits, as in every batched engine; with float32 this is practically
  invisible.)
- `assistant_prefix` (a prefill) is appended to the rendered prompt; the text returned is what follows it.
  `min_tokens` bans the end-of-sequence ids of a row until it has that many new tokens.
- Generation is our own decode loop over the model's KV cache (`harness.backends.hf_decode`), not
  `model.generate`: `params.constraint` (structured output) masks a row's logits at every step with an llguidance
  matcher built from the tokenizer (`harness.backends.grammar`): only tokens the grammar allows next stay finite,
  and once it is complete only end-of-sequence. The mask applies before sampling and after the raw logits are kept,
  so token logprobs stay the model's own. The next step's masks are computed, for all rows at once, while the
  forward pass runs; a row the grammar allows every token is not masked. Tokens the grammar forces go into the
  cache in one forward pass (`jump_forward`, on by default; the same outputs, fewer passes).
- Stop strings end a row early (checked on its recent tokens at every step); the text is cut before the first
  one. `max_tokens` is clamped to the model's context; a prompt that alone fills the context fails that
  request.
- `Usage.completion_tokens` counts the tokens generated for every returned sample, including an
  end-of-sequence token and any tokens past a stop string that were generated before the stop was seen.
- Token logprobs (`params.logprobs > 0`) are the log-softmax of the model's raw logits:
  the model's own distribution, not the temperature/top-p-warped one a sampled token was drawn from (vLLM's
  default, too). `token` is the text the token adds to the answer (decoded incrementally, so the pieces
  concatenate to the text; a token ending inside a multi-byte character adds "" and the next one carries the
  character); `top` keys are `tokenizer.decode([id])` of the k most likely ids (special tokens by name), the
  larger value winning when two ids decode alike. The end-of-sequence token is not listed; a token that
  straddles a stop-string cut (or the whitespace stripped from a plain-rendered answer) is kept whole, tokens
  wholly outside the text are dropped. A batch with such rows keeps every step's logits (steps x rows x
  vocabulary floats) until it finishes, so rows asking for logprobs are batched together.
- Work nobody waits for stops (`harness.backends.local.InFlight`): when every call waiting on the model is
  cancelled (Ctrl-C), or the backend is cancelled or closed, the decode loop stops before its next step, and any
  forward pass (a long prompt's prefill, a logprob batch)
  stops before its next decoder layer (a forward pre-hook on each, `decoder_layers`); the call then raises
  `Cancelled` instead of returning the truncated text, so nothing of it is cached or recorded.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from harness.backends.base import (
    BackendOptions,
    Completion,
    Constraint,
    GenerateRequest,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    LogprobRequest,
    LogprobResult,
    Message,
    ScoreHead,
    ScoreRequest,
    ScoreResult,
    TokenLogprob,
    Usage,
    sample_seed,
)
from harness.backends.hf_decode import decode, forward_style
from harness.backends.hf_rows import Output, Row
from harness.backends.local import (
    PLAIN_STOPS,
    Cancelled,
    LocalBackend,
    answer_span,
    backend_failure,
    candidate_token_ids,
    check_dtype,
    check_score_head,
    check_source_head,
    check_stop,
    compute_thread,
    check_placed,
    encode_chat,
    encode_contexts,
    has_chat_template,
    hf_placement,
    is_sequence_classifier,
    locate_model,
    loglikelihood_ids,
    not_generative,
    pick_device,
    pick_dtype,
    prompt_ids,
    token_pieces,
    tokens_within,
    top_texts,
)
from harness.backends.gate import load_gate
from harness.backends.merge import CallMerger
from harness.errors import BackendUnavailableError, ConfigError, Failure, FailureCategory, ModelNotFoundError

log = logging.getLogger(__name__)
T = TypeVar("T")

"""Extra stop strings used with the plain-text rendering (tokenizers without a chat template)."""


class HFBackend(LocalBackend):
    """A transformers model in this process: CPU or GPU, batched; hub ids, local folders, .gguf files.

    A `LocalBackend`, as the module docstring describes.

    Constructing the backend locates and identifies the model (so a missing model fails before a run starts) but
    loads nothing: the tokenizer and weights load on the first request (or `load()` / `probe()`), so a run the
    call cache answers entirely imports neither torch nor transformers.

    Args:
        name: Hub id (optionally `@revision`), local checkpoint folder, or `.gguf` file.
        options: Load-time choices (`device`, `dtype`, `batch_size`); other fields are ignored.

    Raises:
        ModelNotFoundError: for a missing local path, or a hub id that is neither cached nor on the hub.
        ConfigError: for an unknown dtype or a batch size below 1.
    """

    kind = "hf"

    def __init__(self, name: str, options: BackendOptions | None = None) -> None:
        self.model = name
        self.options = options or BackendOptions()
        if self.options.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.options.batch_size}")
        check_dtype(self.options.dtype)
        self._lock = threading.RLock()  # loading happens inside locked forward passes too
        self._source = locate_model(name, kind=self.kind)
        self._identity = dict(self._source.identity)
        if self.options.dtype != "auto":  # outputs depend on it; `auto` keeps the identities cached before it
            self._identity["dtype"] = self.options.dtype
        self._lm: Any = None  # a causal LM, or a sequence classifier when `_classifier`
        self._tok: Any = None
        self._classifier = False
        self._mask: Any = None
        self._masks_pool: Any = None  # one thread computing the next masks beside a forward pass
        self.decode_counts = {"forward_passes": 0, "tokens": 0, "forced_tokens": 0}
        """Generation's forward passes and tokens so far, and the tokens a grammar forced (`bench structured`)."""
        self._stop: threading.Event | None = None
        """The stop of the work holding the model (`_locked`), checked before every decoder layer."""
        self._lacks: dict[str, str] = {}
        self._config: dict[str, Any] = {}
        self._local_state(compute_thread())  # one thread for every hf model: see compute_thread
        self.max_memory: dict[int, int] | None = None
        """The plan's `max_memory` (GPU -> bytes) for `device=auto` over several GPUs, set by the run's scheduler
        (`harness.backends.local.hf_placement`); None: an even split over every visible GPU."""
        self._candidate_cache: dict[str, list[int]] = {}
        self._token_texts: dict[int, str] = {}
        self._merged_generate = CallMerger(
            lambda merged: self._inflight.run(self._locked, self._generate_sync, merged)
        )
        self._merged_score = CallMerger(lambda merged: self._inflight.run(self._locked, self._score_sync, merged))

    # --------------------------------------------------------------------------------------------------------
    # Loading

    def load(self) -> None:
        """Load the tokenizer and weights now (a no-op once loaded).

        Raises:
            ModelNotFoundError: when the weights cannot be loaded (gated, not downloadable, broken files).
            BackendUnavailableError: when torch or transformers is not installed, or the backend is closed.
        """
        with self._lock:
            self._ensure_loaded()

    def _ensure_loaded(self) -> None:
        """Load unless loaded; the caller holds `self._lock`."""
        if self._closed:
            raise BackendUnavailableError(f"hf backend for {self.model!r} is closed")
        if self._lm is None:
            # One model loads at a time in this process (`harness.backends.gate`), until its weights are on their
            # devices; this also keeps transformers' lazy imports, which are not thread-safe, to one thread.
            with load_gate(f"{self.kind}:{self.model}"):
                self._load()

    @property
    def source(self) -> Any:
        """Where the weights load from (`harness.backends.local.ModelSource`)."""
        return self._source

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (loads the model)."""
        self.load()
        return self._tok

    @property
    def chat_template(self) -> bool:
        """Whether the tokenizer has a chat template (loads the model)."""
        return has_chat_template(self.tokenizer)

    def _load(self) -> None:
        try:
            import torch
            from transformers import (
                AutoConfig,
                AutoModelForCausalLM,
                AutoModelForSequenceClassification,
                AutoTokenizer,
                GenerationConfig,
            )
        except ImportError as exc:
            raise BackendUnavailableError(
                f"hf backend needs torch and transformers ({exc.name} missing): "
                'pip install "dynamicrubric-harness[hf]"'
            ) from exc
        from harness.backends.hf_linear import few_row_linears

        src = self._source
        self.device = pick_device(self.options.device)
        self.dtype = pick_dtype(self.options.dtype, self.device)
        kwargs: dict[str, Any] = {"revision": src.revision} if src.revision else {}
        placement = hf_placement(self.options.device, self.device, max_memory=self.max_memory)
        try:
            config = AutoConfig.from_pretrained(src.path, **kwargs)
            self._config = {**config.to_dict(), "num_labels": config.num_labels}
            self._classifier = is_sequence_classifier(self._config)
            tok = AutoTokenizer.from_pretrained(src.path, **kwargs)
            auto = AutoModelForSequenceClassification if self._classifier else AutoModelForCausalLM
            lm = auto.from_pretrained(src.path, dtype=self.dtype, **kwargs, **placement)
        except OSError as exc:  # hub id unknown, gated, or not cached while offline
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelNotFoundError(f"cannot load hf model {self.model!r}: {first}") from exc
        if not placement:
            lm = lm.to(self.device)
        check_placed(lm, f"hf model {self.model!r}")
        lm.eval()
        few_row_linears(lm)
        for layer in decoder_layers(lm):
            layer.register_forward_pre_hook(self._stop_between_layers)
        text_config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
        self.context_length: int | None = getattr(text_config, "max_position_embeddings", None)
        self._torch = torch
        if self._classifier:  # a reward model: its head's pad id (None: one sequence per batch), no generation
            self._pad_id = getattr(text_config, "pad_token_id", None)  # type: ignore[assignment]
            self._lm, self._tok = lm, tok
            self.loads += 1
            return
        tok.padding_side = "left"
        old = lm.generation_config
        eos = old.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tok.eos_token_id is not None:
            eos_ids.add(tok.eos_token_id)
        pad = tok.pad_token_id
        if pad is None:
            pad = old.pad_token_id if old.pad_token_id is not None else min(eos_ids, default=0)
        self._eos_ids = sorted(eos_ids)
        self._pad_id = int(pad)
        # Only the request's parameters may shape the output: drop the checkpoint's sampling defaults.
        lm.generation_config = GenerationConfig(
            bos_token_id=old.bos_token_id, eos_token_id=self._eos_ids or None, pad_token_id=self._pad_id
        )
        # The KV-cache argument of `forward` (`cache` since transformers 5) and whether `logits_to_keep` takes rows.
        self._cache_arg, self._keep_per_row = forward_style(lm)
        self._lm, self._tok = lm, tok
        self.loads += 1

    # --------------------------------------------------------------------------------------------------------
    # Protocol

    def identity(self) -> dict[str, str]:
        """`{"kind": "hf", "model": name, "weights": fingerprint}` for local weights, or `"revision"` (the hub
        commit: the cached snapshot's, else the hub's for the requested revision) for hub ids; plus `"dtype"` when
        one other than `auto` was asked for."""
        return dict(self._identity)

    def capabilities(self) -> dict[str, str]:
        """Empty, unless structured output proved unavailable for this tokenizer."""
        return dict(self._lacks)

    @property
    def resident(self) -> bool:
        """Whether the weights are in memory."""
        return self._lm is not None

    def _free(self, *, closing: bool) -> None:
        """Drop the weights (and empty the CUDA cache)."""
        with self._lock:
            self._closed = self._closed or closing
            if closing and self._masks_pool is not None:
                self._masks_pool.shutdown(wait=False)
                self._masks_pool = None
            if self._lm is None:
                return
            self._lm = None
            self.releases += 1
            gc.collect()
            if self.device.startswith("cuda"):
                self._torch.cuda.empty_cache()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Complete every request (see the module docstring), aligned with `requests`.

        Concurrent calls are merged into shared batches (`CallMerger`): rows carry their own seeds, stops and
        budgets, so merging changes no sampled output; greedy float32 outputs were measured batch-invariant on CPU.
        Per-request failures are returned as `Completion.error`, never raised.

        Raises:
            Cancelled: the work was stopped before it finished (see the module docstring).
        """
        with self._inflight.call():
            return await self._merged_generate(requests)

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        """Log-probabilities of each candidate's first token after the rendered chat plus `assistant_prefix`.

        One forward pass per batch; a candidate's value is the max over the first token of `candidate` and of
        `" " + candidate` (tokenizers differ on where the space goes), `-inf` when neither yields a token.
        A request with branches runs on its own: the tokens every branch shares once, then the branches in
        batches of `options.batch_size` on copies of that KV cache; `usage.prompt_tokens` counts each computed
        token once.
        """
        if not requests:
            return []
        with self._inflight.call():
            return await self._inflight.run(self._locked, self._logprobs_sync, list(requests), list(candidates))

    async def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
        """Log-probability of each continuation after its context, as lm-evaluation-harness' `hf` model computes
        it: the ids split by `loglikelihood_ids`, the input cut from the left to the model's context
        (`(context + continuation)[-(L + 1):][:-1]`), the continuation tokens' log-softmax summed, and `greedy`
        when the argmax at every continuation position is its token. Batches of `options.batch_size`, longest
        first, left-padded with position ids (one forward pass keeps the logits of the continuation positions
        only).
        """
        if not requests:
            return []
        with self._inflight.call():
            return await self._inflight.run(self._locked, self._loglikelihood_sync, list(requests))

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Reward-model scores (see `harness.backends.hf_reward`), aligned with `requests`; concurrent calls are
        merged into shared batches, as for `generate`.

        Raises:
            ConfigError: a head the checkpoint does not fit (`check_score`).
        """
        with self._inflight.call():
            return await self._merged_score(requests)

    def check_score(self, head: ScoreHead) -> None:
        """Refuse a checkpoint that does not fit `head`, from its config.json (`check_source_head`)."""
        check_source_head(self._source, head, model=f"hf model {self.model!r}")

    # --------------------------------------------------------------------------------------------------------
    # Internals

    def _locked(self, fn: Callable[..., T], *args: Any, stop: threading.Event) -> T:
        """`fn(*args, stop=stop)` holding the model (loaded first), unless `stop` is set before it starts; the
        result of work whose stop was set while it ran is never returned, whatever caught the stop inside it."""
        what = f"work on hf model {self.model!r}"
        with self._lock:
            self._ensure_loaded()
            check_stop(stop, what)
            self._stop = stop
            try:
                result = fn(*args, stop=stop)
            finally:
                self._stop = None
            check_stop(stop, what)
            return result

    def _stop_between_layers(self, module: Any, args: Any) -> None:
        """The forward pre-hook of every decoder layer: raises `Cancelled` once the working call's stop is set."""
        if self._stop is not None:
            check_stop(self._stop, f"work on hf model {self.model!r}")

    def encode(self, messages: Sequence[Message], assistant_prefix: str = "") -> list[int]:
        """Token ids of the prompt (see `encode_chat`)."""
        return encode_chat(self.tokenizer, messages, assistant_prefix)

    def _prompt(
        self, messages: Sequence[Message], prefix: str = ""
    ) -> tuple[list[int] | None, Failure | None]:
        return prompt_ids(self.tokenizer, messages, prefix, self.context_length)

    def _pad(self, prompts: list[list[int]]):
        from harness.backends.hf_reward import pad_rows

        return pad_rows(self._torch, prompts, self._pad_id, left=True, device=self._lm.device)

    def _token_mask(self) -> Any:
        """The llguidance token table of this tokenizer, built on the first constrained request; False when the
        tokenizer cannot be read (said once; requests then run without their constraint)."""
        if self._mask is None:
            from harness.backends.grammar import TokenMask

            try:
                self._mask = TokenMask(self._tok)
            except ValueError as exc:  # llguidance cannot read this tokenizer's decoder
                log.warning("structured output unavailable for hf model %s (%s): generating without the "
                            "constraint; the output's parser still checks it", self.model, exc)
                self._mask = False
                self._lacks["structured output"] = f"unsupported ({exc}): plain generation, the parser reads it"
        return self._mask

    def _constraint(self, constraint: Constraint | None) -> tuple[Constraint | None, Failure | None]:
        """The constraint a row runs with (None without a usable mask), or why the request fails (a constraint
        that does not compile)."""
        if constraint is None or not self._token_mask():
            return None, None
        try:
            self._mask.matcher(constraint)
        except ConfigError as exc:
            return None, Failure(FailureCategory.BAD_REQUEST, str(exc))
        return constraint, None

    def _require_causal_lm(self) -> None:
        if self._classifier:
            raise not_generative(f"hf model {self.model!r}", self._config)

    def _score_sync(self, requests: list[ScoreRequest], *, stop: threading.Event) -> list[ScoreResult]:
        """Reward-model scores of `requests`; `_locked` checked `stop` before, and the batches then run whole."""
        from harness.backends.hf_reward import score_batches

        for head in sorted({r.head for r in requests}):
            check_score_head(self._config, head, model=f"hf model {self.model!r}")
        return score_batches(
            requests, self._lm, self._tok, self._torch, classifier=self._classifier, pad_id=self._pad_id,
            context_length=self.context_length, batch_size=self.options.batch_size,
        )

    def _generate_sync(self, requests: list[GenerateRequest], *, stop: threading.Event) -> list[Completion]:
        self._require_causal_lm()
        failures: dict[int, Failure] = {}
        prompt_tokens: dict[int, int] = {}
        rows: list[Row] = []
        extra_stops = () if self.chat_template else PLAIN_STOPS
        for i, req in enumerate(requests):
            ids, failure = self._prompt(req.messages, req.assistant_prefix)
            if failure is not None:
                failures[i] = failure
                continue
            p = req.params
            constraint, failure = self._constraint(p.constraint)
            if failure is not None:
                failures[i] = failure
                continue
            prompt_tokens[i] = len(ids)
            max_new = p.max_tokens
            if self.context_length:
                max_new = min(max_new, self.context_length - len(ids))
            for s in range(1 if p.greedy else p.n):
                seed = sample_seed(p.seed, s)
                stops = tuple(p.stop) + extra_stops
                rows.append(
                    Row(i, s, ids, max_new, p.temperature, p.top_p, seed, stops, p.logprobs, p.min_tokens,
                        constraint)
                )
        # Rows asking for logprobs batch together, so other batches need not keep their logits.
        rows.sort(key=lambda r: (r.logprobs > 0, -len(r.ids)))
        outputs: dict[tuple[int, int], Output] = {}
        size = self.options.batch_size
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            check_stop(stop, f"generation on hf model {self.model!r}")
            try:
                results = self._generate_batch(batch, stop)
            except Cancelled:
                raise
            except Exception as exc:  # e.g. out of memory: fail the requests of this batch, keep the rest
                for r in batch:
                    failures.setdefault(r.req, backend_failure(f"generation failed: {type(exc).__name__}: {exc}"))
                continue
            for r, out in zip(batch, results):
                outputs[(r.req, r.sample)] = out
        completions = []
        for i, req in enumerate(requests):
            if i in failures:
                completions.append(Completion((), error=failures[i]))
                continue
            p = req.params
            samples = [outputs[(i, 0 if p.greedy else s)] for s in range(p.n)]
            completions.append(
                Completion(
                    tuple(o.text for o in samples),
                    Usage(prompt_tokens[i], sum(o.n_tokens for o in samples)),
                    logprobs=tuple(o.logprobs or () for o in samples) if p.logprobs else None,
                )
            )
        return completions

    def _generate_batch(self, batch: list[Row], stop: threading.Event) -> list[Output]:
        torch = self._torch
        ids, mask = self._pad([r.ids for r in batch])
        want_logits = any(r.logprobs for r in batch)
        constrained = any(r.constraint is not None for r in batch)
        # On an accelerator the next masks are computed while the device runs the forward pass. On the CPU they are
        # computed in turn: they take about 0.2 ms, and a second thread's tensor operations beside the forward
        # pass's share its cores and slowed every decode pass about 2x (measured, 2 cores).
        if constrained and self._masks_pool is None and self._lm.device.type != "cpu":
            from concurrent.futures import ThreadPoolExecutor

            self._masks_pool = ThreadPoolExecutor(1, thread_name_prefix="hf-masks")
        budget = max(r.max_new for r in batch)
        log.debug("hf model %s: generating %d rows of up to %d new tokens", self.model, len(batch), budget)
        checks = [0]  # one check before each forward pass: the steps done are the checks less one

        def check() -> None:
            checks[0] += 1
            # Rows cut short by the stop are not answers: the call raises instead of returning them.
            check_stop(stop, f"generation on hf model {self.model!r}")

        try:
            with torch.inference_mode():
                done = decode(
                    self._lm, torch, batch, ids, mask, eos_ids=self._eos_ids, pad_id=self._pad_id,
                    decode_tail=lambda tail: self._tok.decode(tail, skip_special_tokens=True),
                    token_mask=self._token_mask() if constrained else None,
                    jump_forward=self.options.jump_forward, keep_logits=want_logits, masks_pool=self._masks_pool,
                    check=check,
                )
        except Cancelled:
            log.debug("hf model %s: generation stopped after %d of up to %d new tokens", self.model,
                      max(0, checks[0] - 1), budget)
            raise
        self.decode_counts["forward_passes"] += done.forward_passes
        self.decode_counts["forced_tokens"] += done.forced_tokens
        self.decode_counts["tokens"] += sum(len(t) for t in done.tokens)
        eos = set(self._eos_ids)
        results = []
        for j, r in enumerate(batch):
            gen, n_tokens, text, start = answer_span(self._tok, done.tokens[j], eos, r.stops,
                                                     plain=not self.chat_template)
            logprobs = None
            if r.logprobs:
                logprobs = self._token_logprobs(done.logits[j], gen, r.logprobs, start, start + len(text))
            results.append(Output(text, n_tokens, logprobs))
        return results

    def _token_logprobs(
        self, logits: Sequence[Any], gen: list[int], k: int, start: int, end: int
    ) -> tuple[TokenLogprob, ...]:
        """TokenLogprobs of the generated tokens `gen` of a row that overlap the answer's `[start, end)`
        characters, from the raw `logits` of each (`harness.backends.hf_decode`)."""
        torch = self._torch
        pieces = token_pieces(self._tok, gen)
        keep = tokens_within(pieces, end, start)
        if not keep:
            return ()
        steps = torch.stack([logits[t] for t in keep]).float()
        logprobs = torch.log_softmax(steps, dim=-1)
        chosen = logprobs.gather(1, torch.tensor([gen[t] for t in keep], device=steps.device)[:, None])
        values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        chosen, values, ids = chosen[:, 0].tolist(), values.tolist(), ids.tolist()
        texts = self._token_texts
        return tuple(
            TokenLogprob(pieces[t], chosen[n], top_texts(self._tok, zip(ids[n], values[n]), texts))
            for n, t in enumerate(keep)
        )

    def _candidate_ids(self, candidate: str) -> list[int]:
        if candidate not in self._candidate_cache:
            self._candidate_cache[candidate] = candidate_token_ids(self._tok, candidate)
        return self._candidate_cache[candidate]

    def _logprobs_sync(
        self, requests: list[LogprobRequest], candidates: list[str], *, stop: threading.Event
    ) -> list[LogprobResult]:
        self._require_causal_lm()
        cand_ids = {c: self._candidate_ids(c) for c in candidates}
        results: list[LogprobResult | None] = [None] * len(requests)
        single: list[tuple[int, list[int]]] = []
        branched: list[tuple[int, list[list[int]]]] = []
        for i, req in enumerate(requests):
            encoded, failure = encode_contexts(req, self._prompt)
            if failure is not None:
                results[i] = LogprobResult({}, error=failure)
            elif req.branches:
                branched.append((i, encoded))
            else:
                single.append((i, encoded[0]))
        single.sort(key=lambda t: -len(t[1]))
        size = self.options.batch_size
        what = f"forward passes on hf model {self.model!r}"
        for start in range(0, len(single), size):
            batch = single[start : start + size]
            check_stop(stop, what)
            try:
                rows = self._last_logprobs([p for _, p in batch])
            except Cancelled:
                raise
            except Exception as exc:
                for i, _ in batch:
                    results[i] = LogprobResult({}, error=_forward_failure(exc))
                continue
            for (i, ids), row in zip(batch, rows):
                results[i] = LogprobResult(_pick(row, cand_ids), usage=Usage(len(ids), 0))
        # Requests in chunks of up to `size` (a chunk's shared starts are one pass); a chunk that fails is run
        # again one request at a time, so that only the request at fault fails.
        for start in range(0, len(branched), size):
            chunk = branched[start : start + size]
            check_stop(stop, what)
            try:
                found = self._branch_logprobs([seqs for _, seqs in chunk])
            except Cancelled:
                raise
            except Exception as exc:
                if len(chunk) == 1:
                    results[chunk[0][0]] = LogprobResult({}, error=_forward_failure(exc))
                    continue
                found = []
                for i, seqs in chunk:
                    check_stop(stop, what)
                    try:
                        found += self._branch_logprobs([seqs])
                    except Cancelled:
                        raise
                    except Exception as err:
                        found.append(_forward_failure(err))
            for (i, _), got in zip(chunk, found):
                if isinstance(got, Failure):
                    results[i] = LogprobResult({}, error=got)
                    continue
                rows, computed = got
                branches = tuple(_pick(row, cand_ids) for row in rows)
                results[i] = LogprobResult({}, branches=branches, usage=Usage(computed, 0))
        return results  # type: ignore[return-value]

    def _loglikelihood_sync(
        self, requests: list[LoglikelihoodRequest], *, stop: threading.Event
    ) -> list[LoglikelihoodResult]:
        self._require_causal_lm()
        results: list[LoglikelihoodResult | None] = [None] * len(requests)
        rows: list[tuple[int, list[int], int, bool]] = []  # (request, ids, continuation tokens, context cut)
        limit = self.context_length or 2048  # lm-eval's default max length where the config has none
        for i, req in enumerate(requests):
            try:
                ctx, cont = loglikelihood_ids(self._tok, req)
            except Exception as exc:  # e.g. a template that rejects a system turn
                results[i] = LoglikelihoodResult(None, error=backend_failure(
                    f"cannot tokenize the context: {type(exc).__name__}: {exc}"))
                continue
            if not cont:
                results[i] = LoglikelihoodResult(0.0, True, 0)
                continue
            if len(cont) > limit:
                results[i] = LoglikelihoodResult(None, error=backend_failure(
                    f"continuation has {len(cont)} tokens; the model's context is {limit}"))
                continue
            whole = ctx + cont
            rows.append((i, whole[-(limit + 1):], len(cont), len(whole) > limit + 1))
        rows.sort(key=lambda r: -len(r[1]))
        size = self.options.batch_size
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            check_stop(stop, f"forward passes on hf model {self.model!r}")
            try:
                found = self._continuation_logprobs([ids for _, ids, _, _ in batch], [n for _, _, n, _ in batch])
            except Cancelled:
                raise
            except Exception as exc:
                for i, *_ in batch:
                    results[i] = LoglikelihoodResult(None, error=_forward_failure(exc))
                continue
            for (i, ids, n, cut), (logprob, greedy) in zip(batch, found):
                results[i] = LoglikelihoodResult(logprob, greedy, n, cut, usage=Usage(len(ids) - 1, 0))
        return results  # type: ignore[return-value]

    def _continuation_logprobs(self, seqs: list[list[int]], lengths: list[int]) -> list[tuple[float, bool]]:
        """(summed log-probability, greedy) of the last `lengths[j]` tokens of each `seqs[j]` given the tokens
        before them: the model reads `seqs[j][:-1]`, left-padded, and keeps the logits of the last positions."""
        torch = self._torch
        ids, mask = self._pad([s[:-1] for s in seqs])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = max(lengths)
        with torch.inference_mode():
            logits = self._lm(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
            logits = logits[:, -keep:, :].float()
            out = []
            for j, (seq, n) in enumerate(zip(seqs, lengths)):
                logp = torch.log_softmax(logits[j, keep - n:, :], dim=-1)
                target = torch.tensor(seq[-n:], dtype=torch.long, device=logp.device)
                picked = logp.gather(-1, target[:, None])[:, 0]
                out.append((float(picked.sum()), bool((logp.argmax(-1) == target).all())))
        return out

    def _last_logprobs(self, prompts: list[list[int]]) -> list[Any]:
        """Log-softmax of the next-token logits after each prompt (one left-padded forward pass)."""
        torch = self._torch
        ids, mask = self._pad(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            out = self._lm(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
            return list(torch.log_softmax(out.logits[:, -1, :].float(), dim=-1).cpu())

    def _branch_logprobs(self, requests: list[list[list[int]]]) -> list[tuple[list[Any], int]]:
        """For each request (its branches' token ids), the next-token log-softmax after each branch and the number
        of prompt tokens computed: the tokens a request's branches all share are computed once.

        One left-padded forward pass over the requests' shared starts fills a KV cache; the branches then run in
        batches of up to `batch_size` rows, each on a copy of the cache holding its request's row, right-padded
        (padding after a branch's last token cannot change that token's logits under causal attention), only each
        branch's last position through the vocabulary head where this transformers can keep one per row.
        """
        torch = self._torch
        device = self._lm.device
        per_row = self._keep_per_row
        # Each branch keeps at least its last token, whose logits are read; a chunk in which some request's branches
        # share no token runs every branch whole.
        shared = [min(len(os.path.commonprefix(seqs)), min(len(s) for s in seqs) - 1) for seqs in requests]
        if min(shared) <= 0:
            shared = [0] * len(requests)
        branches = [(r, seq[shared[r] :]) for r, seqs in enumerate(requests) for seq in seqs]
        found: list[list[Any]] = [[] for _ in requests]
        with torch.inference_mode():
            cache, starts = None, torch.zeros((len(requests), 0), dtype=torch.long)
            if shared[0] > 0:  # (all share some, or none does)
                starts_ids, starts = self._pad([seqs[0][: shared[r]] for r, seqs in enumerate(requests)])
                out = self._lm(input_ids=starts_ids, attention_mask=starts,
                               position_ids=(starts.cumsum(-1) - 1).clamp(min=0), use_cache=True)
                cache = out.cache if hasattr(out, "cache") else out.past_key_values  # renamed in v5
                starts = starts.cpu()
            size = self.options.batch_size
            for start in range(0, len(branches), size):
                batch = branches[start : start + size]
                rows = torch.tensor([r for r, _ in batch])
                n, width = len(batch), max(len(t) for _, t in batch)
                ids = torch.full((n, width), self._pad_id, dtype=torch.long)
                mask = torch.cat([starts[rows], torch.zeros((n, width), dtype=torch.long)], dim=1)
                for j, (_, t) in enumerate(batch):
                    ids[j, : len(t)] = torch.tensor(t, dtype=torch.long)
                    mask[j, starts.shape[1] : starts.shape[1] + len(t)] = 1
                positions = torch.tensor([[shared[r]] for r, _ in batch]) + torch.arange(width)
                past = None
                if cache is not None:  # the cache's rows of this batch, the shared cache itself left as it is
                    past = copy.deepcopy(cache, _kept_tensors(cache, torch))
                    past.batch_select_indices(rows.to(device))
                last = torch.tensor([len(t) - 1 for _, t in batch])
                keep = last[:, None].to(device) if per_row else 0
                logits = self._lm(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    position_ids=positions.to(device),
                    use_cache=past is not None,
                    logits_to_keep=keep,
                    **{self._cache_arg: past},
                ).logits
                picked = logits[:, -1] if per_row else logits[torch.arange(n), last]
                for (r, _), row in zip(batch, torch.log_softmax(picked.float(), dim=-1).cpu()):
                    found[r].append(row)
        return [(rows, shared[r] + sum(len(s) - shared[r] for s in requests[r])) for r, rows in enumerate(found)]

def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a transformers model: its `GradientCheckpointingLayer`s (every decoder layer of
    transformers' causal LMs and sequence classifiers derives from it), else the entries of a `ModuleList`
    named `layers`."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers before the shared base class
        found = []
    else:
        found = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not found:
        import torch

        for name, m in model.named_modules():
            if name.split(".")[-1] == "layers" and isinstance(m, torch.nn.ModuleList):
                found += list(m)
    return found


def _kept_tensors(cache: Any, torch: Any) -> dict[int, Any]:
    """A `copy.deepcopy` memo that keeps the key and value tensors of `cache`'s layers: the copy gets layers of its
    own (`batch_select_indices` then replaces their tensors with the rows it picks) without copying every row."""
    return {id(t): t for layer in getattr(cache, "layers", ()) for t in vars(layer).values()
            if isinstance(t, torch.Tensor) and t.dim() == 4}


def _pick(row: Any, cand_ids: dict[str, list[int]]) -> dict[str, float]:
    """Candidate -> the largest log-probability among its token ids in `row` (`-inf` without any)."""
    return {c: (float(row[t].max()) if t else float("-inf")) for c, t in cand_ids.items()}


def _forward_failure(exc: Exception) -> Failure:
    return backend_failure(f"forward pass failed: {type(exc).__name__}: {exc}")
