"""Dynamic rubrics: the record, the parser, and the arithmetic that turns verdicts into scores and rewards.

A rubric generator reads a prompt and a set of K candidate responses and writes M items `(r_m, w_m)`: a yes/no
criterion in plain language and an integer weight in 1..5. A verifier answers every item for every response;
the answers form a verdict matrix `V` of shape (M, K) (items x responses), `V[m, k] = v_m(y_k)` in {0, 1}, or
the probability of "yes" in [0, 1] when verification reads next-token probabilities. From `w` and `V`:

- score of response k (`aggregate`): `E_k = sum_m w_m V[m, k] / sum_m w_m`
- discriminability reward (`disc_reward`): `R_disc = sum_m w_m p_m (1 - p_m) / sum_m w_m`,
  `p_m = mean_k V[m, k]`
- anchor reward (`anchor_reward`): `R_anchor = sum_{i<j} log sigmoid(S_i - S_j) / ((j - i) * 2^(i-1))`

All responses of a set share one rubric, so their scores are comparable. Ties are real outcomes: equal scores
are returned as equal, never broken here; callers count them. Every function validates its input and raises
`ValueError` with the reason instead of returning NaN. This module needs numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from judges.rubric_parser import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    RubricParseError,
    normalise_criterion,
    parse_rubric_items,
)

__all__ = [
    "Rubric",
    "RubricItem",
    "RubricParseError",
    "aggregate",
    "anchor_reward",
    "disc_reward",
    "item_pass_rates",
    "normalise_criterion",
    "parse_rubric",
    "rubric_schema",
    "saturated_share",
]


@dataclass(frozen=True, slots=True)
class RubricItem:
    """One binary criterion and its importance."""

    criterion: str
    """A yes/no statement about a response, in plain language; non-empty."""
    weight: int
    """Importance, an integer in 1..5 (a bool is not accepted)."""

    def __post_init__(self) -> None:
        if not isinstance(self.criterion, str) or not self.criterion.strip():
            raise ValueError(f"criterion must be a non-empty string, got {self.criterion!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, np.integer)):
            raise ValueError(f"weight must be an int in {MIN_WEIGHT}..{MAX_WEIGHT}, got {self.weight!r}")
        if not MIN_WEIGHT <= self.weight <= MAX_WEIGHT:
            raise ValueError(f"weight {self.weight} is outside {MIN_WEIGHT}..{MAX_WEIGHT}")
        object.__setattr__(self, "weight", int(self.weight))


@dataclass(frozen=True, slots=True)
class Rubric:
    """An ordered set of weighted criteria shared by every response of one candidate set."""

    items: tuple[RubricItem, ...]
    """At least one item; no two criteria equal after `normalise_criterion`. A list becomes a tuple."""
    merged: int = 0
    """Repeated criteria the parser merged into their first occurrence (`judges.rubric_parser`)."""

    def __post_init__(self) -> None:
        items = tuple(self.items)
        if not items:
            raise ValueError("a rubric needs at least one item")
        seen: dict[str, int] = {}
        for i, item in enumerate(items, start=1):
            if not isinstance(item, RubricItem):
                raise ValueError(f"item {i}: expected a RubricItem, got {type(item).__name__}")
            key = normalise_criterion(item.criterion)
            if key in seen:
                raise ValueError(f"item {i}: duplicates item {seen[key]} ({item.criterion!r})")
            seen[key] = i
        object.__setattr__(self, "items", items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def weights(self) -> np.ndarray:
        """The weights as an int64 array of shape (M,), in item order."""
        return np.array([item.weight for item in self.items], dtype=np.int64)

    @property
    def criteria(self) -> tuple[str, ...]:
        """The criteria in item order."""
        return tuple(item.criterion for item in self.items)

    def to_json(self) -> str:
        """The rubric in the generator's own format: `[{"criterion": "...", "weight": 3}, ...]`."""
        return json.dumps(
            [{"criterion": i.criterion, "weight": i.weight} for i in self.items], ensure_ascii=False
        )

    @classmethod
    def from_json(cls, text: str) -> Rubric:
        """Read what `to_json` wrote. Strict: exactly the keys `criterion` and `weight`, integer weights.

        Use `parse_rubric` for model output; this reads stored traces and files.

        Raises:
            ValueError: malformed JSON, unexpected keys or types, or an invalid rubric.
        """
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"rubric JSON is invalid: {exc}") from exc
        if not isinstance(data, list):
            raise ValueError(f"rubric JSON must be a list of items, got {type(data).__name__}")
        items = []
        for i, obj in enumerate(data, start=1):
            if not isinstance(obj, dict) or set(obj) != {"criterion", "weight"}:
                raise ValueError(
                    f'item {i}: expected an object with exactly "criterion" and "weight", got {obj!r}'
                )
            items.append(RubricItem(criterion=obj["criterion"], weight=obj["weight"]))
        return cls(items=tuple(items))


