"""`harness bench verify`: the three verification modes on the same rubric and responses.

Prints, per mode (and for `per_item` and `batched` also under their structured-output constraint), calls, re-asks,
parse failures, prompt and completion tokens, wall time, completion tokens per second and the agreement of its
verdicts with `per_item` (the paper's serial scheme), then the ratios, all measured in one run. Calls are counted
as the backend sees them: requests for `hf` and `vllm` (a `logprob` request with M branches is one), HTTP requests
for `openai` (one per branch, re-asks and retries included). The rubric and responses are a fixed example shipped
with the package (`harness/examples/verify_bench.json`, up to 10 items x 6 responses). The call cache is bypassed
so every mode does its real work; the model is loaded once and warmed up before timing, the warm-up also asking
what a server's capability probes need to know (prefill, structured output, min_tokens, logprobs), so no probe
is timed.

A throughput line follows: 8 prompts x 64 tokens in one `generate` call (requests/s, tokens/s), and for a `vllm:`
model the same for `hf:` on the same checkpoint with the ratio, measured in one run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from harness.backends.base import (
    BaseBackend,
    BackendOptions,
    Completion,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    SamplingParams,
    user_chat,
)
from harness.errors import ConfigError, FailureCategory

MODES = (("per_item", False), ("per_item", True), ("batched", False), ("batched", True), ("logprob", False))
"""(mode, structured) in the order run; the first is the reference the others are compared with."""


class _Counting:
    """Wraps a backend and counts calls (HTTP requests where the backend counts them) and tokens."""

    def __init__(self, backend: BaseBackend) -> None:
        self.backend = backend
        self.kind, self.model = backend.kind, backend.model
        self.reset()

    def reset(self) -> None:
        self.requests = self.prompt_tokens = self.completion_tokens = 0
        self._http0 = getattr(self.backend, "http_requests", None)

    @property
    def calls(self) -> int:
        """HTTP requests since `reset` for a backend that counts them (`openai`), else requests."""
        if self._http0 is not None:
            return self.backend.http_requests - self._http0  # type: ignore[attr-defined]
        return self.requests

    def identity(self) -> dict[str, str]:
        return self.backend.identity()

    def capabilities(self) -> dict[str, str]:
        return self.backend.capabilities()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        out = await self.backend.generate(requests)
        self.requests += len(requests)
        self.prompt_tokens += sum(c.usage.prompt_tokens for c in out)
        self.completion_tokens += sum(c.usage.completion_tokens for c in out)
        return out

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        out = await self.backend.next_token_logprobs(requests, candidates)
        self.requests += len(requests)
        self.prompt_tokens += sum(r.usage.prompt_tokens for r in out)
        return out

    async def probe(self) -> None:
        await self.backend.probe()

    async def close(self) -> None:
        await self.backend.close()


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    structured: bool
    calls: int
    reasks: int
    parse_failures: int
    """Requests (per item x response in `per_item`, per response in `batched`) still unreadable after a re-ask;
    in `logprob`, cells whose position ranked neither word."""
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    failed_cells: int
    """Cells (item x response) without a verdict."""
    agreement: float | None
    """Share of cells where the hard verdict (P(yes) >= 0.5) equals per_item's, over cells both answered."""
    compared: int
    """Cells both this mode and per_item answered."""

    @property
    def label(self) -> str:
        return self.mode + (" (constrained)" if self.structured else "")

    @property
    def tokens_per_s(self) -> float | None:
        """Completion tokens per second of wall time (None for `logprob`, which generates nothing)."""
        return self.completion_tokens / self.wall_s if self.completion_tokens and self.wall_s > 0 else None


def load_example(items: int, responses: int) -> tuple[str, list[str], object]:
    from judges.rubric import Rubric, RubricItem

    data = json.loads(resources.files("harness").joinpath("examples/verify_bench.json").read_text())
    if not 1 <= items <= len(data["rubric"]):
        raise ConfigError(f"--items must be in 1..{len(data['rubric'])} (the shipped example's size)")
    if not 1 <= responses <= len(data["responses"]):
        raise ConfigError(f"--responses must be in 1..{len(data['responses'])} (the shipped example's size)")
    rubric = Rubric(tuple(RubricItem(d["criterion"], d["weight"]) for d in data["rubric"][:items]))
    return data["prompt"], data["responses"][:responses], rubric


