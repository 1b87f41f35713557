"""WritingBench's scores from per-criterion judgments: overall, per domain, per requirement dimension.

Upstream: GitHub `X-PLUG/WritingBench` (Apache-2.0), snapshot `ae2d517` (2025-12-19), `calculate_scores.py`. All
scores are on the 1-10 scale; the leaderboard prints them x10 (README: "scaled from 10 to 100 by multiplying by
10"), here `overall_x10` and `LEADERBOARD_SCALE`:
- query score: mean of its criterion scores (`read_scores_file`, `scores_data`);
- overall: mean of ALL criterion scores, not of the query means (`read_scores_file`, `overall_avg`);
- per domain (`domain1`, and `domain2`): mean of the query scores in it (`calculate_domain_scores`);
- requirement dimensions (`calculate_requirement_scores`): `<dim>_R` = mean query score over the queries of
  `<dim>_subset.jsonl`; `<dim>_C` = mean, over those queries, of the scores of the criteria that
  `<dim>_subset_C.jsonl` lists for the query, looked up by criterion `name`.

Deviations, stated: a failed criterion (the judge's answer unreadable after its re-ask, or a backend failure) is
counted (`n_failed`) and left out of every mean, and a query with none scored is in no query-level mean
(upstream stops the whole evaluation); `<dim>_R` / `<dim>_C` with no query are None (upstream prints 0).
The benchmark's `overall` metric reports `writingbench_result` of its records under `details`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError

DIMENSIONS = ("style", "format", "length")
"""The requirement dimensions with their own subsets."""
LEADERBOARD_SCALE = 10
DOMAIN1_ORDER = ("Academic & Engineering", "Finance & Business", "Politics & Law", "Literature & Arts",
                 "Education", "Advertising & Marketing")
"""`calculate_scores.py:DOMAIN1_ORDER`, the column order of the domain scores."""


@dataclass(frozen=True, slots=True)
class QueryScores:
    """One judged query: its domains and its criterion scores (None where a criterion failed)."""

    item: str
    domain1: str
    domain2: str
    scores: Mapping[str, float | None]
    """Criterion name -> 1..10, in the query's criteria order."""

    @property
    def score(self) -> float | None:
        """The query score: the mean of the scored criteria; None when none was scored."""
        found = [s for s in self.scores.values() if s is not None]
        return sum(found) / len(found) if found else None

    @classmethod
    def from_record(cls, record: Any) -> QueryScores:
        """A judged record of the benchmark (`scores` aligned with `trace["criteria"]`)."""
        names = record.trace.get("criteria") or [f"criterion {i}" for i in range(len(record.scores))]
        return cls(record.item, record.meta.get("domain1", ""), record.meta.get("domain2", ""),
                   dict(zip(names, record.scores)))


@dataclass(frozen=True, slots=True)
class RequirementScore:
    """One requirement dimension's scores (`calculate_scores.py:calculate_requirement_scores`), 1-10."""

    r_score: float | None
    """`<dim>_R`: mean query score over the subset's queries that have one; None when none has."""
    c_score: float | None
    """`<dim>_C`: mean score of the `_C` criteria of those queries; None when none was scored."""
    n_queries: int
    n_criteria: int
    n_criteria_failed: int
    """`_C` criteria of those queries that failed (left out of `c_score`)."""
    n_queries_failed: int
    """Subset queries judged with no criterion scored (in neither mean)."""
    n_not_judged: int
    """Subset queries without a judgment (upstream skips them too)."""


