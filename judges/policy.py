"""Policy judging: one policy answer to one benchmark item -> the judge's judgment -> one policy record.

(A verifiable benchmark's "judge" is a deterministic checker: it asks no model, and a table of such benchmarks
has no judge model at all.)

A policy table's cell is (policy row, benchmark). For every item and repeat the policy answers the item's
`messages` (a seed derived from the run seed, the benchmark, the item and the repeat), the reasoning is taken
out of the text the judge sees (`strip_thinking`; the raw answer stays in the record), and the benchmark's
judging protocol judges it with the table's judge model. The record (`harness.records.EvalRecord`, kind
`policy`) holds what the benchmark's metrics read:

    benchmark      judge                                    scores (one per judgment; None where it failed)
    alpaca_eval2   `judges.alpaca.AlpacaJudge`              (preference in [1, 2],)
    arena_hard_v2  `judges.arena_hard_judge.ArenaHardJudge` (the policy's points in game 1, in game 2)
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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.base import PolicyItem
from harness.backends.base import Backend
from harness.errors import ConfigError, Failure

JUDGED_BENCHMARKS = ("alpaca_eval2", "arena_hard_v2", "wildbench", "writingbench", "math500", "mmlu_pro",
                     "codescope")
_OPEN, _CLOSE = "<think>", "</think>"
_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_thinking(text: str) -> str:
    """The answer a judge sees: `text` without its reasoning.

    Every `<think>...</think>` block goes; text before a `</think>` without an opening tag goes too (chat
    templates that open the block in the prompt, as Qwen3's); an opening tag never closed (the budget ran out
    while reasoning) cuts the rest, so the judge sees whatever came before it, usually nothing. Surrounding
    whitespace is stripped.
    """
    text = _BLOCK.sub("", text)
    if _CLOSE in text:
        text = text[text.rfind(_CLOSE) + len(_CLOSE):]
    if _OPEN in text:
        text = text[: text.find(_OPEN)]
    return text.strip()


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
    if benchmark == "alpaca_eval2":
        from judges.alpaca import AlpacaJudge

        return AlpacaJudge
    if benchmark == "arena_hard_v2":
        from judges.arena_hard_judge import ArenaHardJudge

        return ArenaHardJudge
    if benchmark == "wildbench":
        from judges.wildbench import WildBenchJudge

        return WildBenchJudge
    if benchmark == "writingbench":
        from judges.writingbench import WritingBenchJudge

        return WritingBenchJudge
    if benchmark == "math500":
        from judges.math_check import MathChecker

        return MathChecker
    if benchmark == "mmlu_pro":
        from judges.mmlu_pro import MMLUProChecker

        return MMLUProChecker
    if benchmark == "codescope":
        from judges.codescope import CodeScopeChecker

        return CodeScopeChecker
    raise ConfigError(f"benchmark {benchmark!r} has no judging protocol; judged: {', '.join(JUDGED_BENCHMARKS)}")


def judge_options(benchmark: str) -> list[str]:
    """The settings the benchmark's judge takes (its constructor's keywords, the backend aside)."""
    params = inspect.signature(_judge_class(benchmark).__init__).parameters
    return [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def build_judge(benchmark: str, backend: Backend, settings: Mapping[str, Any] | None = None) -> Any:
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
    """What every record of `item` carries, judged or not: the `meta` its metrics group by (category, domain,
    position) and the `trace` fields they read beside the scores (WildBench's tags). A record whose answer
    failed at the backend carries them too, so a metric can count it in `n_failed` instead of losing it."""
    return _ITEM_FIELDS[benchmark](item)


def read_judgment(benchmark: str, item: PolicyItem, judged_text: str, judgment: Any) -> Judged:
    """The record's part of one judgment (see the module docstring for each benchmark's scores), with the
    item's own fields (`item_fields`)."""
    meta, trace = item_fields(benchmark, item)
    scores, judged_trace, failures = _READERS[benchmark](item, judged_text, judgment)
    return Judged(scores, meta, {**trace, **judged_trace}, failures)


_Read = tuple[tuple[float | None, ...], dict[str, Any], tuple[tuple[str, Failure], ...]]


def _alpaca_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    return {"index": str(item.meta["index"]), "dataset": str(item.meta.get("dataset", ""))}, {}


