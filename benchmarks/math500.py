"""MATH-500: the 500-problem test subset of Hendrycks MATH ("Let's Verify Step by Step"), answers checked by
math-verify.

Upstream: OpenAI PRM800K `prm800k/math_splits/test.jsonl` (MIT; MATH itself MIT). Hub (the default):
`HuggingFaceH4/MATH-500`, config `default`, split `test` (500 rows), as lm-evaluation-harness' `hendrycks_math500`
loads it. Local (`data_dir/math500/test.jsonl`): the same records, one JSON object per line. Abbreviated record:

    {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates. ...",
     "solution": "... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
     "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
     "unique_id": "test/precalculus/807.json"}

Items: id `math500:<unique_id>`; one user turn, the problem followed by `PROMPT_SUFFIX` (the step-by-step,
`\\boxed{}` instruction Qwen's and simpleRL's math evaluations use); `meta`: `answer` (the gold LaTeX), `subject`,
`level`, `unique_id`. Checked: 500 records when not limited, unique ids, non-empty problem and answer.

Scoring (`judges.math_check`): the gold wrapped in `$...$` and the policy's answer parsed by math-verify, then
`verify(gold, answer)` (gold first: it is asymmetric), in a process pool with a per-item wall timeout. Accuracy:
1 for a verified answer, 0 otherwise; a check that timed out or crashed is 0 and counted in n_failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from benchmarks import base
from benchmarks.base import PolicyItem
from benchmarks.scoring import checked_accuracy
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "HuggingFaceH4/MATH-500"
HUB_SPLIT = "test"
FOLDER = "math500"
FILENAME = "test.jsonl"
N_PROBLEMS = 500
FIELDS = ("problem", "answer", "subject", "level", "unique_id")
PROMPT_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def to_item(row: Any, where: str) -> PolicyItem:
    """One upstream record as a policy item."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
    for f in ("problem", "answer", "unique_id"):
        if not isinstance(row[f], str) or not row[f].strip():
            raise ConfigError(f"{where}: field {f!r} must be a non-empty string")
    meta = {"answer": row["answer"], "subject": str(row["subject"]), "level": str(row["level"]),
            "unique_id": row["unique_id"]}
    return PolicyItem(f"math500:{row['unique_id']}", (Message("user", row["problem"] + PROMPT_SUFFIX),), meta)


def _items(rows: Iterable[tuple[str, Any]], *, limit: int | None) -> list[PolicyItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    items, seen = [], set()
    for where, row in rows:
        item = to_item(row, where)
        if item.id in seen:
            raise ConfigError(f"{where}: duplicate unique_id {item.meta['unique_id']!r}")
        seen.add(item.id)
        items.append(item)
    if limit is None and len(items) != N_PROBLEMS:
        raise ConfigError(f"expected {N_PROBLEMS} MATH-500 problems, found {len(items)}")
    return items[:limit]


def _local_rows(data_dir: Path) -> Iterable[tuple[str, Any]]:
    folder = base.data_folder(data_dir, FOLDER, required=[FILENAME])
    return read_jsonl(folder / FILENAME)


def _hub_rows() -> Iterable[tuple[str, Any]]:
    rows = base.load_hub(HUB_ID, split=HUB_SPLIT)
    return ((f"{HUB_ID}[{HUB_SPLIT}] row {i}", row) for i, row in enumerate(rows))


ACCURACY = checked_accuracy(
    "share of answers math-verify proves equal to the gold (verify(gold, answer), gold wrapped in $...$); an answer "
    "without one, or a check that timed out, is wrong (timeouts counted in n_failed)",
    failed=lambda r: not r.scores or r.scores[0] is None,
)


class Math500:
    """MATH-500's problems with their gold answers, checked by math-verify."""

    name = "math500"
    display = "MATH-500"
    metrics = (ACCURACY,)
    kind: Literal["policy"] = "policy"

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        return {"subject": str(item.meta.get("subject", "")), "level": str(item.meta.get("level", ""))}, {}

    def load(self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0) -> list[PolicyItem]:
        """The problems in the upstream order; `limit` keeps the first N; `seed` is unused."""
        rows = _local_rows(Path(data_dir)) if data_dir is not None else _hub_rows()
        return _items(rows, limit=limit)


MATH500 = Math500()
