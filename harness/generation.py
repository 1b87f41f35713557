"""Sampling a model's answers to a prompt set, one output line per (prompt id, sample index): `harness generate`
and the training's response sets both write through it.

Each prompt is one unit of the evaluation loop (`harness.loop`): one request with `n` samples whose seed derives
from the run seed and the prompt id, and `n` `GenerationRecord` lines. The output is bound to its settings (the
model and its identity, the prompts' fingerprint, the sampling parameters, the seed, the limit); a rerun with the
same settings resumes it and retries failed samples.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.backends.base import BaseBackend, GenerateRequest, Message, SamplingParams, chat_to_json
from harness.loop import LoopSummary, Unit, write_output
from harness.records import GenerationRecord
from harness.runstore import OutputPaths
from harness.seeds import derive_seed


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt to answer."""

    id: str
    """Unique id within the set (output lines are keyed by it)."""
    messages: tuple[Message, ...]
    """The chat the model continues."""


@dataclass(frozen=True, slots=True)
class GenerateConfig:
    """The settings of one `harness generate` output (everything that changes what it holds)."""

    model: str
    """Model spec or alias."""
    source: str
    """The prompts file or benchmark name."""
    n: int = 1
    """Samples per prompt."""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int = 0
    """Run seed; each prompt's sampling seed is derived from it and the prompt id."""
    limit: int | None = None
    """Only the first N prompts."""
    stop: tuple[str, ...] = ()
    """Stop strings (the text ends before the first one)."""

    def settings(self, *, identity: dict[str, str], prompts: Sequence[PromptRecord]) -> dict[str, Any]:
        """What the output is bound to: these fields (but where the prompts came from: their fingerprint
        stands for them; no stop strings: left out, as outputs made before they existed), the model's identity
        and the prompts' fingerprint."""
        fields = {k: v for k, v in asdict(self).items() if k != "source" and not (k == "stop" and not v)}
        return {**fields, "model_identity": identity, "prompts": prompts_fingerprint(prompts)}


def prompts_fingerprint(prompts: Sequence[PromptRecord]) -> str:
    """A short hash of every prompt's id and messages, in order."""
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(json.dumps([p.id, chat_to_json(p.messages)], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()[:16]


def units(prompts: Sequence[PromptRecord], config: GenerateConfig) -> list[Unit[PromptRecord]]:
    """One unit per prompt, producing the records (id, 0) .. (id, n-1)."""
    return [Unit(tuple((p.id, i) for i in range(config.n)), p) for p in prompts]


def _request(prompt: PromptRecord, config: GenerateConfig) -> GenerateRequest:
    params = SamplingParams(
        n=config.n,
        temperature=config.temperature,
        top_p=config.top_p,
        max_tokens=config.max_tokens,
        seed=derive_seed(config.seed, prompt.id),
        stop=tuple(config.stop),
    )
    return GenerateRequest(prompt.messages, params)


async def run_generate(
    backend: BaseBackend,
    prompts: Sequence[PromptRecord],
    config: GenerateConfig,
    out: Path,
    *,
    parallel: int = 64,
    runtime: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    wait: bool = False,
    retry_failed: bool = False,
) -> LoopSummary:
    """Generate `config.n` samples per prompt into the output `out` (resuming it); see `harness.loop`.

    Args:
        backend: The model (a `CachedBackend` from the pool, whose call and hit counts the summary reports).
        prompts: What to answer.
        config: The settings the output is bound to.
        out: The output JSONL file.
        parallel: Prompts in flight at once (a local backend merges them into batches).
        runtime: Runtime knobs to record in the manifest (backend options, cache on/off).
    """
    identity = backend.identity()
    return await write_output(
        OutputPaths.file(out),
        GenerationRecord,
        command="generate",
        settings=config.settings(identity=identity, prompts=prompts),
        config={**asdict(config), **(runtime or {})},
        extra={"model_identity": identity},
        units=units(prompts, config),
        work=make_work(backend, config),
        parallel=parallel,
        noun="samples",
        counters=_Counters(backend, config.model) if hasattr(backend, "calls") else None,
        overwrite=overwrite,
        wait=wait,
        retry_failed=retry_failed,
    )


class _Counters:
    """The loop's view of the one backend: its call and hit counts, and what it lacks under its spec."""

    def __init__(self, backend: Any, spec: str) -> None:
        self.backend, self.spec = backend, spec

    @property
    def calls(self) -> int:
        return self.backend.calls

    @property
    def hits(self) -> int:
        return self.backend.hits

    def capabilities(self) -> dict[str, dict[str, str]]:
        lacks = self.backend.capabilities()
        return {self.spec: lacks} if lacks else {}


def make_work(backend: BaseBackend, config: GenerateConfig):
    """The loop's work function: one prompt -> its `n` generation records."""

    async def work(prompt: PromptRecord) -> list[GenerationRecord]:
        [completion] = await backend.generate([_request(prompt, config)])
        if completion.ok:
            return [
                GenerationRecord(prompt.id, i, config.model, completion.texts[i], cached=completion.cached)
                for i in range(config.n)
            ]
        return [GenerationRecord(prompt.id, i, config.model, None, completion.error) for i in range(config.n)]

    return work