def parse_rubric(text: str) -> Rubric:
    """Parse a rubric generator's completion into a `Rubric`.

    Strict JSON (`[{"criterion": "...", "weight": 3}, ...]`) and a documented set of near-misses are accepted;
    see `judges.rubric_parser` for the exact list. Criteria keep their order, with whitespace runs collapsed.

    Raises:
        RubricParseError: no rubric, several, or an invalid one; the message names each problem
            (e.g. "item 3: weight 7 is outside 1..5") and is meant to be shown to the model on a retry.
    """
    items, merged = parse_rubric_items(text)
    return Rubric(items=tuple(RubricItem(criterion=c, weight=w) for c, w in items), merged=merged)


MAX_ITEMS = 20
"""Most items a constrained generator may write (the paper's rubrics have a handful)."""
MAX_CRITERION_CHARS = 400
"""Longest criterion a constrained generator may write."""


def rubric_schema(*, max_items: int = MAX_ITEMS, max_chars: int = MAX_CRITERION_CHARS) -> dict[str, Any]:
    """The JSON schema of a rubric, for structured output: a list of 1..`max_items` `{criterion, weight}`
    objects, the criterion a string of at most `max_chars` characters holding something besides whitespace and
    end punctuation (so it is not empty once normalised), the weight an integer in 1..5.

    Content rules the schema cannot say (duplicates, blank-looking criteria) stay in `parse_rubric`.
    """
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": max_items,
        "items": {
            "type": "object",
            "properties": {
                # At least one character that is not whitespace or end punctuation: never empty once normalised.
                "criterion": {"type": "string", "minLength": 1, "maxLength": max_chars, "pattern": "[^\\s.,;:!?]"},
                "weight": {"type": "integer", "minimum": MIN_WEIGHT, "maximum": MAX_WEIGHT},
            },
            "required": ["criterion", "weight"],
            "additionalProperties": False,
        },
    }


# --- arithmetic ---


def _verdict_matrix(verdicts: Any) -> np.ndarray:
    v = np.asarray(verdicts, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"verdicts must be a 2-D (items x responses) array, got shape {v.shape}")
    if v.shape[0] == 0:
        raise ValueError("verdicts have no items (M == 0)")
    if v.shape[1] == 0:
        raise ValueError("verdicts have no responses (K == 0)")
    if not np.isfinite(v).all():
        raise ValueError("verdicts contain NaN or inf")
    if (v < 0).any() or (v > 1).any():
        raise ValueError(f"verdicts must lie in [0, 1], got values from {v.min()} to {v.max()}")
    return v


def _weights_and_verdicts(weights: Any, verdicts: Any) -> tuple[np.ndarray, np.ndarray]:
    v = _verdict_matrix(verdicts)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"weights must be a 1-D array, got shape {w.shape}")
    if w.shape[0] != v.shape[0]:
        raise ValueError(f"{w.shape[0]} weights but {v.shape[0]} verdict rows; need one weight per item")
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or inf")
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    if w.sum() <= 0:
        raise ValueError("weights sum to 0; at least one item needs a positive weight")
    return w, v


