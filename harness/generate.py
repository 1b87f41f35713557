"""`harness generate`: sample policy responses for a prompt set, one output line per (prompt id, sample index).

The output file is an append-only record log: a rerun with the same `--out` skips samples already answered and
retries the ones that failed (failures are recorded, never cached). When a rerun supersedes earlier failure lines
the file is compacted atomically at the end, so it holds exactly one line per (id, sample).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.backends.base import Backend, GenerateRequest, SamplingParams
from harness.prompts import PromptRecord
from harness.runstore import Manifest, RecordLog
from harness.seeds import derive_seed


@dataclass(frozen=True, slots=True)
class GenerateConfig:
    """Resolved settings of one `harness generate` run (written into the manifest)."""

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
    chunk_size: int = 64
    """Requests handed to the backend at once; results are saved after each chunk."""


@dataclass(frozen=True, slots=True)
class GenerateSummary:
    """What a run did."""

    total: int
    """Output lines expected: prompts x n."""
    answered: int
    failed: int
    skipped: int
    """Samples already answered by an earlier run into the same file."""
    backend_calls: int
    cache_hits: int
    failures: dict[str, int]
    """Failed samples per failure category."""
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _answered(line: dict | None) -> bool:
    return line is not None and line.get("error") is None


def _request(record: PromptRecord, config: GenerateConfig) -> GenerateRequest:
    params = SamplingParams(
        n=config.n,
        temperature=config.temperature,
        top_p=config.top_p,
        max_tokens=config.max_tokens,
        seed=derive_seed(config.seed, record.id),
    )
    return GenerateRequest(record.messages, params)


async def run_generate(
    backend: Backend,
    prompts: Sequence[PromptRecord],
    config: GenerateConfig,
    out: Path,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> GenerateSummary:
    """Generate `config.n` samples per prompt into the record log at `out` (resuming it)."""
    manifest = Manifest(out.with_name(out.name + ".manifest.json"))
    manifest.start(command="generate", config=asdict(config), extra={"model_identity": backend.identity()})
    log = RecordLog(out, key_fields=("id", "sample"))
    todo = [p for p in prompts if not all(_answered(log.get((p.id, i))) for i in range(config.n))]
    skipped = (len(prompts) - len(todo)) * config.n
    calls_before = getattr(backend, "calls", 0)
    hits_before = getattr(backend, "hits", 0)
    failures: Counter[str] = Counter()
    answered = failed = prompt_tokens = completion_tokens = 0
    status = "interrupted"
    try:
        await backend.probe()
        for start in range(0, len(todo), config.chunk_size):
            chunk = todo[start : start + config.chunk_size]
            completions = await backend.generate([_request(p, config) for p in chunk])
            lines = []
            for record, completion in zip(chunk, completions):
                for i in range(config.n):
                    line = {"id": record.id, "sample": i, "model": config.model, "text": None, "error": None}
                    if completion.ok:
                        line["text"] = completion.texts[i]
                        line["cached"] = completion.cached
                        answered += 1
                    else:
                        line["error"] = completion.error.to_json()
                        failures[completion.error.category.value] += 1
                        failed += 1
                    lines.append(line)
                prompt_tokens += completion.usage.prompt_tokens
                completion_tokens += completion.usage.completion_tokens
            log.append(lines)
            if on_progress:
                on_progress(len(chunk))
        status = "finished" if not failed else "finished_with_failures"
    finally:
        log.compact()
        summary = GenerateSummary(
            total=len(prompts) * config.n,
            answered=answered,
            failed=failed,
            skipped=skipped,
            backend_calls=getattr(backend, "calls", 0) - calls_before,
            cache_hits=getattr(backend, "hits", 0) - hits_before,
            failures=dict(failures),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
        manifest.finish(status=status, summary=asdict(summary))
    return summary


def generate_sync(*args, **kwargs) -> GenerateSummary:
    """`run_generate` from synchronous code."""
    return asyncio.run(run_generate(*args, **kwargs))
