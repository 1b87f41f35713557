"""Output records: one frozen dataclass per kind of output line, shared by the loop, the reports and the tests.

Every line an output holds is one record (`to_json`), and every line names its schema (`"schema": "eval/1"`):

    generation/1   `harness generate`: one sampled answer per (prompt id, sample index)
    score/1        `harness score`: the scores of one {id, prompt, responses} set
    eval/1         `harness run` / `harness eval`: one evaluator x benchmark x item x repeat, or (kind `policy`)
                   one policy x benchmark x item x repeat: its answer and the judge's judgments

A reader refuses a line of another schema (an output written by another version of the harness) with a message
that names it, rather than guessing at its fields. A record's `key` is what it is stored under (a later line with
the same key supersedes an earlier one), and `failures` is what could not be evaluated in it; the resume rule of
`harness.loop` reads nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from harness.errors import Failure, FailureCategory

SCHEMA_FIELD = "schema"

R = TypeVar("R", bound="Record")
_JSON_NAMES = {str: "string", int: "integer", list: "list", dict: "object"}


class Record(Protocol):
    """What every output record implements."""

    SCHEMA: ClassVar[str]
    """`kind/version`, written into every line."""

    @property
    def key(self) -> tuple:
        """What the record is stored under: unique within its output."""
        ...

    @property
    def failures(self) -> tuple[Failure, ...]:
        """What could not be evaluated in this record (empty: the record is complete)."""
        ...

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R: ...


def _need(data: Mapping[str, Any], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {name!r} is missing or not a JSON {_JSON_NAMES.get(kind, kind.__name__)}")
    return value


def _check_schema(cls: type, data: Mapping[str, Any]) -> None:
    found = data.get(SCHEMA_FIELD)
    if found != cls.SCHEMA:
        what = f"schema {found!r}" if found is not None else "no schema field"
        raise ValueError(f"the line has {what}; this version of the harness reads {cls.SCHEMA!r}")


def _scores(data: Mapping[str, Any]) -> tuple[float | None, ...]:
    scores = _need(data, "scores", list)
    if not all(s is None or (isinstance(s, (int, float)) and not isinstance(s, bool)) for s in scores):
        raise ValueError("field 'scores' must be a list of numbers or nulls")
    return tuple(None if s is None else float(s) for s in scores)


_CATEGORIES = tuple(c.value for c in FailureCategory)


def trace_failures(trace: Mapping[str, Any]) -> tuple[Failure, ...]:
    """The failures an evaluator's trace lists (`judges.base.Trace.to_json`), each message led by its stage.

    Raises:
        ValueError: for an entry that is not an object with a message and one of `FailureCategory`'s values.
    """
    found = []
    for n, f in enumerate(trace.get("failures") or (), start=1):
        if not isinstance(f, Mapping) or not isinstance(f.get("message"), str):
            raise ValueError(f"trace failure {n} is not an object with a message")
        if f.get("category") not in _CATEGORIES:
            raise ValueError(f"trace failure {n}: unknown category {f.get('category')!r}; "
                             f"known: {', '.join(_CATEGORIES)}")
        where = f.get("stage") or "?"
        if f.get("response") is not None:
            where += f" response {f['response']}"
        if f.get("item") is not None:
            where += f" item {f['item']}"
        found.append(Failure(FailureCategory(f["category"]), f"{where}: {f['message']}", int(f.get("attempts", 1))))
    return tuple(found)


def _trace(data: Mapping[str, Any]) -> dict[str, Any]:
    """A record's trace, its failures checked: a failure this harness cannot name makes the line malformed."""
    trace = _need(data, "trace", dict)
    trace_failures(trace)
    return trace


