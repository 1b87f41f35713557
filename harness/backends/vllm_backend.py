"""The `vllm` backend: vLLM's offline engine (`vllm.LLM`) in this process, with prefix caching. GPU only.

`vllm:NAME` takes the same names as `hf:` (hub id with optional `@revision`, local folder, `.gguf` file
converted once). vLLM is an optional extra that replaces torch with a CUDA build, so it is imported only when
a backend is built; without it, or without a CUDA device, construction raises `BackendUnavailableError`.

Deviations from a plain `LLM.chat(...)` call, all to make `vllm:` and `hf:` mean the same thing:
- Prompts are rendered by the same function as the `hf` backend (`harness.backends.hf.encode_chat`: the
  tokenizer's chat template with `add_generation_prompt=True`, or the plain-text rendering for tokenizers
  without one) and passed to `LLM.generate` as token prompts. This is what `LLM.chat` does internally, and it
  also gives the plain-text fallback, assistant prefixes, and a per-request failure (instead of a failed
  batch) for a prompt longer than the context.
- A request with `n` samples runs as `n` one-sample prompts seeded with `sample_seed(params.seed, i)`, so
  sample i is the same whatever `n` is (prefix caching makes the repeated prompt free). Greedy requests run
  once and repeat.
- Only the request's parameters apply: the checkpoint's generation-config sampling defaults are not merged.
- Logprobs come from one generated token with `logprobs=options.top_logprobs`: a candidate outside the
  returned top tokens gets `-inf`. The branches of a request are separate prompts of one engine call; prefix
  caching shares their common start (`usage` counts every prompt's tokens, shared or not).
- `min_tokens` maps to vLLM's own `min_tokens`.
- Token logprobs of generated text (`params.logprobs = k > 0`) ask vLLM for `logprobs=k` (its default mode:
  the model's raw distribution, as in `hf`) and are shaped as in `hf`: `token` is the token's share of the
  text (`hf.token_pieces` over the sample's token ids), `top` the k best of vLLM's entries keyed by
  `tokenizer.decode([id])` (vLLM adds the sampled token when it is outside the top k; that extra is left out),
  and tokens wholly past the text (the end-of-sequence token, tokens after a stop string) are dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

from harness.backends.base import (
    BackendOptions,
    Completion,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    TokenLogprob,
    Usage,
    sample_seed,
)
from harness.backends.merge import CallMerger
from harness.errors import BackendUnavailableError, Failure, FailureCategory
from harness.registry import register

INSTALL_HINT = 'vllm backend needs the GPU extra: pip install "dynamicrubric-harness[vllm]" on a CUDA machine'


def _failure(message: str) -> Failure:
    return Failure(FailureCategory.BACKEND, " ".join(message.split()))


@register("backend", "vllm")
class VLLMBackend:
    """vLLM's offline engine in this process: GPU extra, prefix caching, tensor/data parallelism.

    Implements the `Backend` protocol as the module docstring describes.

    Args:
        name: Hub id (optionally `@revision`), local checkpoint folder, or `.gguf` file.
        options: `tensor_parallel_size`, `data_parallel_size`, `gpu_memory_utilization`, `max_model_len`,
            `dtype`, `top_logprobs`; other fields are ignored.

    Raises:
        BackendUnavailableError: vllm not installed (the engine starts on the first request: no CUDA device
            or an option this vLLM lacks fail then).
        ModelNotFoundError: for a missing local path, or a hub id that is neither cached nor on the hub.
    """

    kind = "vllm"

    def __init__(self, name: str, options: BackendOptions | None = None) -> None:
        from harness.backends.hf import locate_model

        self.model = name
        self.options = options or BackendOptions()
        if importlib.util.find_spec("vllm") is None:
            raise BackendUnavailableError(INSTALL_HINT)
        self._source = locate_model(name, kind=self.kind)
        self._identity = dict(self._source.identity)
        self._llm: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._token_texts: dict[int, str] = {}
        self._merged_generate = CallMerger(self._generate_now)
        self.loads = 0
        """How many times the engine was started (0 until the first request the cache could not answer)."""

    def load(self) -> None:
        """Start the engine now (a no-op once started).

        Raises:
            BackendUnavailableError: no CUDA device, an option this vLLM lacks, or the backend is closed.
        """
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"vllm backend for {self.model!r} is closed")
            if self._llm is None:
                self._start()

    def _start(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"no CUDA device found; {INSTALL_HINT}")
        import vllm

        src, opts = self._source, self.options
        engine_fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
        kwargs: dict[str, Any] = {
            "model": src.path,
            "enable_prefix_caching": True,
            "tensor_parallel_size": opts.tensor_parallel_size,
            "gpu_memory_utilization": opts.gpu_memory_utilization,
            "dtype": opts.dtype,
        }
        if src.revision:
            kwargs["revision"] = src.revision
        if opts.max_model_len is not None:
            kwargs["max_model_len"] = opts.max_model_len
        if opts.data_parallel_size != 1:
            if "data_parallel_size" not in engine_fields:
                raise BackendUnavailableError(
                    f"this vLLM ({vllm.__version__}) has no data_parallel_size; set it to 1 or upgrade vllm"
                )
            kwargs["data_parallel_size"] = opts.data_parallel_size
        llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        self._tok = llm.get_tokenizer()
        self._llm = llm
        self.context_length = self._max_model_len()
        self.loads += 1

    def _max_model_len(self) -> int | None:
        engine = self._llm.llm_engine
        config = getattr(engine, "model_config", None)
        if config is None and hasattr(engine, "get_model_config"):
            config = engine.get_model_config()
        return getattr(config, "max_model_len", None) or self.options.max_model_len

    def identity(self) -> dict[str, str]:
        """`{"kind": "vllm", "model": name}` plus `"weights"` (local) or `"revision"` (hub), as for `hf`."""
        return dict(self._identity)

    async def probe(self) -> None:
        """Start the engine (the call cache probes a backend before its first uncached request)."""
        await asyncio.to_thread(self.load)

    async def close(self) -> None:
        """Drop the engine (vLLM frees its GPU memory when the engine is collected)."""
        await asyncio.to_thread(self._drop)

    def _drop(self) -> None:
        with self._lock:
            self._closed = True
            self._llm = None

    def _prompt(self, messages, prefix: str = "") -> tuple[list[int] | None, Failure | None]:
        from harness.backends.hf import encode_chat

        try:
            ids = encode_chat(self._tok, messages, prefix)
        except Exception as exc:
            return None, _failure(f"cannot render the chat: {type(exc).__name__}: {exc}")
        if self.context_length and len(ids) >= self.context_length:
            return None, _failure(
                f"prompt has {len(ids)} tokens; the model's context is {self.context_length}"
            )
        return ids, None

    def _run(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        with self._lock:
            if self._llm is None:
                raise BackendUnavailableError(f"vllm backend for {self.model!r} is closed")
            return self._llm.generate(
                [{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False
            )

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Complete every request; aligned with `requests`, never raises per request.

        Concurrent calls are merged into one engine call (`CallMerger`), so the engine batches them.
        """
        await self.probe()
        return await self._merged_generate(requests)

    async def _generate_now(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        from harness.backends.hf import PLAIN_STOPS, has_chat_template

        SamplingParams = self._vllm.SamplingParams
        extra_stops = [] if has_chat_template(self._tok) else list(PLAIN_STOPS)
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
            extra: dict[str, Any] = {"logprobs": p.logprobs} if p.logprobs else {}
            if p.min_tokens:
                extra["min_tokens"] = min(p.min_tokens, max_new)
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
            try:
                results = await asyncio.to_thread(self._run, prompts, params)
            except BackendUnavailableError:
                raise
            except Exception as exc:
                for i, _ in rows:
                    failures.setdefault(i, _failure(f"generation failed: {type(exc).__name__}: {exc}"))
                results = []
            for (i, s), out in zip(rows, results):
                sample = out.outputs[0]
                k = requests[i].params.logprobs
                try:
                    logprobs = self._token_logprobs(sample, k) if k else None
                except Exception as exc:  # e.g. an engine that returned no logprobs
                    message = f"reading token logprobs failed: {type(exc).__name__}: {exc}"
                    failures.setdefault(i, _failure(message))
                    continue
                outputs[(i, s)] = (sample.text, len(sample.token_ids), logprobs)
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

    def _token_logprobs(self, sample: Any, k: int) -> tuple[TokenLogprob, ...]:
        """The TokenLogprobs of a vLLM `CompletionOutput` generated with `logprobs=k`."""
        from harness.backends.hf import token_pieces, tokens_within, top_texts

        ids = list(sample.token_ids)
        steps = sample.logprobs
        if steps is None or len(steps) < len(ids):
            got = 0 if steps is None else len(steps)
            raise ValueError(f"vLLM returned logprobs for {got} of {len(ids)} generated tokens")
        pieces = token_pieces(self._tok, ids)
        result = []
        for t in tokens_within(pieces, len(sample.text)):
            step = steps[t]  # {token id: Logprob}: the k best plus the sampled token
            ranked = sorted(((tid, float(lp.logprob)) for tid, lp in step.items()), key=lambda e: -e[1])
            top = top_texts(self._tok, ranked[:k], self._token_texts)
            result.append(TokenLogprob(pieces[t], float(step[ids[t]].logprob), top))
        return tuple(result)

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        """Log-probabilities of each candidate's first token (max over `c` and `" " + c`), from the top
        `options.top_logprobs` of one generated token; `-inf` for candidates outside them. Every context of
        every request (branches included) goes to the engine in one `generate` call; prefix caching computes
        what branches share once."""
        from harness.backends.hf import candidate_token_ids, encode_contexts

        await self.probe()
        cand_ids = {c: candidate_token_ids(self._tok, c) for c in candidates}
        params = self._vllm.SamplingParams(
            n=1, temperature=0.0, max_tokens=1, logprobs=self.options.top_logprobs
        )
        results: list[LogprobResult | None] = [None] * len(requests)
        todo: list[tuple[int, list[list[int]]]] = []
        for i, req in enumerate(requests):
            encoded, failure = encode_contexts(req, self._prompt)
            if failure is not None:
                results[i] = LogprobResult({}, error=failure)
            else:
                todo.append((i, encoded))
        prompts = [ids for _, seqs in todo for ids in seqs]
        outs: list[Any] = []
        if prompts:
            try:
                outs = await asyncio.to_thread(self._run, prompts, [params] * len(prompts))
            except BackendUnavailableError:
                raise
            except Exception as exc:
                for i, _ in todo:
                    results[i] = LogprobResult(
                        {}, error=_failure(f"generation failed: {type(exc).__name__}: {exc}")
                    )
                todo = []
        at = 0
        for i, seqs in todo:
            found = []
            for out in outs[at : at + len(seqs)]:
                step = out.outputs[0].logprobs[0]  # {token_id: Logprob} at the first generated position
                found.append(
                    {
                        c: max((step[t].logprob for t in ids if t in step), default=float("-inf"))
                        for c, ids in cand_ids.items()
                    }
                )
            at += len(seqs)
            usage = Usage(sum(len(ids) for ids in seqs), 0)
            if requests[i].branches:
                results[i] = LogprobResult({}, branches=tuple(found), usage=usage)
            else:
                results[i] = LogprobResult(found[0], usage=usage)
        return results  # type: ignore[return-value]