def _agreement(verdicts, reference) -> tuple[float | None, int]:
    pairs = [
        (v >= 0.5, r >= 0.5)
        for row, ref_row in zip(verdicts, reference)
        for v, r in zip(row, ref_row)
        if v is not None and r is not None
    ]
    return (sum(a == b for a, b in pairs) / len(pairs) if pairs else None), len(pairs)


async def run_bench_verify(
    spec: str,
    *,
    items: int,
    responses: int,
    max_tokens: int = 16,
    options: BackendOptions | None = None,
    throughput: dict | None = None,
) -> tuple[list[ModeResult], list[Throughput], dict[str, str]]:
    """Run the three modes with the model `spec` and measure each; then, with `throughput` (the keyword
    arguments of `measure_throughput`), the generation throughput of the same backend and, for a `vllm:` model,
    of `hf:` on the same checkpoint. Returns the modes, the throughputs and what the backend lacked
    (`BaseBackend.capabilities`)."""
    from harness.backends import load_backend
    from judges.verify import verify

    prompt, texts, rubric = load_example(items, responses)
    backend = _Counting(load_backend(spec, options or BackendOptions()))
    speeds: list[Throughput] = []
    try:
        await backend.probe()
        await _warm_up(backend)
        results, reference = [], None
        for mode, structured in MODES:
            backend.reset()
            start = time.perf_counter()
            found = await verify(backend, prompt, texts, rubric, mode=mode, max_tokens=max_tokens,
                                 structured=structured)
            wall = time.perf_counter() - start
            if reference is None:
                reference = found.verdicts
            agreement, compared = _agreement(found.verdicts, reference)
            failed = sum(v is None for row in found.verdicts for v in row)
            parse = sum(f.failure.category is FailureCategory.PARSE for f in found.failures)
            results.append(ModeResult(
                mode, structured, backend.calls, len(found.raw.get("retries", ())), parse,
                backend.prompt_tokens, backend.completion_tokens, wall, failed, agreement, compared,
            ))
        if throughput is not None:
            speeds.append(await measure_throughput(backend.backend, spec, **throughput))
        lacking = backend.capabilities()
    finally:
        await backend.close()
    if throughput is not None:
        for other in throughput_specs(spec)[1:]:
            compared_with = load_backend(other, options or BackendOptions())
            try:
                speeds.append(await measure_throughput(compared_with, other, **throughput))
            finally:
                await compared_with.close()
    return results, speeds, lacking


async def _warm_up(backend: BaseBackend) -> None:
    """One request of each kind the modes send, so the model is warm and a server's capability probes (prefill,
    structured output, min_tokens, logprobs) are done before anything is timed."""
    from judges.verify import SHEET_PREFILL, VERDICT_CHOICE, YES_NO, sheet_constraint, sheet_params

    chat = user_chat("Say yes.")
    # A question whose free answer breaks the constraints, so a server that ignores them is found out here.
    other = user_chat("Describe the sea in one sentence.")
    await backend.generate([
        GenerateRequest(chat, SamplingParams(max_tokens=2)),
        GenerateRequest(other, SamplingParams(max_tokens=64, constraint=VERDICT_CHOICE)),
        GenerateRequest(other, SamplingParams(max_tokens=64, constraint=sheet_constraint(1)), SHEET_PREFILL),
        GenerateRequest(other, sheet_params(1, 16), SHEET_PREFILL),  # min_tokens
    ])
    await backend.next_token_logprobs([LogprobRequest(chat)], YES_NO)


