"""The evaluator protocol, its result records, and evaluator spec strings.

Every evaluator scores a *set* of responses to one prompt: `score_set(prompt, responses, *, seed) -> SetScores`.
Pairwise benchmarks call it with K=2, listwise with K=7, policy training with K=group size. A response that could not
be scored gets `None`, never a made-up number, and the failure is in `trace.failures` with its category and stage.

Evaluator specs name an evaluator kind and its settings: `KIND[:key=value,key=value,...]`, e.g.
`dynamic-rubric:generator=openai:gpt-4.1,verifier=smollm2-135m,mode=batched`. A value runs to the next comma, so
model specs (which may contain `:` and `/`) need no quoting. Unknown kinds and unknown keys are errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from harness.errors import ConfigError, Failure


@dataclass(frozen=True, slots=True)
class StageFailure:
    """A failure inside an evaluator, with the stage it happened in."""

    stage: str
    """Where: `generate_rubric`, `verify`, `score`, `judge`, ..."""
    failure: Failure
    """The categorised failure (category, message, attempts)."""
    response: int | None = None
    """Index of the response concerned, if one."""
    item: int | None = None
    """Index of the rubric item concerned, if one."""

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "response": self.response, "item": self.item, **self.failure.to_json()}


@dataclass(frozen=True, slots=True)
class Trace:
    """Everything needed to audit one `score_set` call; JSON-serialisable via `to_json`."""

    failures: tuple[StageFailure, ...] = ()
    """Every failure, categorised; the evaluator never scores one silently."""
    rubric: list[dict[str, Any]] | None = None
    """Rubric items `[{criterion, weight}]` (rubric evaluators)."""
    verdicts: list[list[float | None]] | None = None
    """Items x responses, 0/1 or P(yes); None where verification failed."""
    pass_rates: list[float | None] | None = None
    """Per item: mean verdict over the responses that were scored."""
    discriminability: list[float | None] | None = None
    """Per item: p (1 - p), the item's Bernoulli variance over the set."""
    saturated_share: float | None = None
    """Share of items every response passes or every response fails."""
    order: list[int] | None = None
    """The order in which the responses were shown (indices into the input)."""
    raw: dict[str, Any] = field(default_factory=dict)
    """Raw model outputs worth keeping (the generator's text, judge verdict strings, ...)."""
    calls: int = 0
    """Backend requests this call sent (cache misses)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "failures": [f.to_json() for f in self.failures],
            "rubric": self.rubric,
            "verdicts": self.verdicts,
            "pass_rates": self.pass_rates,
            "discriminability": self.discriminability,
            "saturated_share": self.saturated_share,
            "order": self.order,
            "raw": self.raw,
            "calls": self.calls,
        }


@dataclass(frozen=True, slots=True)
class SetScores:
    """Scores of the responses of one set, aligned with the input order."""

    scores: tuple[float | None, ...]
    """One score per response; None when it could not be scored."""
    trace: Trace = field(default_factory=Trace)
    """How the scores came about, and what failed."""

    @property
    def n_unscored(self) -> int:
        """How many responses could not be scored."""
        return sum(s is None for s in self.scores)

    def to_json(self) -> dict[str, Any]:
        return {"scores": list(self.scores), "n_unscored": self.n_unscored, "trace": self.trace.to_json()}


@runtime_checkable
class Evaluator(Protocol):
    """What every evaluator implements. Call sites use exactly `spec`, `settings` and `score_set(...)`."""

    spec: str
    """The canonical spec string that rebuilds this evaluator (used as its name in runs and tables)."""
    settings: dict[str, Any]
    """Every setting, defaults included (`structured=True` too, which the canonical spec leaves out): the run's
    manifest records them."""

    async def score_set(self, prompt: str, responses: Sequence[str], *, seed: int,
                        reference: str | None = None) -> SetScores:
        """Score every response of the set; `seed` drives shuffles and sampling (derived by the caller).
        `reference` is a known correct answer, passed only for sets that carry one (`harness score`'s
        `reference` field); an evaluator that needs none ignores it."""
        ...

    async def close(self) -> None:
        """Release the backends."""
        ...


def parse_evaluator_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split `KIND[:key=value,...]` into (kind, settings).

    Raises:
        ConfigError: for an empty kind, a setting without `=`, or a key given twice.
    """
    kind, _, rest = spec.strip().partition(":")
    if not kind:
        raise ConfigError(f"evaluator spec {spec!r} has no kind; expected KIND[:key=value,...]")
    settings: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ConfigError(f"evaluator spec {spec!r}: setting {part!r} is not key=value")
        key = key.strip()
        if key in settings:
            raise ConfigError(f"evaluator spec {spec!r}: {key!r} given twice")
        settings[key] = value.strip()
    return kind, settings


def format_evaluator_spec(
    kind: str,
    settings: dict[str, Any],
    *,
    defaults: dict[str, Any] | None = None,
    runtime: Sequence[str] = (),
) -> str:
    """The canonical spec: settings sorted by key, booleans lower-case.

    Left out: None values, values equal to their default in `defaults`, and `runtime` keys (batch size, device:
    settings that do not change scores, so changing them must not rename the evaluator or orphan its records).
    """
    defaults = defaults or {}
    parts = []
    for key, value in sorted(settings.items()):
        if value is None or key in runtime or (key in defaults and defaults[key] == value):
            continue
        parts.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return kind + (":" + ",".join(parts) if parts else "")


def resolve_settings(
    kind: str, settings: dict[str, str], defaults: dict[str, Any], *, required: Sequence[str] = ()
) -> dict[str, Any]:
    """Typed settings of an evaluator: `defaults` gives the valid keys and their types (a None default means str).

    Raises:
        ConfigError: for an unknown key (listing the valid ones), a missing required key or a value of the wrong
            type.
    """
    valid = set(defaults) | set(required)
    unknown = sorted(set(settings) - valid)
    if unknown:
        raise ConfigError(f"evaluator {kind!r}: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
    missing = [k for k in required if k not in settings]
    if missing:
        raise ConfigError(f"evaluator {kind!r}: missing required setting(s) {', '.join(missing)}")
    out: dict[str, Any] = dict(defaults)
    for key, raw in settings.items():
        default = defaults.get(key)
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1", "yes")
            elif isinstance(default, int):
                out[key] = int(raw)
            elif isinstance(default, float):
                out[key] = float(raw)
            else:
                out[key] = raw
        except ValueError:
            raise ConfigError(
                f"evaluator {kind!r}: setting {key}={raw!r} is not a valid {type(default).__name__}"
            ) from None
    return out