@dataclass(frozen=True, slots=True)
class WritingBenchResult:
    """A policy's WritingBench scores on the 1-10 scale (the leaderboard shows them x`LEADERBOARD_SCALE`)."""

    overall: float | None
    """Mean of all scored criterion scores (upstream `Overall`); None when none was scored."""
    overall_x10: float | None
    domain1: dict[str, float]
    """Mean query score per primary domain (`DOMAIN1_ORDER` first, then any other, in order of appearance)."""
    domain1_n: dict[str, int]
    domain2: dict[str, float]
    requirements: dict[str, RequirementScore]
    """Per requirement dimension asked for (`style`, `format`, `length`)."""
    n_queries: int
    """Judged queries with at least one scored criterion (upstream `Count`)."""
    n_queries_failed: int
    n_criteria: int
    """Scored criteria (the `overall` mean's count)."""
    n_failed: int
    """Failed criteria, left out of every mean."""

    def to_json(self) -> dict[str, Any]:
        """The fields, with each dimension as upstream's `<dim>_R` / `<dim>_C` (and its counts)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "requirements"}
        for dim, r in self.requirements.items():
            out[f"{dim}_R"], out[f"{dim}_C"] = r.r_score, r.c_score
            out[f"{dim}_n"] = {k: getattr(r, k) for k in r.__slots__ if k not in ("r_score", "c_score")}
        return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def requirement_score(queries: Sequence[QueryScores], subset: Sequence[str],
                      c_names: Mapping[str, Sequence[str]]) -> RequirementScore:
    """`<dim>_R` and `<dim>_C` of one dimension: `subset` the ids of `<dim>_subset.jsonl`, `c_names` each of
    those ids' criterion names in `<dim>_subset_C.jsonl` (looked up by name among the judged ones).

    Raises:
        ConfigError: for a judged subset query missing from the _C names, or a _C criterion it was not judged on.
    """
    judged = {q.item: q for q in queries}
    r, c = [], []
    failed = queries_failed = not_judged = 0
    for item in subset:
        q = judged.get(item)
        if q is None:
            not_judged += 1
            continue
        if q.score is None:
            queries_failed += 1
            continue
        r.append(q.score)
        if item not in c_names:
            raise ConfigError(f"WritingBench requirement subset: {item} is not in the _C file")
        for name in c_names[item]:
            if name not in q.scores:
                raise ConfigError(f"WritingBench requirement subset: {item} has no judged criterion {name!r}")
            value = q.scores[name]
            if value is None:
                failed += 1
            else:
                c.append(value)
    return RequirementScore(_mean(r), _mean(c), len(r), len(c), failed, queries_failed, not_judged)


def writingbench_result(
    queries: Sequence[QueryScores], *,
    requirements: Mapping[str, tuple[Sequence[str], Mapping[str, Sequence[str]]]] | None = None,
) -> WritingBenchResult:
    """All WritingBench scores of one policy's judged queries (see the module docstring).

    Args:
        queries: One per judged query.
        requirements: Dimension -> (the `<dim>` subset's ids, its ids' `_C` criterion names), for `<dim>_R` /
            `<dim>_C`.

    Raises:
        ConfigError: for a query judged twice, or an unknown dimension.
    """
    seen: set[str] = set()
    every: list[float] = []
    d1: dict[str, list[float]] = {d: [] for d in DOMAIN1_ORDER}
    d2: dict[str, list[float]] = {}
    failed = queries_failed = 0
    for q in queries:
        if q.item in seen:
            raise ConfigError(f"two WritingBench judgments for item {q.item!r}")
        seen.add(q.item)
        failed += sum(s is None for s in q.scores.values())
        every += [s for s in q.scores.values() if s is not None]
        if q.score is None:
            queries_failed += 1
            continue
        d1.setdefault(q.domain1, []).append(q.score)
        d2.setdefault(q.domain2, []).append(q.score)
    reqs = {}
    for dim, (subset, c_names) in (requirements or {}).items():
        if dim not in DIMENSIONS:
            raise ConfigError(f"unknown WritingBench requirement dimension {dim!r}; valid: {', '.join(DIMENSIONS)}")
        reqs[dim] = requirement_score(queries, subset, c_names)
    overall = _mean(every)
    return WritingBenchResult(
        overall=overall,
        overall_x10=None if overall is None else overall * LEADERBOARD_SCALE,
        domain1={d: _mean(v) for d, v in d1.items() if v},  # type: ignore[misc]
        domain1_n={d: len(v) for d, v in d1.items() if v},
        domain2={d: _mean(v) for d, v in d2.items()},  # type: ignore[misc]
        requirements=reqs,
        n_queries=len(seen) - queries_failed,
        n_queries_failed=queries_failed,
        n_criteria=len(every),
        n_failed=failed,
    )
