"""`harness run TABLE` and `harness eval`: evaluators x benchmarks x items x repeats into a run directory.

Every (evaluator, benchmark, item, repeat) becomes one `score_set` call and one line in `records.jsonl`; the seed of
each call derives from (run seed, item id, repeat), so AVG@k repeats sample different rubrics and candidate orders.
Rows whose specs coincide (the `cpu` preset maps several paper rows to one model) are scored once. Re-running into
the same directory skips finished records; a benchmark whose data cannot be loaded, or an evaluator that cannot be
built, is recorded in the manifest and rendered as a dash, and the rest of the run goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.runstore import RunDir
from harness.seeds import derive_seed

KEY_FIELDS = ("evaluator", "benchmark", "item", "repeat")


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What to run: row label -> evaluator spec, benchmarks, and how."""

    rows: dict[str, str]
    benchmarks: tuple[str, ...]
    seeds: int = 5
    seed: int = 0
    limit: int | None = None
    data_dir: Path | None = None
    parallel: int = 8


@dataclass(slots=True)
class RunOutcome:
    """What a run did (for the summary line)."""

    scored: int = 0
    skipped: int = 0
    incomplete: int = 0
    unavailable: dict[str, str] = field(default_factory=dict)
    """Benchmark or evaluator -> why it was not run."""


def _fingerprint(items: list) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps([item.id, item.prompt, list(item.responses)], ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def _record(spec: str, bench: str, item: Any, repeat: int, seed: int, result: Any) -> dict[str, Any]:
    record = {
        "evaluator": spec,
        "benchmark": bench,
        "item": item.id,
        "repeat": repeat,
        "seed": seed,
        "kind": "pairwise" if hasattr(item, "preferred") else "listwise",
        "meta": dict(item.meta),
        **result.to_json(),
    }
    if hasattr(item, "preferred"):
        record["preferred"] = item.preferred
    else:
        record["gold_ranks"] = list(item.gold_ranks)
    return record


def load_benchmarks(plan: RunPlan, outcome: RunOutcome) -> dict[str, list]:
    """Items per benchmark; a benchmark that fails to load is noted in `outcome.unavailable`."""
    from benchmarks import register_all
    from harness.registry import lookup

    register_all()
    loaded = {}
    for name in plan.benchmarks:
        try:
            loaded[name] = lookup("benchmark", name).load(data_dir=plan.data_dir, limit=plan.limit, seed=plan.seed)
        except HarnessError as exc:
            outcome.unavailable[f"benchmark {name}"] = str(exc)
    return loaded


async def run_plan(
    plan: RunPlan,
    run: RunDir,
    pool: Any,
    *,
    config: dict[str, Any],
    on_total: Callable[[int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> RunOutcome:
    """Score everything the plan names that `run.records` lacks, appending records as they finish."""
    from judges import load_evaluator

    outcome = RunOutcome()
    items = load_benchmarks(plan, outcome)
    run.manifest.start(
        command="run",
        config=config,
        extra={
            "rows": plan.rows,
            "dataset_fingerprints": {b: _fingerprint(v) for b, v in items.items()},
            "dataset_sizes": {b: len(v) for b, v in items.items()},
        },
    )
    evaluators = {}
    for spec in dict.fromkeys(plan.rows.values()):
        try:
            evaluators[spec] = load_evaluator(spec, pool)
        except HarnessError as exc:
            outcome.unavailable[f"evaluator {spec}"] = str(exc)
    todo = [
        (spec, bench, item, repeat)
        for spec in evaluators
        for bench, bench_items in items.items()
        for item in bench_items
        for repeat in range(plan.seeds)
        if not _done(run.records.get((spec, bench, item.id, repeat)))
    ]
    outcome.skipped = sum(len(v) for v in items.values()) * plan.seeds * len(evaluators) - len(todo)
    if on_total:
        on_total(len(todo))
    gate = asyncio.Semaphore(plan.parallel)

    async def one(spec: str, bench: str, item: Any, repeat: int) -> None:
        seed = derive_seed(plan.seed, bench, item.id, repeat)
        async with gate:
            result = await evaluators[spec].score_set(item.prompt, item.responses, seed=seed)
        run.records.append([_record(spec, bench, item, repeat, seed, result)])
        if result.n_unscored:
            outcome.incomplete += 1
        outcome.scored += 1
        if on_progress:
            on_progress(1)

    status = "interrupted"
    try:
        await asyncio.gather(*(one(*t) for t in todo))
        status = "finished"
    finally:
        run.records.close()
        run.manifest.finish(status=status, summary={"scored": outcome.scored, "skipped": outcome.skipped,
                                                    "with_unscored": outcome.incomplete,
                                                    "unavailable": outcome.unavailable})
    return outcome


_TRANSIENT = {"rate_limit", "server_error", "timeout", "connection"}


def _done(record: dict | None) -> bool:
    """Finished, unless a transient backend failure (API trouble) left responses unscored: those are retried.

    A parse failure is final: it is the evaluator's measured behaviour, counted wrong under `n_failed`, and a
    rerun would only replay the same cached outputs.
    """
    if record is None:
        return False
    return not any(f["category"] in _TRANSIENT for f in record["trace"]["failures"])
