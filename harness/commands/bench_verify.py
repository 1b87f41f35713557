"""`harness bench verify`: the three verification modes on the same rubric and responses.

Prints, per mode, backend calls, prompt and completion tokens, wall time and the agreement of its verdicts with
`per_item` (the paper's serial scheme), then the ratios. The rubric and responses are a fixed example shipped with
the package (`harness/examples/verify_bench.json`, up to 10 items x 6 responses). The call cache is bypassed so
every mode does its real work; the model is loaded once and warmed up before timing.

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
    Backend,
    BackendOptions,
    Completion,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    SamplingParams,
    user_chat,
)
from harness.errors import ConfigError

MODES = ("per_item", "batched", "logprob")


class _Counting:
    """Wraps a backend and counts requests and tokens."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.kind, self.model = backend.kind, backend.model
        self.reset()

    def reset(self) -> None:
        self.calls = self.prompt_tokens = self.completion_tokens = 0

    def identity(self) -> dict[str, str]:
        return self.backend.identity()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        out = await self.backend.generate(requests)
        self.calls += len(requests)
        self.prompt_tokens += sum(c.usage.prompt_tokens for c in out)
        self.completion_tokens += sum(c.usage.completion_tokens for c in out)
        return out

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        out = await self.backend.next_token_logprobs(requests, candidates)
        self.calls += len(requests)
        self.prompt_tokens += sum(r.usage.prompt_tokens for r in out)
        return out

    async def probe(self) -> None:
        await self.backend.probe()

    async def close(self) -> None:
        await self.backend.close()


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    failed_cells: int
    """Cells (item x response) without a verdict."""
    agreement: float | None
    """Share of cells where the hard verdict (P(yes) >= 0.5) equals per_item's, over cells both answered."""
    compared: int
    """Cells both this mode and per_item answered."""


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
) -> tuple[list[ModeResult], list[Throughput]]:
    """Run the three modes with the model `spec` and measure each; then, with `throughput` (the keyword
    arguments of `measure_throughput`), the generation throughput of the same backend and, for a `vllm:` model,
    of `hf:` on the same checkpoint."""
    from harness.backends import load_backend
    from judges.verify import verify

    prompt, texts, rubric = load_example(items, responses)
    backend = _Counting(load_backend(spec, options or BackendOptions()))
    speeds: list[Throughput] = []
    try:
        await backend.probe()
        await backend.generate(
            [GenerateRequest(user_chat("Say yes."), SamplingParams(max_tokens=2))]
        )  # warm-up
        results, reference = [], None
        for mode in MODES:
            backend.reset()
            start = time.perf_counter()
            found = await verify(backend, prompt, texts, rubric, mode=mode, max_tokens=max_tokens)
            wall = time.perf_counter() - start
            if mode == "per_item":
                reference = found.verdicts
            agreement, compared = _agreement(found.verdicts, reference)
            failed = sum(v is None for row in found.verdicts for v in row)
            results.append(
                ModeResult(
                    mode,
                    backend.calls,
                    backend.prompt_tokens,
                    backend.completion_tokens,
                    wall,
                    failed,
                    agreement,
                    compared,
                )
            )
        if throughput is not None:
            speeds.append(await measure_throughput(backend.backend, spec, **throughput))
    finally:
        await backend.close()
    if throughput is not None:
        for other in throughput_specs(spec)[1:]:
            compared_with = load_backend(other, options or BackendOptions())
            try:
                speeds.append(await measure_throughput(compared_with, other, **throughput))
            finally:
                await compared_with.close()
    return results, speeds


def format_bench_verify(results: list[ModeResult], *, spec: str, items: int, responses: int) -> str:
    lines = [
        f"verify bench: {spec}, {items} items x {responses} responses = {items * responses} verdicts per mode",
        f"{'mode':<10}{'calls':>7}{'prompt tok':>12}{'compl tok':>11}{'wall s':>9}{'no verdict':>12}"
        f"{'agree w/ per_item':>19}",
    ]
    for r in results:
        agree = "-" if r.agreement is None else f"{r.agreement:.2f} ({r.compared})"
        lines.append(
            f"{r.mode:<10}{r.calls:>7}{r.prompt_tokens:>12}{r.completion_tokens:>11}{r.wall_s:>9.2f}"
            f"{r.failed_cells:>12}{agree:>19}"
        )
    base = results[0]
    for r in results[1:]:
        calls = base.calls / r.calls if r.calls else float("inf")
        wall = base.wall_s / r.wall_s if r.wall_s else float("inf")
        lines.append(f"per_item/{r.mode}: calls {calls:.1f}x, wall time {wall:.2f}x")
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
    backend: Backend, spec: str, *, prompts: int = 8, max_tokens: int = 64
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
    results, speeds = asyncio.run(
        run_bench_verify(
            spec, items=items, responses=responses, options=options, throughput=sizes if throughput else None
        )
    )
    text = format_bench_verify(results, spec=spec, items=items, responses=responses)
    if speeds:
        text += "\n" + format_throughput(speeds, prompts=prompts, max_tokens=max_tokens)
    return text