def format_bench_verify(results: list[ModeResult], *, spec: str, items: int, responses: int) -> str:
    lines = [
        f"verify bench: {spec}, {items} items x {responses} responses = {items * responses} verdicts per mode",
        f"{'mode':<24}{'calls':>6}{'re-asks':>8}{'parse fail':>11}{'prompt tok':>11}{'compl tok':>10}"
        f"{'wall s':>8}{'tok/s':>8}{'no verdict':>11}{'agree w/ per_item':>19}",
    ]
    for r in results:
        agree = "-" if r.agreement is None else f"{r.agreement:.2f} ({r.compared})"
        speed = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.1f}"
        lines.append(
            f"{r.label:<24}{r.calls:>6}{r.reasks:>8}{r.parse_failures:>11}{r.prompt_tokens:>11}"
            f"{r.completion_tokens:>10}{r.wall_s:>8.2f}{speed:>8}{r.failed_cells:>11}{agree:>19}"
        )
    base = results[0]
    for r in results[1:]:
        if r.structured:
            continue
        calls = base.calls / r.calls if r.calls else float("inf")
        wall = base.wall_s / r.wall_s if r.wall_s else float("inf")
        lines.append(f"per_item/{r.mode}: calls {calls:.1f}x, wall time {wall:.2f}x")
    free = {r.mode: r for r in results if not r.structured}
    for r in results:
        if r.structured and r.tokens_per_s and free[r.mode].tokens_per_s:
            ratio = r.tokens_per_s / free[r.mode].tokens_per_s  # type: ignore[operator]
            lines.append(f"{r.mode}: tokens/s constrained/free {ratio:.2f}x; parse failures "
                         f"{free[r.mode].parse_failures} free, {r.parse_failures} constrained")
    lines.append("calls: " + ("HTTP requests, as the server counts them (one per logprob branch)"
                              if spec.startswith("openai:")
                              else "backend requests (a logprob request carries every item of a response)"))
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Throughput:
    spec: str
    requests: int
    completion_tokens: int
    wall_s: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


THROUGHPUT_PROMPTS = ("Describe {topic} in detail.", "Write a short story about {topic}.")
THROUGHPUT_TOPICS = ("the sea", "a library", "winter", "a train journey")


async def measure_throughput(
    backend: BaseBackend, spec: str, *, prompts: int = 8, max_tokens: int = 64
) -> Throughput:
    """One `generate` call of `prompts` distinct greedy prompts, each held to exactly `max_tokens` new tokens
    (`min_tokens` where the backend honours it), after a warm-up request; the call cache is not involved."""
    texts = [t.format(topic=topic) for t in THROUGHPUT_PROMPTS for topic in THROUGHPUT_TOPICS]
    texts = [texts[i % len(texts)] + ("" if i < len(texts) else f" (version {i})") for i in range(prompts)]
    requests = [
        GenerateRequest(user_chat(t), SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens)) for t in texts
    ]
    await backend.generate([GenerateRequest(user_chat("Say yes."), SamplingParams(max_tokens=2))])
    start = time.perf_counter()
    out = await backend.generate(requests)
    wall = time.perf_counter() - start
    failed = [c.error for c in out if not c.ok]
    if failed:
        raise ConfigError(f"throughput run on {spec}: {len(failed)} of {prompts} requests failed: {failed[0]}")
    return Throughput(spec, prompts, sum(c.usage.completion_tokens for c in out), wall)


def throughput_specs(spec: str) -> list[str]:
    """The model itself and, for a `vllm:` model, `hf:` on the same checkpoint (the two are compared)."""
    from harness.backends import parse_spec

    kind, _ = parse_spec(spec)
    return [spec, "hf:" + spec.partition(":")[2]] if kind == "vllm" else [spec]


def format_throughput(results: list[Throughput], *, prompts: int, max_tokens: int) -> str:
    lines = [f"throughput: {prompts} prompts x {max_tokens} tokens in one generate call, after a warm-up"]
    width = max(len(r.spec) for r in results)
    for r in results:
        lines.append(
            f"{r.spec:<{width}}  {r.requests_per_s:6.2f} requests/s  {r.tokens_per_s:7.1f} tokens/s  "
            f"({r.completion_tokens} tokens in {r.wall_s:.2f} s)"
        )
    if len(results) == 2:
        a, b = results
        ratio = a.tokens_per_s / b.tokens_per_s
        lines.append(f"{a.spec.partition(':')[0]}/{b.spec.partition(':')[0]}: {ratio:.2f}x tokens/s")
    return "\n".join(lines)


def bench_verify_sync(
    spec: str,
    *,
    items: int,
    responses: int,
    options: BackendOptions | None = None,
    throughput: bool = True,
    prompts: int = 8,
    max_tokens: int = 64,
) -> str:
    sizes = {"prompts": prompts, "max_tokens": max_tokens}
    results, speeds, lacking = asyncio.run(
        run_bench_verify(
            spec, items=items, responses=responses, options=options, throughput=sizes if throughput else None
        )
    )
    text = format_bench_verify(results, spec=spec, items=items, responses=responses)
    if lacking:
        text += "\n" + "\n".join(f"{spec} lacks {feature}: {how}" for feature, how in lacking.items())
    if speeds:
        text += "\n" + format_throughput(speeds, prompts=prompts, max_tokens=max_tokens)
    return text
