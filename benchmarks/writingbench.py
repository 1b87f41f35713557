"""WritingBench: writing requests across 6 domains and 100 sub-domains, each with its own 1-10 scoring criteria.

Upstream: GitHub `X-PLUG/WritingBench` (Apache-2.0; paper arXiv 2503.05244). There is no official Hugging Face
dataset: the data are JSON-lines files in the repository, read here at pinned commits (`VERSIONS`):
`benchmark_query/benchmark_all.jsonl` (the full benchmark: v2 1,000 queries, v1 1,239) and the requirement
subsets `benchmark_query/requirement/<dim>/<dim>_subset.jsonl` (the queries involving a style / format / length
requirement, with their 5 regular criteria) and `<dim>_subset_C.jsonl` (the same queries, only the 1-2 criteria
that measure the requirement; each is one of the 5 regular ones). Abbreviated v2 record (v1 names the criteria
field `criteria`; the v2 full file adds `lang`):

    {"index": 16, "domain1": "Academic & Engineering", "domain2": "Introduction",
     "query": "Please write an introduction chapter for a medical imaging analysis thesis, ...",
     "checklist": [{"name": "Introduction_Comprehensiveness", "criteria_description": "Evaluates how ...",
                    "1-2": "...", "3-4": "...", "5-6": "...", "7-8": "...", "9-10": "..."}, ...]}

Local data: `data_dir/writingbench/<folder>/<file>` with `<folder>` = `v2_current` or `v1_2025-03-10` (the
version) and `<file>` the upstream file name (`benchmark_all.jsonl`, `length_subset.jsonl`,
`length_subset_C.jsonl`, ...). `load()` reads the full benchmark `benchmark_all.jsonl` (v2 by default);
`load(subset="length")` reads `length_subset.jsonl`, `subset="length_C"` reads `length_subset_C.jsonl`, and
`version="v1"` the v1 files. Without a data dir the same file is read from GitHub at the pinned commit
through `datasets`' json builder (`load_dataset("json", data_files=URL, split="train")`).

Items, in file order: one user turn with `query` (upstream `generate_response.py` sends the query alone);
id `writingbench:<index>` for v2, `writingbench:v1:<index>` for v1 (v1 and v2 reuse indices for different
queries; within a version an index names one query in every file, so subsets share ids with the full file).
`meta` (JSON-ready): `index`, `domain1`, `domain2`, `criteria` (the criterion dicts as upstream, from
`checklist` or `criteria`), `version` (`v2`/`v1`), `subset` (`all` or the subset name), and `lang` where present.

Official scoring (`evaluate_benchmark.py`, `calculate_scores.py`): the judge scores each criterion 1-10
(`{"score", "reason"}`, after dropping a response's `</think>` block); query score = mean over its criteria;
benchmark score = mean over all criterion scores (x10 on the leaderboard); `<dim>_R` / `<dim>_C` average the
scores of the subset queries / of the `_C` criteria, looked up by criterion `name`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks import base
from benchmarks.base import PolicyItem
from benchmarks.scoring import Metric
from benchmarks.writingbench_score import DIMENSIONS, QueryScores, writingbench_result
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

REPO = "X-PLUG/WritingBench"
FOLDER = "writingbench"
FULL_FILE = "benchmark_all.jsonl"
SUBSETS = tuple(f"{d}{c}" for d in DIMENSIONS for c in ("", "_C"))
"""Valid `subset=` names: `length` -> `length_subset.jsonl`, `length_C` -> `length_subset_C.jsonl`, ..."""
CRITERION_KEYS = ("name", "criteria_description", "1-2", "3-4", "5-6", "7-8", "9-10")


@dataclass(frozen=True, slots=True)
class Version:
    """One upstream version of the benchmark files."""

    folder: str
    """Local folder under `data_dir/writingbench/`."""
    commit: str
    """The pinned upstream commit the remote path reads."""
    id_prefix: str
    """Item id prefix (v1 indices collide with v2 ones)."""


VERSIONS = {
    "v2": Version("v2_current", "7a30aa4bd4305cc912d07b37a491b99097fc5078", "writingbench:"),
    "v1": Version("v1_2025-03-10", "cf2827a321d842d7182f0dcfe3c60356a10372d4", "writingbench:v1:"),
}
"""v2: the last change to `benchmark_all.jsonl` (2025-06-17, `lang` added; the subsets are unchanged since);
v1: the 2025-03-10 release."""


def file_name(subset: str | None) -> str:
    """The upstream file name of the full benchmark (`subset=None`) or of a requirement subset."""
    if subset is None:
        return FULL_FILE
    if subset not in SUBSETS:
        raise ConfigError(
            f"unknown WritingBench subset {subset!r}; valid: {', '.join(SUBSETS)} (or None: all)"
        )
    dim, _, c = subset.partition("_")
    return f"{dim}_subset{'_C' if c else ''}.jsonl"


def source_url(version: str, subset: str | None) -> str:
    """The raw GitHub URL of a file at the version's pinned commit."""
    name = file_name(subset)
    path = name if subset is None else f"requirement/{subset.partition('_')[0]}/{name}"
    return f"https://raw.githubusercontent.com/{REPO}/{VERSIONS[version].commit}/benchmark_query/{path}"


