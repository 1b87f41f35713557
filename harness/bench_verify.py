"""`harness bench verify`: the three verification modes on the same rubric and responses.

Prints, per mode, backend calls, prompt and completion tokens, wall time and the agreement of its verdicts with
`per_item` (the paper's serial scheme), then the ratios. The rubric and responses are a fixed example shipped with
the package (`harness/examples/verify_bench.json`, up to 10 items x 6 responses). The call cache is bypassed so
every mode does its real work; the model is loaded once and warmed up before timing.
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
    spec: str, *, items: int, responses: int, max_tokens: int = 16, options: BackendOptions | None = None
) -> list[ModeResult]:
    """Run the three modes with the model `spec` and measure each."""
    from harness.backends import load_backend
    from judges.verify import verify

    prompt, texts, rubric = load_example(items, responses)
    backend = _Counting(load_backend(spec, options or BackendOptions()))
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
        return results
    finally:
        await backend.close()


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


def bench_verify_sync(spec: str, *, items: int, responses: int, options: BackendOptions | None = None) -> str:
    results = asyncio.run(run_bench_verify(spec, items=items, responses=responses, options=options))
    return format_bench_verify(results, spec=spec, items=items, responses=responses)
