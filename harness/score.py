"""`harness score`: score `{id, prompt, responses}` sets with an evaluator, one output line per set.

Resumable like `harness generate`: the output is a record log keyed by id; a rerun skips sets that were scored
completely and retries sets with unscored responses. Each set's seed derives from the run seed and its id.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.prompts import iter_jsonl_records
from harness.runstore import Manifest, RecordLog
from harness.seeds import derive_seed


@dataclass(frozen=True, slots=True)
class ResponseSet:
    """One prompt and the candidate responses to score together."""

    id: str
    prompt: str
    responses: tuple[str, ...]


def read_sets_file(path: Path) -> list[ResponseSet]:
    """Read `{"id", "prompt", "responses": [str, ...]}` lines.

    Raises:
        ConfigError: naming the file and line of the first malformed or duplicate record.
    """
    sets = []
    for where, rid, obj in iter_jsonl_records(path, what="input"):
        prompt, responses = obj.get("prompt"), obj.get("responses")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
        if not isinstance(responses, list) or not responses or not all(isinstance(r, str) for r in responses):
            raise ConfigError(f"{where}: 'responses' must be a non-empty list of strings")
        sets.append(ResponseSet(rid, prompt, tuple(responses)))
    return sets


@dataclass(frozen=True, slots=True)
class ScoreSummary:
    """What a `harness score` run did."""

    total: int
    scored: int
    """Sets whose every response got a score."""
    incomplete: int
    """Sets with at least one unscored response (recorded with their failures; retried on rerun)."""
    skipped: int
    """Sets already scored by an earlier run into the same file."""
    backend_calls: int
    cache_hits: int
    failures: dict[str, int]
    """Recorded failures per category (over all stages)."""


async def run_score(
    evaluator,
    sets: Sequence[ResponseSet],
    out: Path,
    *,
    seed: int = 0,
    parallel: int = 8,
    pool=None,
    config: dict | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> ScoreSummary:
    """Score every set with `evaluator` (a `judges.base.Evaluator`) into the record log at `out`."""
    manifest = Manifest(out.with_name(out.name + ".manifest.json"))
    manifest.start(command="score", config={"evaluator": evaluator.spec, "seed": seed, **(config or {})})
    log = RecordLog(out, key_fields=("id",))
    todo = [s for s in sets if (log.get((s.id,)) or {}).get("n_unscored", 1) != 0]
    calls_before = pool.calls if pool else 0
    hits_before = pool.hits if pool else 0
    failures: Counter[str] = Counter()
    counts = Counter()
    gate = asyncio.Semaphore(parallel)

    async def one(item: ResponseSet) -> None:
        async with gate:
            result = await evaluator.score_set(item.prompt, item.responses, seed=derive_seed(seed, item.id))
        record = {"id": item.id, "evaluator": evaluator.spec, **result.to_json()}
        log.append([record])
        counts["scored" if result.n_unscored == 0 else "incomplete"] += 1
        failures.update(f.failure.category.value for f in result.trace.failures)
        if on_progress:
            on_progress(1)

    status = "interrupted"
    try:
        await asyncio.gather(*(one(s) for s in todo))
        status = "finished" if not counts["incomplete"] else "finished_with_failures"
    finally:
        log.compact()
        summary = ScoreSummary(
            total=len(sets),
            scored=counts["scored"],
            incomplete=counts["incomplete"],
            skipped=len(sets) - len(todo),
            backend_calls=(pool.calls if pool else 0) - calls_before,
            cache_hits=(pool.hits if pool else 0) - hits_before,
            failures=dict(failures),
        )
        manifest.finish(status=status, summary=asdict(summary))
    return summary