def _criteria(row: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    present = [key for key in ("checklist", "criteria") if row.get(key) is not None]
    if len(present) != 1:
        raise ConfigError(
            f"{where}: expected one criteria field, 'checklist' (v2) or 'criteria' (v1); found {present or 'none'}"
        )
    value = row[present[0]]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: field {present[0]!r} must be a non-empty list of criteria")
    names: set[str] = set()
    for i, criterion in enumerate(value):
        bad = not isinstance(criterion, Mapping) or any(
            not isinstance(criterion.get(k), str) for k in CRITERION_KEYS
        )
        if bad:
            raise ConfigError(
                f"{where}: {present[0]}[{i}] must be an object with string {', '.join(CRITERION_KEYS)}"
            )
        if criterion["name"] in names:  # upstream keys the scores by criterion name
            raise ConfigError(f"{where}: duplicate criterion name {criterion['name']!r}")
        names.add(criterion["name"])
    return [dict(criterion) for criterion in value]


def to_item(row: Any, where: str, *, version: str, subset: str | None) -> PolicyItem:
    """One upstream record (local line or remote row) as a policy item."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    index = row.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ConfigError(f"{where}: 'index' must be an integer, got {index!r}")
    for key in ("domain1", "domain2"):
        if not isinstance(row.get(key), str):
            raise ConfigError(f"{where}: field {key!r} must be a string")
    query = row.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ConfigError(f"{where}: field 'query' must be a non-empty string")
    meta: dict[str, Any] = {
        "index": index,
        "domain1": row["domain1"],
        "domain2": row["domain2"],
        "criteria": _criteria(row, where),
        "version": version,
        "subset": subset or "all",
    }
    if isinstance(row.get("lang"), str):
        meta["lang"] = row["lang"]
    return PolicyItem(f"{VERSIONS[version].id_prefix}{index}", (Message("user", query),), meta)


def _items(
    rows: Iterable[tuple[str, Any]], *, version: str, subset: str | None, limit: int | None
) -> list[PolicyItem]:
    items: list[PolicyItem] = []
    seen: dict[str, str] = {}
    for where, row in islice(rows, limit):
        item = to_item(row, where, version=version, subset=subset)
        if item.id in seen:
            raise ConfigError(f"{where}: duplicate index {item.meta['index']} (first at {seen[item.id]})")
        seen[item.id] = where
        items.append(item)
    return items


def _local_rows(data_dir: Path, version: str, subset: str | None) -> Iterator[tuple[str, Any]]:
    name = file_name(subset)
    folder = Path(data_dir) / FOLDER / VERSIONS[version].folder
    path = folder / name
    if path.is_file():
        return read_jsonl(path)
    there = sorted(p.name for p in folder.glob("*.jsonl")) if folder.is_dir() else []
    what = "the full benchmark file" if subset is None else f"the {subset!r} subset file"
    found = f"files there: {', '.join(there)}" if there else f"no .jsonl files in {folder}"
    local = [repr(s) for s in SUBSETS if file_name(s) in there]
    hint = f"; load a requirement subset with subset= {' or '.join(local)}" if local else ""
    raise ConfigError(
        f"{path} not found ({what} of WritingBench {version}, upstream {source_url(version, subset)}); "
        f"{found}{hint}"
    )


def _remote_rows(version: str, subset: str | None) -> Iterator[tuple[str, Any]]:
    url = source_url(version, subset)
    for index, row in enumerate(base.load_json_file(url)):
        yield f"{url} row {index}", row


# --- metrics over judged records (`judges.policy`: scores = one 1-10 score per criterion, None where it failed) ---


def _scored(record: Any) -> list[float]:
    return [s for s in record.scores if s is not None]


OVERALL = Metric(
    "overall", "Score",
    "mean criterion score on the 1-10 scale, printed x10 (upstream's Overall: the mean over every scored "
    "criterion, so a query weighs by its scored criteria); a failed criterion is left out, and a query with one "
    "is counted in n_failed",
    lambda r: sum(found) / len(found) / 10 if (found := _scored(r)) else 0.0,
    lambda r: False,
    binary=False,
    weights=lambda records: np.array([float(len(_scored(r))) for r in records]),
    failed=lambda r: not r.scores or any(s is None for s in r.scores),
    details=lambda records: writingbench_result(
        [QueryScores.from_record(r) for r in records if r.scores]).to_json(),
)


class WritingBench:
    """WritingBench queries, one user turn each, with their per-query 1-10 criteria."""

    name = "writingbench"
    display = "WritingBench"
    metrics = (OVERALL,)
    kind: Literal["policy"] = "policy"

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        meta = {"index": str(item.meta.get("index", item.id)), "domain1": str(item.meta.get("domain1", "")),
                "domain2": str(item.meta.get("domain2", ""))}
        return meta, {"criteria": [c["name"] for c in item.meta["criteria"]]}

    def load(
        self,
        *,
        data_dir: Path | None = None,
        limit: int | None = None,
        seed: int = 0,
        subset: str | None = None,
        version: Literal["v2", "v1"] = "v2",
    ) -> list[PolicyItem]:
        """The queries in file order: the full benchmark, or with `subset` one requirement subset (`SUBSETS`).

        `limit` keeps the first N; `seed` is unused (no randomisation).
        """
        if version not in VERSIONS:
            raise ConfigError(f"unknown WritingBench version {version!r}; valid: {', '.join(VERSIONS)}")
        if limit is not None and limit < 0:
            raise ConfigError(f"limit must be >= 0, got {limit}")
        file_name(subset)  # an unknown subset is an error before any file is read
        if data_dir is not None:
            rows = _local_rows(Path(data_dir), version, subset)
        else:
            rows = _remote_rows(version, subset)
        return _items(rows, version=version, subset=subset, limit=limit)


WRITINGBENCH = WritingBench()