def aggregate(weights: Any, verdicts: Any) -> np.ndarray:
    """Rubric scores of K responses: `E_k = sum_m w_m V[m, k] / sum_m w_m`.

    Args:
        weights: shape (M,), non-negative, finite, positive sum (a rubric's weights are ints in 1..5).
        verdicts: shape (M, K), items x responses, 0/1 verdicts or P(yes) in [0, 1]. K == 1 is allowed.

    Returns:
        float64 array of shape (K,), each score in [0, 1]. Equal scores are ties and stay equal.

    Raises:
        ValueError: shape mismatch, M == 0 or K == 0, NaN/inf, negative or all-zero weights, verdicts
            outside [0, 1].
    """
    w, v = _weights_and_verdicts(weights, verdicts)
    return (w @ v) / w.sum()


def item_pass_rates(verdicts: Any) -> np.ndarray:
    """`p_m`: the mean verdict of each item over the responses (row means), shape (M,).

    Raises:
        ValueError: as for `aggregate`'s `verdicts`.
    """
    return _verdict_matrix(verdicts).mean(axis=1)


def saturated_share(verdicts: Any) -> float:
    """Share of items that do not separate the responses at all: `p_m` exactly 0 (all fail) or 1 (all pass).

    With soft verdicts an item is saturated only if every probability is exactly 0 or every one exactly 1.

    Raises:
        ValueError: as for `aggregate`'s `verdicts`.
    """
    p = item_pass_rates(verdicts)
    return float(np.mean((p == 0.0) | (p == 1.0)))


def disc_reward(weights: Any, verdicts: Any) -> float:
    """Discriminability reward: `R_disc = sum_m w_m p_m (1 - p_m) / sum_m w_m`, `p_m` = `item_pass_rates`.

    Each item contributes the variance of a Bernoulli(p_m): 0 when every response passes or every one fails,
    at most 1/4 when half pass. So `0 <= R_disc <= 0.25`; with one response (K == 1) and 0/1 verdicts it is 0.

    Raises:
        ValueError: as for `aggregate`.
    """
    w, v = _weights_and_verdicts(weights, verdicts)
    p = v.mean(axis=1)
    return float(w @ (p * (1.0 - p)) / w.sum())


def anchor_reward(scores_in_gold_rank_order: Any) -> float:
    """Anchor reward over responses with a gold ranking.

    `R_anchor = sum_{i<j} log sigmoid(S_i - S_j) / ((j - i) * 2^(i-1))` with 1-based ranks i, j: `S_1` is the
    score of the gold-best response (index 0 of the input), `S_n` of the gold-worst. Each pair is a
    Bradley-Terry log-likelihood that the better-ranked response wins, discounted by the rank distance and,
    geometrically, by how far down the ranking the better response sits (pairs among top ranks matter most).

    `log sigmoid(x)` is computed as `-logaddexp(0, -x)`, stable for any finite gap. The reward is always
    `<= 0` (strictly below 0 for finite scores) and approaches its maximum 0 only as every gap `S_i - S_j`
    (better minus worse) grows large: it rewards rubrics that score better-ranked responses higher.
    A tied pair contributes `log(1/2)` divided by its discount; ties are not broken.

    A property of the formula worth knowing: the `2^(i-1)` discount makes pairs low in the ranking nearly
    free, so the reward is not monotone in every score. Raising `S_1` always raises it, and swapping the best
    response with any lower-scored one always lowers it; for n <= 4 the gold order is the best arrangement of
    any given scores. For longer lists a middle score's pull towards the top pairs can dominate: with n = 7
    and scores evenly spaced from 1 to 0, swapping ranks 6 and 7 raises the reward by about 0.0026.

    Args:
        scores_in_gold_rank_order: shape (n,), n >= 2, finite; element 0 belongs to gold rank 1 (best).

    Returns:
        The reward as a float.

    Raises:
        ValueError: fewer than two scores, not 1-D, or NaN/inf.
    """
    s = np.asarray(scores_in_gold_rank_order, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be a 1-D array in gold rank order, got shape {s.shape}")
    if s.shape[0] < 2:
        raise ValueError(f"the anchor reward needs at least 2 ranked scores, got {s.shape[0]}")
    if not np.isfinite(s).all():
        raise ValueError("scores contain NaN or inf")
    i, j = np.triu_indices(s.shape[0], k=1)  # 0-based, so the 1-based 2^(i-1) is 2^i here
    log_sigmoid = -np.logaddexp(0.0, -(s[i] - s[j]))
    return float(np.sum(log_sigmoid / ((j - i) * np.exp2(i))))