@dataclass(frozen=True, slots=True)
class LMEvalSampleRecord:
    """One document of an lm-evaluation-harness task, as `harness lm-eval` logs it (`harness.lmeval`)."""

    SCHEMA: ClassVar[str] = "lm-eval-sample/1"

    task: str
    doc_id: int
    sample: dict[str, Any]
    """lm-eval's logged sample: the document, the requests' arguments, the responses (raw and filtered), the
    target and the per-document metrics, made JSON-safe."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.doc_id)

    @property
    def failures(self) -> tuple[Failure, ...]:
        return ()

    def to_json(self) -> dict[str, Any]:
        return {SCHEMA_FIELD: self.SCHEMA, "task": self.task, "doc_id": self.doc_id, "sample": self.sample}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LMEvalSampleRecord:
        _check_schema(cls, data)
        return cls(_need(data, "task", str), _need(data, "doc_id", int), _need(data, "sample", dict))


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """One sampled answer of `harness generate`."""

    SCHEMA: ClassVar[str] = "generation/1"

    id: str
    """The prompt's id."""
    sample: int
    """Sample index within the prompt (0..n-1)."""
    model: str
    """The model spec as given."""
    text: str | None
    """The answer; None when the request failed."""
    error: Failure | None = None
    """Why there is no answer."""
    cached: bool = False
    """Served from the call cache."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.sample)

    @property
    def failures(self) -> tuple[Failure, ...]:
        return (self.error,) if self.error is not None else ()

    def to_json(self) -> dict[str, Any]:
        return {
            SCHEMA_FIELD: self.SCHEMA,
            "id": self.id,
            "sample": self.sample,
            "model": self.model,
            "text": self.text,
            "error": self.error.to_json() if self.error else None,
            "cached": self.cached,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerationRecord:
        _check_schema(cls, data)
        error = data.get("error")
        text = data.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError("field 'text' must be a string or null")
        return cls(
            id=_need(data, "id", str),
            sample=_need(data, "sample", int),
            model=_need(data, "model", str),
            text=text,
            error=Failure.from_json(error) if error else None,
            cached=bool(data.get("cached", False)),
        )


@dataclass(frozen=True, slots=True)
class ScoreRecord:
    """The scores of one set scored by `harness score`."""

    SCHEMA: ClassVar[str] = "score/1"

    id: str
    """The set's id."""
    evaluator: str
    """The evaluator's canonical spec."""
    seed: int
    """The set's derived seed."""
    scores: tuple[float | None, ...]
    """One score per response, in input order; None where it could not be scored."""
    trace: Mapping[str, Any] = field(default_factory=dict)
    """The evaluator's trace (`judges.base.Trace.to_json`): rubric, verdicts, raw outputs, failures."""

    @property
    def key(self) -> tuple[str]:
        return (self.id,)

    @property
    def n_unscored(self) -> int:
        return sum(s is None for s in self.scores)

    @property
    def failures(self) -> tuple[Failure, ...]:
        return trace_failures(self.trace)

    def to_json(self) -> dict[str, Any]:
        return {
            SCHEMA_FIELD: self.SCHEMA,
            "id": self.id,
            "evaluator": self.evaluator,
            "seed": self.seed,
            "scores": list(self.scores),
            "n_unscored": self.n_unscored,
            "trace": dict(self.trace),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScoreRecord:
        _check_schema(cls, data)
        return cls(
            id=_need(data, "id", str),
            evaluator=_need(data, "evaluator", str),
            seed=_need(data, "seed", int),
            scores=_scores(data),
            trace=_trace(data),
        )


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """One evaluator x benchmark x item x repeat of `harness run` / `harness eval`, or one policy x benchmark x
    item x repeat of a policy table (kind `policy`: `evaluator` is the policy's model spec, `scores` the judge's
    numbers as the benchmark's metrics read them (`judges.policy`), `trace` the answer, its judged text, the
    judgments and the judge's identity)."""

    SCHEMA: ClassVar[str] = "eval/1"

    evaluator: str
    """The evaluator's canonical spec (rows with the same spec share records)."""
    benchmark: str
    """Registry name of the benchmark."""
    item: str
    """The item's id within the benchmark."""
    repeat: int
    """AVG@k repeat index."""
    seed: int
    """The seed `score_set` got: derived from (run seed, benchmark, item, repeat)."""
    kind: Literal["pairwise", "listwise", "policy"]
    """Which metrics apply."""
    scores: tuple[float | None, ...]
    """One score per response, in the item's order; None where it could not be scored."""
    meta: Mapping[str, str] = field(default_factory=dict)
    """The item's upstream facts (subset, domain, styles, ...)."""
    preferred: int | None = None
    """Pairwise: index of the preferred response."""
    gold_ranks: tuple[int, ...] | None = None
    """Listwise: gold rank of each response (1 = best)."""
    trace: Mapping[str, Any] = field(default_factory=dict)
    """The evaluator's trace (`judges.base.Trace.to_json`)."""

    def __post_init__(self) -> None:
        if self.kind == "policy":
            if self.preferred is not None or self.gold_ranks is not None:
                raise ValueError("a policy record has neither `preferred` nor `gold_ranks`")
            return
        pairwise = self.kind == "pairwise"
        if pairwise != (self.preferred is not None) or pairwise == (self.gold_ranks is not None):
            raise ValueError("a pairwise record has `preferred` and no `gold_ranks`; a listwise one the reverse")

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.evaluator, self.benchmark, self.item, self.repeat)

    @property
    def n_unscored(self) -> int:
        return sum(s is None for s in self.scores)

    @property
    def failures(self) -> tuple[Failure, ...]:
        return trace_failures(self.trace)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            SCHEMA_FIELD: self.SCHEMA,
            "evaluator": self.evaluator,
            "benchmark": self.benchmark,
            "item": self.item,
            "repeat": self.repeat,
            "seed": self.seed,
            "kind": self.kind,
            "meta": dict(self.meta),
        }
        if self.kind == "pairwise":
            out["preferred"] = self.preferred
        elif self.kind == "listwise":
            out["gold_ranks"] = list(self.gold_ranks or ())
        out.update({"scores": list(self.scores), "n_unscored": self.n_unscored, "trace": dict(self.trace)})
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EvalRecord:
        _check_schema(cls, data)
        kind = data.get("kind")
        if kind not in ("pairwise", "listwise", "policy"):
            raise ValueError(f"field 'kind' must be 'pairwise', 'listwise' or 'policy', got {kind!r}")
        gold = _need(data, "gold_ranks", list) if kind == "listwise" else None
        return cls(
            evaluator=_need(data, "evaluator", str),
            benchmark=_need(data, "benchmark", str),
            item=_need(data, "item", str),
            repeat=_need(data, "repeat", int),
            seed=_need(data, "seed", int),
            kind=kind,
            scores=_scores(data),
            meta={str(k): str(v) for k, v in _need(data, "meta", dict).items()},
            preferred=_need(data, "preferred", int) if kind == "pairwise" else None,
            gold_ranks=tuple(int(r) for r in gold) if gold is not None else None,
            trace=_trace(data),
        )