def _alpaca(item: PolicyItem, text: str, j: Any) -> _Read:
    trace = {
        "judgment": {"preference": j.preference, "policy_first": j.policy_first, "mode": j.mode, "raw": j.raw},
        # What alpaca_eval's length-controlled GLM reads (`judges.alpaca.length_controlled`).
        "annotation": {"instruction": item.meta["instruction"], "output_1": item.meta["reference"],
                       "generator_1": item.meta.get("reference_generator", "reference"), "output_2": text},
    }
    failures = (("judge", j.failure),) if j.failure is not None else ()
    return (j.preference,), trace, failures


def _arena_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    return {"uid": str(item.meta["uid"]), "category": str(item.meta["category"])}, {}


def _arena(item: PolicyItem, text: str, j: Any) -> _Read:
    del item, text
    scores = []
    for game in j.games:
        scores.append(None if game.verdict is None else sum(game.model_outcomes()) / len(game.model_outcomes()))
    failures = tuple((f"judge game {n}", f) for n, f in enumerate(j.failures, start=1) if f is not None)
    return tuple(scores), {"judgment": j.to_json()}, failures


def _wildbench_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    meta = {"session_id": str(item.meta.get("session_id", item.id)), "primary_tag": str(item.meta["primary_tag"])}
    return meta, {"tags": [item.meta["primary_tag"], *item.meta["secondary_tags"]]}


def _wildbench(item: PolicyItem, text: str, j: Any) -> _Read:
    from judges.wildbench import counts_in_groups

    del item
    trace: dict[str, Any] = {
        "judgment": {"score": j.score, "judged": j.judged, "raw": j.raw},
        "in_groups": counts_in_groups(j.shown),
        "shown_chars": len(j.shown.strip()),
    }
    if j.shown != text:
        trace["shown"] = j.shown
    failures = (("judge", j.failure),) if j.failure is not None else ()
    return (j.score,), trace, failures


def _writingbench_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    meta = {"index": str(item.meta.get("index", item.id)), "domain1": str(item.meta.get("domain1", "")),
            "domain2": str(item.meta.get("domain2", ""))}
    return meta, {"criteria": [c["name"] for c in item.meta["criteria"]]}


def _writingbench(item: PolicyItem, text: str, j: Any) -> _Read:
    del text
    names = [c["name"] for c in item.meta["criteria"]]
    scores = tuple(None if j.scores.get(n) is None else float(j.scores[n]) for n in names)
    failures = tuple((f"judge criterion {n!r}", f) for n, f in j.failures.items())
    return scores, {"judgment": j.to_json()}, failures


def _math_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    return {"subject": str(item.meta.get("subject", "")), "level": str(item.meta.get("level", ""))}, {}


def _math(item: PolicyItem, text: str, j: Any) -> _Read:
    del item, text
    score = None if j.verified is None else float(j.verified)
    trace = {"judgment": {"verified": j.verified, "gold_parsed": j.gold_parsed, "answer_parsed": j.answer_parsed}}
    failures = (("check", j.failure),) if j.failure is not None else ()
    return (score,), trace, failures


def _letter_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    return {"category": str(item.meta.get("category", ""))}, {}


def _letter(item: PolicyItem, text: str, j: Any) -> _Read:
    del text
    trace = {"judgment": {"letter": j.letter, "gold": item.meta["answer"], "unextracted": j.letter is None,
                          "guessed": j.guessed}}
    return (float(j.correct),), trace, ()


def _label_fields(item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
    return {"task": str(item.meta["task"]), "lang_cluster": str(item.meta.get("lang_cluster", ""))}, {}


def _label(item: PolicyItem, text: str, j: Any) -> _Read:
    del text
    trace = {"judgment": {"label": j.label, "gold": item.meta["gold"], "unextracted": j.label is None}}
    return (float(j.correct),), trace, ()


_ITEM_FIELDS = {"alpaca_eval2": _alpaca_fields, "arena_hard_v2": _arena_fields, "wildbench": _wildbench_fields,
                "writingbench": _writingbench_fields, "math500": _math_fields, "mmlu_pro": _letter_fields,
                "codescope": _label_fields}
_READERS = {"alpaca_eval2": _alpaca, "arena_hard_v2": _arena, "wildbench": _wildbench,
            "writingbench": _writingbench, "math500": _math, "mmlu_pro": _letter,
            "codescope": _label}


def failure_entries(stage_failures: Sequence[tuple[str, Failure]]) -> list[dict[str, Any]]:
    """Trace `failures` entries (`harness.records.trace_failures` reads them) from (where, failure) pairs."""
    return [{"stage": where, "response": None, "item": None, **f.to_json()} for where, f in stage_failures]
