"""`harness run TABLE` and `harness eval`: evaluators x benchmarks x items x repeats into a run directory.

Every (evaluator, benchmark, item, repeat) is one unit of the evaluation loop (`harness.loop`): one `score_set`
call and one `EvalRecord`; its seed derives from (run seed, benchmark, item id, repeat), so AVG@k repeats sample
different rubrics and candidate orders. Rows whose specs coincide (the `cpu` preset maps several paper rows to one
model) are scored once.

Everything is loaded and built before any model call: a benchmark whose data cannot be loaded (or holds no
items) and an evaluator that cannot be built stop the run with one error line, unless `skip_unavailable` is set,
when they are left out, listed in the manifest and rendered as dashes. The run directory is bound to the rows,
benchmarks, limit, repeats, seed, the data's fingerprints and the models' identities (`harness.runstore`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError
from harness.loop import LoopSummary, Unit, write_output
from harness.records import EvalRecord
from harness.runstore import OutputPaths
from harness.seeds import derive_seed


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What to run: row label -> evaluator spec, benchmarks, and how."""

    rows: dict[str, str]
    benchmarks: tuple[str, ...]
    table: str | None = None
    seeds: int = 5
    seed: int = 0
    limit: int | None = None
    data_dir: Path | None = None
    skip_unavailable: bool = False


@dataclass(slots=True)
class Prepared:
    """A plan made ready: items loaded, evaluators built (no model loaded, none called)."""

    items: dict[str, list] = field(default_factory=dict)
    """Benchmark -> its items."""
    evaluators: dict[str, Any] = field(default_factory=dict)
    """Evaluator spec -> evaluator."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """`benchmark NAME` / `evaluator SPEC` -> why it was left out (only with `skip_unavailable`)."""


def fingerprint(items: list) -> str:
    """A short hash of every item's id, prompt, responses and gold label, in order."""
    h = hashlib.sha256()
    for item in items:
        gold = item.preferred if hasattr(item, "preferred") else list(item.gold_ranks)
        h.update(json.dumps([item.id, item.prompt, list(item.responses), gold], ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def _load_one(name: str, plan: RunPlan) -> list:
    from harness.registry import lookup

    bench = lookup("benchmark", name)
    source = f"--data-dir {plan.data_dir}" if plan.data_dir else "the Hugging Face Hub"
    try:
        items = bench.load(data_dir=plan.data_dir, limit=plan.limit, seed=plan.seed)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"benchmark {name!r}: a data file under {source} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"benchmark {name!r}: cannot read {exc.filename or source}: {exc.strerror}") from None
    if not items:
        raise ConfigError(f"benchmark {name!r} loaded no items from {source}")
    return items


def prepare(plan: RunPlan, pool: Any) -> Prepared:
    """Load every benchmark and build every evaluator (lazily: no weights load here).

    Raises:
        ConfigError: an unknown or unloadable benchmark, an evaluator that cannot be built, or nothing left to
            run; with `skip_unavailable` only the last.
    """
    from benchmarks import register_all
    from judges import load_evaluator

    register_all()
    ready = Prepared()
    for name in plan.benchmarks:
        try:
            ready.items[name] = _load_one(name, plan)
        except HarnessError as exc:
            if not plan.skip_unavailable:
                raise
            ready.unavailable[f"benchmark {name}"] = str(exc)
    for spec in dict.fromkeys(plan.rows.values()):
        try:
            ready.evaluators[spec] = load_evaluator(spec, pool)
        except HarnessError as exc:
            if not plan.skip_unavailable:
                raise ConfigError(f"evaluator {spec!r} cannot be built: {exc}") from None
            ready.unavailable[f"evaluator {spec}"] = str(exc)
    if not ready.items or not ready.evaluators:
        missing = "benchmark" if not ready.items else "evaluator"
        reasons = "; ".join(f"{k}: {v}" for k, v in ready.unavailable.items())
        raise ConfigError(f"no {missing} could be loaded, nothing to run ({reasons})")
    return ready


def settings(plan: RunPlan, ready: Prepared, pool: Any) -> dict[str, Any]:
    """What the run directory is bound to."""
    models = pool.identities()
    return {
        "table": plan.table,
        "rows": plan.rows,
        "benchmarks": list(plan.benchmarks),
        "limit": plan.limit,
        "seeds": plan.seeds,
        "seed": plan.seed,
        "data": {name: fingerprint(items) for name, items in ready.items.items()},
        "models": models,
    }


def units(plan: RunPlan, ready: Prepared) -> list[Unit[tuple[str, str, Any, int]]]:
    """One unit per (evaluator spec, benchmark, item, repeat)."""
    return [
        Unit(((spec, bench, item.id, repeat),), (spec, bench, item, repeat))
        for spec in ready.evaluators
        for bench, items in ready.items.items()
        for item in items
        for repeat in range(plan.seeds)
    ]


async def run_plan(
    plan: RunPlan,
    out_dir: Path,
    pool: Any,
    *,
    ready: Prepared | None = None,
    parallel: int = 8,
    command: str = "run",
    config: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    wait: bool = False,
    retry_failed: bool = False,
) -> LoopSummary:
    """Score everything the plan names into the run directory `out_dir` (resuming it); see `harness.loop`.

    Args:
        ready: The plan prepared (`prepare`); prepared here when not given.
        config: The resolved configuration to record in the manifest.
    """
    from harness.registry import lookup

    ready = ready or prepare(plan, pool)
    extra = {
        "rows": plan.rows,
        "benchmark_kinds": {b: lookup("benchmark", b).kind for b in ready.items},
        "dataset_sizes": {b: len(v) for b, v in ready.items.items()},
        "unavailable": ready.unavailable,
        "evaluator_settings": {spec: dict(ev.settings) for spec, ev in ready.evaluators.items()},
    }
    return await write_output(
        OutputPaths.run_dir(out_dir),
        EvalRecord,
        command=command,
        settings=settings(plan, ready, pool),
        config=dict(config or {}),
        extra=extra,
        units=units(plan, ready),
        work=make_work(plan, ready),
        parallel=parallel,
        noun="sets",
        counters=pool,
        overwrite=overwrite,
        wait=wait,
        retry_failed=retry_failed,
    )


def make_work(plan: RunPlan, ready: Prepared):
    """The loop's work function: one (spec, benchmark, item, repeat) -> its `EvalRecord`."""

    async def work(unit: tuple[str, str, Any, int]) -> list[EvalRecord]:
        spec, bench, item, repeat = unit
        seed = derive_seed(plan.seed, bench, item.id, repeat)
        result = await ready.evaluators[spec].score_set(item.prompt, item.responses, seed=seed)
        pairwise = hasattr(item, "preferred")
        record = EvalRecord(
            evaluator=spec,
            benchmark=bench,
            item=item.id,
            repeat=repeat,
            seed=seed,
            kind="pairwise" if pairwise else "listwise",
            scores=result.scores,
            meta=dict(item.meta),
            preferred=item.preferred if pairwise else None,
            gold_ranks=None if pairwise else tuple(item.gold_ranks),
            trace=result.trace.to_json(),
        )
        return [record]

    return work
