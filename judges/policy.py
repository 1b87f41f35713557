"""Policy judging: one policy answer to one benchmark item -> the judge's judgment -> one policy record.

(A verifiable benchmark's "judge" is a deterministic checker: it asks no model, and a table of such benchmarks
has no judge model at all.)

Each policy benchmark's judge is catalogued under the registry kind "judge" by the benchmark's name
(`harness.catalog`); the judge reads its own judgments into record parts (`read`), and the benchmark says what
every record of an item carries (`record_fields`): the item's facts come from the benchmark, the judgment's from
the judge, and the metrics (in `benchmarks/`) read both.

A policy table's cell is (policy row, benchmark). For every item and repeat the policy answers the item's
`messages` (a seed derived from the run seed, the benchmark, the item and the repeat), the reasoning is taken
out of the text the judge sees (`strip_thinking`; the raw answer stays in the record), and the benchmark's
judging protocol judges it with the table's judge model. The record (`harness.records.EvalRecord`, kind
`policy`) holds what the benchmark's metrics read:

    benchmark      judge                                    scores (one per judgment; None where it failed)
    alpaca_eval2   `judges.alpaca.AlpacaJudge`              (preference in [1, 2],)
    arena_hard_v2  `judges.arena_hard.ArenaHardJudge`       (the policy's points in game 1, in game 2)
    wildbench      `judges.wildbench.WildBenchJudge`        (the 1-10 score,)
    writingbench   `judges.writingbench.WritingBenchJudge`  (one 1-10 score per criterion, in criteria order)
    math500        `judges.math_check.MathChecker`          (1.0 verified, 0.0 not, None: the check timed out)
    mmlu_pro       `judges.mmlu_pro.MMLUProChecker`         (1.0 the extracted letter is the gold one, else 0.0)
    codescope      `judges.codescope.CodeScopeChecker`      (1.0 the extracted label is the gold one, else 0.0)

and, in `trace`: `answer` (`raw`, and `judged` where the judged text differs), `judge` (the judge's model
spec, identity and settings), `judgment` (the judge's own record: raw answers, re-asks, verdict labels),
`failures` (stage `generate` for the policy's, `judge` for the judge's) and what a metric needs beyond the
scores (Arena-Hard's verdict labels, WildBench's tags, AlpacaEval's texts for the length-controlled GLM).
A policy answer that failed (the backend's error) has no scores; a rerun retries it. A judgment the judge
could not give after its re-ask is a final PARSE failure: counted, never dropped or defaulted.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.base import PolicyItem
from harness.backends.base import BaseBackend
from harness.errors import ConfigError, Failure
from judges.thinking import strip_thinking as strip_thinking  # the one stripping rule, shared with training


@dataclass(frozen=True, slots=True)
class Judged:
    """What one judgment puts into its record."""

    scores: tuple[float | None, ...]
    meta: dict[str, str]
    """Small facts of the item the metrics group by (category, tags, domain)."""
    trace: dict[str, Any]
    """`judgment` and what the metrics read besides the scores."""
    failures: tuple[tuple[str, Failure], ...] = ()
    """(where, failure) of every judgment that failed."""


def _judge_class(benchmark: str) -> type:
    from harness.registry import lookup, names

    if benchmark not in names("judge"):
        raise ConfigError(f"benchmark {benchmark!r} has no judging protocol; judged: {', '.join(names('judge'))}")
    return lookup("judge", benchmark)


def judged_benchmarks() -> list[str]:
    """The benchmarks a policy judge is catalogued for (nothing is imported)."""
    from harness.registry import names

    return names("judge")


def judge_needs_model(benchmark: str) -> bool:
    """Whether the benchmark's judge asks a model: False for a checker (its class sets `needs_model = False`)."""
    return bool(getattr(_judge_class(benchmark), "needs_model", True))


def judge_options(benchmark: str) -> list[str]:
    """The settings the benchmark's judge takes (its constructor's keywords, the backend aside)."""
    params = inspect.signature(_judge_class(benchmark).__init__).parameters
    return [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def build_judge(benchmark: str, backend: BaseBackend, settings: Mapping[str, Any] | None = None) -> Any:
    """The benchmark's judge on `backend` with `settings` (the table's, then the config's `judge_settings`).

    Raises:
        ConfigError: for a benchmark without a protocol, a setting its judge does not take (listing those it
            takes), or a value the judge refuses.
    """
    settings = dict(settings or {})
    valid = judge_options(benchmark)
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        raise ConfigError(f"judge_settings.{benchmark}: unknown setting(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(valid)}")
    return _judge_class(benchmark)(backend, **settings)


def item_fields(benchmark: str, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    """What every record of `item` carries, judged or not: the benchmark's `record_fields` (the `meta` its
    metrics group by and the `trace` fields they read). A record whose answer failed at the backend carries them
    too, so a metric can count it in `n_failed` instead of losing it."""
    from harness.registry import lookup

    return lookup("benchmark", benchmark).record_fields(item)


def read_judgment(benchmark: str, judge: Any, item: PolicyItem, judged_text: str, judgment: Any) -> Judged:
    """The record's part of one judgment: the judge's `read` (scores, judgment trace, failures) with the item's
    own fields (`item_fields`)."""
    meta, trace = item_fields(benchmark, item)
    scores, judged_trace, failures = judge.read(item, judged_text, judgment)
    return Judged(scores, meta, {**trace, **judged_trace}, failures)


def failure_entries(stage_failures: Sequence[tuple[str, Failure]]) -> list[dict[str, Any]]:
    """Trace `failures` entries (`harness.records.trace_failures` reads them) from (where, failure) pairs."""
    return [{"stage": where, "response": None, "item": None, **f.to_json()} for where, f in stage_failures]
