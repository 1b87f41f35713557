"""`rule`: a deterministic evaluator, no model call. Format and verifiable rewards, and the learning loop's
positive control.

A spec names one or more checks, each a yes/no verdict on a response; a response's score is the share of checks
it passes (a rubric of weight-1 items whose verifier is the rule itself, so the trace has the same verdict matrix,
pass rates and saturated share as a rubric's):

    rule:starts_with=Sure                      the response, leading whitespace dropped, starts with "Sure"
    rule:regex=^(Yes|No)\\b,max_words=20        both checks; score 0, 0.5 or 1
    rule:math=true                             math-verify: the set's reference answer matches the response's

Checks: `starts_with`, `ends_with` (trailing whitespace dropped), `contains` (text); `regex` (Python's `re.search`;
compiled when the evaluator is built, so a bad pattern fails before any work); `max_words`, `min_words` (words
split on whitespace); `math` (`judges.math_check`'s math-verify in a bounded worker, gold first; the reference
comes with the set: `harness score`'s `reference` field; a set without one is unscored, recorded). Text values are
percent-decoded, since a spec's value runs to the next comma: `%2C` is a comma, `%25` a percent sign.
`ignore_case=true` compares text and regex checks case-insensitively (default false: literal).

Nothing is sampled: the seed is not read, and a score never changes between calls.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from harness.errors import ConfigError, Failure, FailureCategory
from judges.base import SetScores, StageFailure, Trace, format_evaluator_spec, resolve_settings
from judges.rubric import Rubric, RubricItem

if TYPE_CHECKING:
    from harness.pool import BackendPool

KIND = "rule"
TEXT_CHECKS = ("starts_with", "ends_with", "contains", "regex")
COUNT_CHECKS = ("max_words", "min_words")
CHECKS = (*TEXT_CHECKS, *COUNT_CHECKS, "math")
DEFAULTS: dict[str, Any] = {**{name: None for name in CHECKS}, "ignore_case": False}


@dataclass(frozen=True, slots=True)
class Check:
    """One yes/no check: its name (as the trace's criterion) and its test of a response."""

    name: str
    """In words, e.g. `starts with 'Sure'`."""
    test: Callable[[str], bool] | None
    """The test; None for `math`, which needs the set's reference and runs in a worker."""


def _text(key: str, raw: str, ignore_case: bool) -> Check:
    value = unquote(raw)
    if key == "regex":
        try:
            pattern = re.compile(value, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ConfigError(f"evaluator {KIND!r}: regex={raw!r} is not a valid pattern ({exc})") from None
        return Check(f"matches /{value}/", lambda r: pattern.search(r) is not None)
    fold = (lambda s: s.casefold()) if ignore_case else (lambda s: s)
    wanted = fold(value)
    tests = {"starts_with": lambda r: fold(r.lstrip()).startswith(wanted),
             "ends_with": lambda r: fold(r.rstrip()).endswith(wanted),
             "contains": lambda r: wanted in fold(r)}
    return Check(f"{key.replace('_', ' ')} {value!r}", tests[key])


def _count(key: str, raw: str) -> Check:
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(f"evaluator {KIND!r}: {key}={raw!r} is not an integer") from None
    if n < 0:
        raise ConfigError(f"evaluator {KIND!r}: {key} must be >= 0, got {n}")
    if key == "max_words":
        return Check(f"at most {n} words", lambda r: len(r.split()) <= n)
    return Check(f"at least {n} words", lambda r: len(r.split()) >= n)


class RuleEvaluator:
    """Scores each response by the share of the spec's checks it passes; see the module docstring."""

    def __init__(self, spec: str, checks: Sequence[Check], *, settings: dict[str, Any]) -> None:
        self.spec = spec
        self.settings = dict(settings)
        self.checks = tuple(checks)
        self.rubric = Rubric(tuple(RubricItem(c.name, 1) for c in self.checks))
        """The checks as a rubric of weight-1 items (the trace's `rubric`)."""
        self._math: Any = None

    def _checker(self) -> Any:
        if self._math is None:
            from judges.math_check import MathChecker

            self._math = MathChecker()
        return self._math

    async def score_set(self, prompt: str, responses: Sequence[str], *, seed: int,
                        reference: str | None = None) -> SetScores:
        """Every response's share of checks passed (None where a `math` check could not run).

        Raises:
            ValueError: when `responses` is empty.
        """
        from judges.dynamic import summarise_verdicts

        del prompt, seed  # a rule reads the response (and the reference) only
        responses = list(responses)
        if not responses:
            raise ValueError("score_set needs at least one response")
        failures: list[StageFailure] = []
        verdicts: list[list[float | None]] = []
        for m, check in enumerate(self.checks):
            if check.test is not None:
                verdicts.append([float(check.test(r)) for r in responses])
                continue
            if reference is None:
                failures.append(StageFailure("check", Failure(
                    FailureCategory.BAD_REQUEST, "rule math: the set has no reference answer to check against"),
                    item=m))
                verdicts.append([None] * len(responses))
                continue
            found = await asyncio.gather(*(asyncio.to_thread(self._checker().check, reference, r) for r in responses))
            row: list[float | None] = []
            for j, (ok, _, _, failure) in enumerate(found):
                row.append(None if ok is None else float(ok))
                if failure is not None:
                    failures.append(StageFailure("check", failure, response=j, item=m))
            verdicts.append(row)
        scores, pass_rates, disc, saturated = summarise_verdicts(self.rubric, verdicts)
        trace = Trace(failures=tuple(failures), rubric=[{"criterion": c.name, "weight": 1} for c in self.checks],
                      verdicts=verdicts, pass_rates=pass_rates, discriminability=disc, saturated_share=saturated)
        return SetScores(tuple(scores), trace)

    async def close(self) -> None:
        """Stop the math-verify workers, if any started."""
        if self._math is not None:
            self._math.close()


def build(settings: dict[str, str], pool: BackendPool) -> RuleEvaluator:
    """`rule:starts_with=TEXT|ends_with=|contains=|regex=|max_words=N|min_words=N|math=true[,...]`: checks, no model.

    Raises:
        ConfigError: for no check, an unknown setting, a bad pattern or number, or `math` without math-verify.
    """
    del pool  # no model: nothing is asked of the pool, so no backend is built
    resolved = resolve_settings(KIND, settings, DEFAULTS)
    named = [key for key in CHECKS if resolved[key] is not None]
    if not named:
        raise ConfigError(f"evaluator {KIND!r}: name at least one check ({', '.join(CHECKS)}), e.g. "
                          "rule:starts_with=Sure")
    checks = []
    for key in named:
        raw = resolved[key]
        if key in TEXT_CHECKS:
            checks.append(_text(key, raw, resolved["ignore_case"]))
        elif key in COUNT_CHECKS:
            checks.append(_count(key, raw))
        else:
            if raw.lower() not in ("true", "1", "yes"):
                raise ConfigError(f"evaluator {KIND!r}: math={raw!r}; write math=true (or leave it out)")
            try:
                import math_verify  # noqa: F401  (found now, not at the first set)
            except ImportError:
                raise ConfigError('evaluator rule: math needs math-verify: pip install -e ".[verifiable]"') from None
            checks.append(Check("the reference answer, by math-verify", None))
    return RuleEvaluator(format_evaluator_spec(KIND, resolved, defaults=DEFAULTS), checks, settings=resolved)
