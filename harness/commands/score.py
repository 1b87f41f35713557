"""`harness score`: score `{id, prompt, responses}` sets with an evaluator, one output line per set.

Each set is one unit of the evaluation loop (`harness.loop`) and one `ScoreRecord`; its seed derives from the run
seed and its id. The output is bound to the evaluator's spec, the identities of its models, the input's
fingerprint and the seed; a rerun with the same settings resumes it under the loop's resume rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.loop import LoopSummary, Unit, write_output
from harness.commands.prompts import iter_jsonl_records
from harness.records import ScoreRecord
from harness.runstore import OutputPaths
from harness.seeds import derive_seed


@dataclass(frozen=True, slots=True)
class ResponseSet:
    """One prompt and the candidate responses to score together."""

    id: str
    prompt: str
    responses: tuple[str, ...]
    reference: str | None = None
    """A known correct answer (`rule:math=true` checks against it); evaluators that need none ignore it."""


def read_sets_file(path: Path) -> list[ResponseSet]:
    """Read `{"id", "prompt", "responses": [str, ...]}` lines, each with an optional `"reference"` answer.

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
        reference = obj.get("reference")
        if reference is not None and not isinstance(reference, str):
            raise ConfigError(f"{where}: 'reference' must be a string when given")
        sets.append(ResponseSet(rid, prompt, tuple(responses), reference))
    return sets


def sets_fingerprint(sets: Sequence[ResponseSet]) -> str:
    """A short hash of every set's id, prompt, responses and reference (where it has one), in order."""
    digest = hashlib.sha256()
    for s in sets:
        fields = [s.id, s.prompt, list(s.responses)] + ([s.reference] if s.reference is not None else [])
        digest.update(json.dumps(fields, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()[:16]


def units(sets: Sequence[ResponseSet]) -> list[Unit[ResponseSet]]:
    """One unit per set, producing the record (id,)."""
    return [Unit(((s.id,),), s) for s in sets]


async def run_score(
    evaluator,
    sets: Sequence[ResponseSet],
    out: Path,
    *,
    seed: int = 0,
    parallel: int = 8,
    pool=None,
    runtime: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    wait: bool = False,
    retry_failed: bool = False,
) -> LoopSummary:
    """Score every set with `evaluator` (a `judges.base.Evaluator`) into the output `out`; see `harness.loop`.

    Args:
        pool: The backend pool the evaluator was built on (its models' identities bind the output; its call and
            hit counts go into the summary).
        runtime: Runtime knobs to record in the manifest.
    """
    models = pool.identities() if pool is not None else {}
    settings = {"evaluator": evaluator.spec, "models": models, "input": sets_fingerprint(sets), "seed": seed}
    return await write_output(
        OutputPaths.file(out),
        ScoreRecord,
        command="score",
        settings=settings,
        config={"evaluator": evaluator.spec, "seed": seed, "parallel": parallel, **(runtime or {})},
        extra={"model_identities": models, "evaluator_settings": dict(evaluator.settings)},
        units=units(sets),
        work=make_work(evaluator, seed=seed),
        parallel=parallel,
        noun="sets",
        counters=pool,
        overwrite=overwrite,
        wait=wait,
        retry_failed=retry_failed,
    )


def make_work(evaluator, *, seed: int):
    """The loop's work function: one set -> its `ScoreRecord` (seed derived from the run seed and the id)."""

    async def work(item: ResponseSet) -> list[ScoreRecord]:
        set_seed = derive_seed(seed, item.id)
        # The reference goes only to sets that carry one: an evaluator written before it existed still scores the rest.
        extra = {"reference": item.reference} if item.reference is not None else {}
        result = await evaluator.score_set(item.prompt, item.responses, seed=set_seed, **extra)
        return [ScoreRecord(item.id, evaluator.spec, set_seed, result.scores, result.trace.to_json())]

    return work


def score_file(evaluator: str, input: Path, out: Path, *, seed: int, parallel: int, backend, outputs) -> LoopSummary:
    """`harness score`: score the sets of `input` with `evaluator` into `out`; the loop's summary.

    Raises:
        ConfigError: for an output that is the input, a malformed input, an evaluator that cannot be built.
    """
    from harness.commands.setup import as_dict, backend_options, drive, same_file
    from harness.pool import BackendPool
    from judges import load_evaluator

    if same_file(input, out):
        raise ConfigError(f"--out {out} is the input file itself; choose another output file")
    sets = read_sets_file(input)
    options = backend_options(backend)
    pool = BackendPool(options=options, cache=outputs.call_cache())
    judge = load_evaluator(evaluator, pool)
    pool.preflight()
    return drive(pool, lambda: run_score(
        judge, sets, out, seed=seed, parallel=parallel, pool=pool,
        runtime={"input": str(input), "backend": as_dict(options), **outputs.recorded()},
        overwrite=outputs.overwrite, wait=outputs.wait, retry_failed=outputs.retry_failed,
    ))
