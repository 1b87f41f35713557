"""`harness run TABLE` and `harness eval`: evaluators (or policies) x benchmarks x items x repeats into a run directory.

Every (evaluator, benchmark, item, repeat) is one unit of the evaluation loop (`harness.loop`): one `score_set`
call and one `EvalRecord`; its seed derives from (run seed, benchmark, item id, repeat), so AVG@k repeats sample
different rubrics and candidate orders. Rows whose specs coincide (the `cpu` preset maps several paper rows to one
model) are scored once.

Everything is loaded and built before any model call: a benchmark whose data cannot be loaded (or holds no
items) and an evaluator that cannot be built stop the run with one error line, unless `skip_unavailable` is set,
when they are left out, listed in the manifest and rendered as dashes. The run directory is bound to the rows,
benchmarks, limit, repeats, seed, the data's fingerprints and the models' identities (`harness.runstore`).

A policy table (a plan with a `judge`) runs the same loop over policies: a unit answers one item with the row's
policy (seed from the same parts), takes the reasoning out of the judged text and has the benchmark's judge judge
it (`judges.policy`); the run is also bound to the judge (model, backend options, settings) and the generation
settings, so a run judged otherwise never resumes into it. Both the policy's and the judge's calls go through the
call cache, so a judge failure retried on rerun costs no new policy call.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.base import fingerprint
from harness.backends.base import GenerateRequest, SamplingParams
from harness.errors import ConfigError, HarnessError
from harness.loop import LoopSummary, Unit, write_output
from harness.records import EvalRecord
from harness.runstore import OutputPaths
from harness.seeds import derive_seed


@dataclass(frozen=True, slots=True)
class Generation:
    """How a policy answers a policy benchmark's items (one sample per item and repeat)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 4096
    stop: tuple[str, ...] = ()
    strip_thinking: bool = True
    """Judge the answer without its `<think>` blocks (`judges.policy.strip_thinking`); the raw text is kept."""

    def params(self, seed: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens,
                              stop=tuple(self.stop), seed=seed)


@dataclass(frozen=True, slots=True)
class JudgeSpec:
    """A policy table's judge: its model, the backend options it needs of its own, its settings per benchmark."""

    model: str | None
    """Model spec (`openai:gpt-4.1`); None for a table of verifiable tasks, checked without a model."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """`BackendOptions` fields for the judge alone (`base_url`, `api_key_env`, `concurrency`, ...)."""
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Benchmark -> its judge's settings (`judges.policy.judge_options`)."""

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "options": dict(self.options),
                "settings": {b: dict(v) for b, v in sorted(self.settings.items())}}


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What to run: row label -> evaluator spec (policy tables: the policy's model spec), benchmarks, and how."""

    rows: dict[str, str]
    benchmarks: tuple[str, ...]
    table: str | None = None
    seeds: int = 5
    seed: int = 0
    limit: int | None = None
    data_dir: Path | None = None
    skip_unavailable: bool = False
    judge: JudgeSpec | None = None
    """Set for a policy table: rows are policies, judged by this judge."""
    generation: Generation = field(default_factory=Generation)
    """Policy tables: how the policies answer."""
    bench_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Benchmark -> extra keyword arguments of its `load` (`writingbench`: `subset`; `arena_hard_v2`:
    `missing_baseline`)."""
    devices: Any = None
    """The accelerators the local models share (`harness.plan.Devices`); None: unbounded, one phase."""
    items: Mapping[str, Any] | None = None
    """Benchmark -> the ids of the only items to run of it (every item the loader gives, `limit` aside, is
    searched); None: all items up to `limit`."""

    @property
    def policy(self) -> bool:
        return self.judge is not None


@dataclass(slots=True)
class Prepared:
    """A plan made ready: items loaded, evaluators built (no model loaded, none called)."""

    items: dict[str, list] = field(default_factory=dict)
    """Benchmark -> its items."""
    evaluators: dict[str, Any] = field(default_factory=dict)
    """Evaluator spec -> evaluator."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """`benchmark NAME` / `evaluator SPEC` -> why it was left out (only with `skip_unavailable`)."""
    policies: dict[str, Any] = field(default_factory=dict)
    """Policy tables: policy spec -> its backend."""
    judges: dict[str, Any] = field(default_factory=dict)
    """Policy tables: benchmark -> its judge (on the judge's backend)."""
    judge_backend: Any = None
    needs: dict[str, frozenset[str]] = field(default_factory=dict)
    """Row spec -> the pool keys of every model its units call (policy rows: the judge's too)."""


def load_options(bench: Any) -> list[str]:
    """The keyword arguments a benchmark's `load` takes beyond data_dir, limit and seed."""
    params = inspect.signature(bench.load).parameters
    return [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
            and n not in ("data_dir", "limit", "seed")]


def _load_one(name: str, plan: RunPlan) -> list:
    from harness.registry import lookup

    bench = lookup("benchmark", name)
    source = f"--data-dir {plan.data_dir}" if plan.data_dir else "the Hugging Face Hub"
    options = dict(plan.bench_options.get(name) or {})
    unknown = sorted(set(options) - set(load_options(bench)))
    if unknown:
        valid = ", ".join(load_options(bench)) or "none"
        raise ConfigError(f"benchmark {name!r}: unknown option(s) {', '.join(unknown)}; valid: {valid}")
    wanted = (plan.items or {}).get(name)
    try:
        items = bench.load(data_dir=plan.data_dir, limit=None if wanted else plan.limit, seed=plan.seed, **options)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"benchmark {name!r}: a data file under {source} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"benchmark {name!r}: cannot read {exc.filename or source}: {exc.strerror}") from None
    if not items:
        raise ConfigError(f"benchmark {name!r} loaded no items from {source}")
    return _only(name, items, wanted) if wanted else items


def _only(name: str, items: list, wanted: Any) -> list:
    """The items whose ids are `wanted`, in that order.

    Raises:
        ConfigError: naming the ids the benchmark does not hold (and a few it does).
    """
    by_id = {item.id: item for item in items}
    missing = [i for i in wanted if i not in by_id]
    if missing:
        shown = ", ".join(list(by_id)[:3])
        raise ConfigError(f"benchmark {name!r} holds no item {missing[0]!r} ({len(by_id)} items, e.g. {shown})")
    return [by_id[i] for i in dict.fromkeys(wanted)]


def prepare(plan: RunPlan, pool: Any) -> Prepared:
    """Load every benchmark and build every evaluator (lazily: no weights load here).

    Raises:
        ConfigError: an unknown or unloadable benchmark, an evaluator that cannot be built, or nothing left to
            run; with `skip_unavailable` only the last.
    """
    ready = load_benchmarks(plan)
    build_models(plan, pool, ready)
    pool.preflight()
    check_built(plan, ready, doing="run")
    return ready


def check_built(plan: RunPlan, ready: Prepared, *, doing: str) -> None:
    """Refuse a run left with no benchmark or no evaluator (policy) to `doing` (`run`, `plan`)."""
    built = ready.policies if plan.policy else ready.evaluators
    if not ready.items or not built:
        missing = "benchmark" if not ready.items else "policy" if plan.policy else "evaluator"
        reasons = "; ".join(f"{k}: {v}" for k, v in ready.unavailable.items())
        raise ConfigError(f"no {missing} could be loaded, nothing to {doing} ({reasons})")


def load_benchmarks(plan: RunPlan) -> Prepared:
    """Check the run's `bench_options` and benchmark kinds, and load every benchmark's items (with
    `skip_unavailable`, one that cannot be loaded is listed in `unavailable` instead); `run` and `plan` alike.

    Raises:
        ConfigError: options for a benchmark the run lacks, a benchmark of the wrong kind for the table, or one
            that cannot be loaded (an unknown option or item, data not found), unless `skip_unavailable`.
    """
    from harness.registry import did_you_mean, lookup

    stray = sorted(set(plan.bench_options) - set(plan.benchmarks))
    if stray:  # a misspelt name would be recorded in the manifest and silently ignored
        raise ConfigError(f"bench_options: {stray[0]!r} is not a benchmark of this run"
                          f"{did_you_mean(stray[0], plan.benchmarks)}; its benchmarks: {', '.join(plan.benchmarks)}")
    ready = Prepared()
    for name in plan.benchmarks:
        kind = lookup("benchmark", name).kind
        if (kind == "policy") != plan.policy:
            raise ConfigError(
                f"benchmark {name!r} is a policy benchmark: run it in a policy table (table2, table6, table8), "
                "with harness eval --policy SPEC --judge SPEC, or answer it with harness generate" if kind == "policy" else
                f"benchmark {name!r} is a {kind} evaluator benchmark; a policy table runs policy benchmarks"
            )
        try:
            ready.items[name] = _load_one(name, plan)
        except HarnessError as exc:
            if not plan.skip_unavailable:
                raise
            ready.unavailable[f"benchmark {name}"] = str(exc)
    return ready


def build_models(plan: RunPlan, pool: Any, ready: Prepared) -> Prepared:
    """Build every row's evaluator (policy tables: every policy's backend and each benchmark's judge) into
    `ready`, noting the models each row calls; nothing loads. A judge is built for each benchmark `ready` holds
    items of (all the plan's, when it holds none: `harness plan` without data).

    Raises:
        ConfigError: for an evaluator, policy or judge that cannot be built (unless `skip_unavailable`); for an
            endpoint that seems to mean a model the run would run here (`harness.endpoints.check_matched`; an
            entry for no model of the run is named on stderr).
    """
    from judges import load_evaluator

    from harness.endpoints import check_matched

    if plan.policy:
        _prepare_policies(plan, pool, ready)
    else:
        _build_rows(plan, ready, ready.evaluators, "evaluator", lambda spec: load_evaluator(spec, pool), pool)
    for line in check_matched(pool.endpoints, ready.needs, left_out=ready.unavailable):
        print(f"note: {line}", file=sys.stderr)
    return ready


def _build_rows(plan: RunPlan, ready: Prepared, into: dict[str, Any], what: str, build: Any, pool: Any,
                shared: frozenset[str] = frozenset()) -> Prepared:
    """Build every distinct row spec into `into` (`what`: evaluator or policy), noting the models each uses (with
    the `shared` ones every row calls), or, with `skip_unavailable`, list those that cannot be built."""
    for spec in dict.fromkeys(plan.rows.values()):
        try:
            with pool.recording() as keys:
                into[spec] = build(spec)
            ready.needs[spec] = frozenset(keys) | shared
        except HarnessError as exc:
            if not plan.skip_unavailable:
                raise ConfigError(f"{what} {spec!r} cannot be built: {exc}") from None
            ready.unavailable[f"{what} {spec}"] = str(exc)
    return ready


def _prepare_policies(plan: RunPlan, pool: Any, ready: Prepared) -> Prepared:
    from judges.policy import build_judge, judged_benchmarks

    from harness.registry import did_you_mean

    assert plan.judge is not None
    judged = judged_benchmarks()
    unknown = sorted(set(plan.judge.settings) - set(judged))
    if unknown:
        raise ConfigError(f"judge_settings names {', '.join(unknown)}{did_you_mean(unknown[0], judged)}, "
                          f"which no judge reads; judged: {', '.join(judged)}")
    try:
        with pool.recording() as judge_keys:
            if plan.judge.model is not None:
                ready.judge_backend = pool.get(plan.judge.model, overrides=plan.judge.options)
    except HarnessError as exc:
        raise ConfigError(f"judge {plan.judge.model!r} cannot be built: {exc}") from None
    for bench in ready.items or plan.benchmarks:
        ready.judges[bench] = build_judge(bench, ready.judge_backend, plan.judge.settings.get(bench))
    return _build_rows(plan, ready, ready.policies, "policy", pool.get, pool, frozenset(judge_keys))


def settings(plan: RunPlan, ready: Prepared, pool: Any) -> dict[str, Any]:
    """What the run directory is bound to (policy tables: also the judge and the generation settings)."""
    bound = {
        "table": plan.table,
        "rows": plan.rows,
        "benchmarks": list(plan.benchmarks),
        "limit": plan.limit,
        "seeds": plan.seeds,
        "seed": plan.seed,
        "data": {name: fingerprint(items) for name, items in ready.items.items()},
        "models": pool.identities(),
    }
    if plan.policy:
        bound.update({
            "judge": plan.judge.to_json(),  # type: ignore[union-attr]
            "judge_settings": {b: dict(j.settings) for b, j in sorted(ready.judges.items())},
            "generation": asdict(plan.generation),
            "bench_options": {b: dict(v) for b, v in sorted(plan.bench_options.items())},
        })
    return bound


def units(plan: RunPlan, ready: Prepared, phase: Mapping[str, int] | None = None
          ) -> list[Unit[tuple[str, str, Any, int]]]:
    """One unit per (evaluator or policy spec, benchmark, item, repeat), in the phase of its row's models
    (`phase`: row spec -> phase index; all 0 when not given)."""
    return [
        Unit(((spec, bench, item.id, repeat),), (spec, bench, item, repeat), (phase or {}).get(spec, 0))
        for spec in (ready.policies if plan.policy else ready.evaluators)
        for bench, items in ready.items.items()
        for item in items
        for repeat in range(plan.seeds)
    ]


@dataclass(slots=True)
class Schedule:
    """A run's phases (`harness.plan`): which rows run when, and what is released between phases."""

    phases: list[Any]
    row_phase: dict[str, int]
    """Row spec -> its phase."""
    models: dict[str, Any]
    """Pool key -> `harness.plan.LocalModel` (sized only when the run has devices)."""
    contexts: dict[str, Any] = field(default_factory=dict)
    """Pool key -> `harness.contexts.Context`: the `max_model_len` each local vLLM engine was given."""

    def to_json(self) -> dict[str, Any]:
        return {"phases": [{"models": sorted(p.models), "release_after": sorted(p.release_after)}
                           for p in self.phases],
                "models": {k: dataclasses.asdict(m) for k, m in self.models.items()},
                "contexts": {k: dataclasses.asdict(c) for k, c in self.contexts.items()}}


def schedule_rows(plan: RunPlan, ready: Prepared, pool: Any, *, size: bool = False) -> Schedule:
    """The phases the rows' local models run in, fitted to `plan.devices`, and each vLLM engine placed (its
    devices and share of each); one phase without devices. Each local vLLM engine first gets the run's longest
    request of it as its `max_model_len` (`harness.contexts`), so it is sized and started for that, never for
    the model's own limit. The models are sized from their configs when the plan has devices, or when `size`
    asks.

    Raises:
        ConfigError: for models that do not fit together even alone, with the numbers and the ways out.
    """
    from harness.contexts import fit_contexts, run_asks
    from harness.plan import local_models, place, placements, plan_phases
    from harness.schedule import phase_of

    local = set(pool.local())
    asks = run_asks(plan, ready, pool.key_of)
    contexts = fit_contexts(pool, {k: v for k, v in asks.items() if k in local})
    groups = {spec: frozenset(k for k in keys if k in local) for spec, keys in ready.needs.items()}
    sized = size or plan.devices is not None
    models = local_models(pool, sorted(local), plan.devices) if sized else {}
    phases = plan_phases(groups.values(), models, plan.devices)
    place(pool, placements(phases, models, plan.devices))
    return Schedule(phases, {spec: phase_of(phases, g) for spec, g in groups.items()}, models, contexts)


def phase_hooks(scheduled: Schedule, pool: Any, *, start: bool, engines: Any = None
                ) -> tuple[Callable[[int], Awaitable[None]], Callable[[int], Awaitable[None]]]:
    """The loop's hooks before and after each phase (`harness.loop.run_loop`'s `before_phase`, `after_phase`).

    Before a phase's units, with `start` (a run with devices: its engines share them): the phase's local models
    not yet resident start one after another (`harness.backends.gate.Engines.start`), each `hf:` one first given
    its planned share of every device it spans (`harness.backends.local.even_max_memory`). Without `start` (no
    devices: a CPU machine), models load on their first uncached request, still one at a time (the load gate),
    so a run the call cache answers loads nothing. After a phase, the models the next phase does not need are
    released, and the next phase waits until the memory they took is free again (`Engines.release`: a no-op
    without CUDA).

    Args:
        scheduled: The run's phases and sized models (`schedule_rows`).
        pool: The backend pool.
        start: Start each phase's models up front.
        engines: A `harness.backends.gate.Engines` (tests pass one with a fake memory reader).
    """
    from harness.backends.gate import Engines
    from harness.backends.hf import HFBackend
    from harness.backends.local import even_max_memory

    engines = engines if engines is not None else Engines()

    async def before_phase(index: int) -> None:
        if not start:
            return
        loads = []
        for key in sorted(scheduled.phases[index].models):
            backend = pool.backend(key)
            if backend.resident:
                continue
            inner, sized = backend.backend, scheduled.models.get(key)
            if isinstance(inner, HFBackend) and sized is not None:
                inner.max_memory = even_max_memory(sized.devices, sized.per_device_gib)
            loads.append((key, getattr(inner, "load_blocking", inner.load)))  # hf: on its compute thread
        await engines.start(loads)

    async def after_phase(index: int) -> None:
        await engines.release(scheduled.phases[index].release_after, pool.release)

    return before_phase, after_phase


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
    """Score everything the plan names into the run directory `out_dir` (resuming it); see `harness.loop`. The
    calls the pool's backends look up are recorded in the directory's calls.sqlite (`BackendPool.recording_calls`).

    Args:
        ready: The plan prepared (`prepare`); prepared here when not given.
        config: The resolved configuration to record in the manifest.
    """
    from harness.registry import lookup

    ready = ready or prepare(plan, pool)
    scheduled = schedule_rows(plan, ready, pool)
    replaying = getattr(pool, "replaying", False)  # every call answered from a file: no model starts
    before_phase, after_phase = phase_hooks(scheduled, pool, start=plan.devices is not None and not replaying)

    extra = {
        "rows": plan.rows,
        "benchmark_kinds": {b: lookup("benchmark", b).kind for b in ready.items},
        "dataset_sizes": {b: len(v) for b, v in ready.items.items()},
        "unavailable": ready.unavailable,
        "evaluator_settings": {spec: dict(ev.settings) for spec, ev in ready.evaluators.items()},
        "schedule": scheduled.to_json(),
    }
    if plan.policy:
        identity = ready.judge_backend.identity() if ready.judge_backend is not None else {}
        extra["judge"] = {**plan.judge.to_json(), "identity": identity,  # type: ignore[union-attr]
                          "settings": {b: dict(j.settings) for b, j in sorted(ready.judges.items())}}
        extra["generation"] = asdict(plan.generation)
    try:
        return await write_output(
            OutputPaths.run_dir(out_dir),
            EvalRecord,
            command=command,
            settings=settings(plan, ready, pool),
            config=dict(config or {}),
            extra=extra,
            units=units(plan, ready, scheduled.row_phase),
            work=make_policy_work(plan, ready) if plan.policy else make_work(plan, ready),
            before_phase=before_phase,
            after_phase=after_phase,
            parallel=parallel,
            noun="answers" if plan.policy else "sets",
            counters=pool,
            overwrite=overwrite,
            wait=wait,
            retry_failed=retry_failed,
            calls=getattr(pool, "recording_calls", None),
        )
    finally:
        for judge in ready.judges.values():  # checkers hold worker processes
            if hasattr(judge, "close"):
                judge.close()


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


def make_policy_work(plan: RunPlan, ready: Prepared):
    """The loop's work function of a policy table: one (policy spec, benchmark, item, repeat) -> the policy's
    answer, judged (`judges.policy`), as one `EvalRecord` of kind `policy`."""
    from judges.policy import failure_entries, item_fields, read_judgment, strip_thinking

    from harness.registry import lookup

    judge_model = plan.judge.model  # type: ignore[union-attr]
    identity = ready.judge_backend.identity() if ready.judge_backend is not None else {}
    # A benchmark may add stop strings of its own (MMLU-Pro's `Question:`) to the table's.
    stops = {b: tuple(dict.fromkeys((*plan.generation.stop, *getattr(lookup("benchmark", b), "stop", ()))))
             for b in ready.items}

    async def work(unit: tuple[str, str, Any, int]) -> list[EvalRecord]:
        spec, bench, item, repeat = unit
        seed = derive_seed(plan.seed, bench, item.id, repeat)
        judge = ready.judges[bench]
        judge_info = {"model": judge_model, "identity": identity, "settings": dict(judge.settings)}
        params = dataclasses.replace(plan.generation.params(seed), stop=stops[bench])
        [completion] = await ready.policies[spec].generate([GenerateRequest(item.messages, params)])

        def record(scores: tuple, meta: dict, trace: dict) -> list[EvalRecord]:
            return [EvalRecord(evaluator=spec, benchmark=bench, item=item.id, repeat=repeat, seed=seed, kind="policy",
                               scores=scores, meta=meta, trace=trace)]

        if not completion.ok:
            meta, fields = item_fields(bench, item)
            failures = failure_entries([("generate", completion.error)])
            return record((), meta, {"answer": None, "judge": judge_info, **fields, "failures": failures})
        raw = completion.texts[0]
        text = strip_thinking(raw) if plan.generation.strip_thinking else raw
        [judgment] = await judge.judge_all([(item, text)], seed=seed)
        judged = read_judgment(bench, judge, item, text, judgment)
        answer = {"raw": raw, "cached": completion.cached}
        if text != raw:
            answer["judged"] = text
        trace = {"answer": answer, "judge": judge_info, **judged.trace, "failures": failure_entries(judged.failures)}
        return record(judged.scores, judged.meta, trace)

    return work
