"""JudgeBench: pairs of responses to hard questions where one response is objectively correct.

Upstream: `ScalerLab/JudgeBench` (GitHub, paper arXiv 2410.12784; Hugging Face dataset
`ScalerLab/JudgeBench`). Licence: the GitHub repository states none (cite the paper); the Hugging Face card
says `mit`.

Data: one JSON object per line; both responses of a pair come from one model. Two response models, two sets:

| registry name       | local file (`data_dir/judgebench/`)               | Hub split | pairs |
|---------------------|---------------------------------------------------|-----------|-------|
| `judgebench`        | `judgebench_gpt-4o-2024-05-13.jsonl`              | `gpt`     | 350   |
| `judgebench_claude` | `judgebench_claude-3-5-sonnet-20240620.jsonl`     | `claude`  | 270   |

`judgebench` (GPT-4o responses) is the set the paper reports. Abbreviated record:

    {"pair_id": "e302b0a0-28d5-5a3c-b1af-fedcf5543e72", "original_id": 1420, "source": "mmlu-pro-law",
     "question": "A college student initiated a criminal case against ... (A) Yes, because ... (J) ...",
     "response_model": "gpt-4o-2024-05-13", "response_A": "...", "response_B": "...", "label": "A>B"}

`label` is `A>B` or `B>A` (no ties) and refers to the stored order. The stored order is already mixed (GPT-4o
set 193 A>B / 157 B>A; Claude set 143 / 127), so items keep it: `responses = (response_A, response_B)` and
`preferred` follows `label`; `seed` does not change anything here. Item id = `pair_id`. `meta`: `source`,
`category` (Knowledge = `mmlu-pro-*` (154 per set), Reasoning = `livebench-reasoning`, Math =
`livebench-math`, Coding = `livecodebench`), `pair_id`, `original_id` (`""` for LiveBench/LiveCodeBench
pairs), `original_label`, `response_model`.

Official scoring (JudgeBench `utils/metrics.py`): a pairwise judge runs twice, on (A, B) and on (B, A); the
second decision is flipped back to the original frame; `counter` = +1 per decision equal to `label`, -1 per
decision equal to the flipped label, 0 for a tie or a missing decision; the pair is correct iff `counter > 0`,
and accuracy = correct / all pairs (ties and inconsistent pairs are not correct). Reward models are scored on
one ordering: correct iff the preferred response gets the strictly higher score (our strict pairwise accuracy,
`benchmarks.scoring.PAIRWISE_ACC`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from benchmarks import base, scoring
from benchmarks.base import PairwiseItem
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "ScalerLab/JudgeBench"
FOLDER = "judgebench"
FILES = {
    "gpt": "judgebench_gpt-4o-2024-05-13.jsonl",
    "claude": "judgebench_claude-3-5-sonnet-20240620.jsonl",
}
_LABELS = {"A>B": 0, "B>A": 1}
_CATEGORIES = {"livebench-reasoning": "Reasoning", "livebench-math": "Math", "livecodebench": "Coding"}


def category(source: str) -> str:
    """The paper's category for a JudgeBench `source` (Knowledge/Reasoning/Math/Coding, else itself)."""
    return "Knowledge" if source.startswith("mmlu-pro") else _CATEGORIES.get(source, source)


def _text(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: field {key!r} must be a non-empty string, got {value!r:.60}")
    return value


def to_item(row: Mapping[str, Any], where: str) -> PairwiseItem:
    """One upstream row (local JSONL line or Hub row) as a pairwise item; `where` names it in errors."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    label = row.get("label")
    if label not in _LABELS:
        raise ConfigError(f"{where}: field 'label' must be 'A>B' or 'B>A', got {label!r}")
    pair_id = _text(row, "pair_id", where)
    source = _text(row, "source", where)
    original_id = row.get("original_id")
    return PairwiseItem(
        id=pair_id,
        prompt=_text(row, "question", where),
        responses=(_text(row, "response_A", where), _text(row, "response_B", where)),
        preferred=_LABELS[label],
        meta={
            "source": source,
            "category": category(source),
            "pair_id": pair_id,
            "original_id": "" if original_id is None else str(original_id),
            "original_label": label,
            "response_model": str(row.get("response_model") or ""),
        },
    )


def _items(rows: Iterable[tuple[str, Any]], limit: int | None) -> list[PairwiseItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    items: list[PairwiseItem] = []
    seen: dict[str, str] = {}
    for where, row in islice(rows, limit):
        item = to_item(row, where)
        if item.id in seen:
            raise ConfigError(f"{where}: duplicate pair_id {item.id!r} (first at {seen[item.id]})")
        seen[item.id] = where
        items.append(item)
    return items


class JudgeBench:
    """JudgeBench pairs whose responses come from one response model (`split`: `gpt` or `claude`)."""

    kind: Literal["pairwise"] = "pairwise"
    metrics = scoring.PAIRWISE
    """Strict pairwise accuracy over scores: for the pairwise judge this is JudgeBench's both-orders rule (its
    scores are built from `benchmarks.metrics.both_orders_sum`, see `judges.pairwise`)."""

    def __init__(self, split: Literal["gpt", "claude"] = "gpt", *, name: str = "judgebench") -> None:
        if split not in FILES:
            raise ConfigError(f"JudgeBench split must be one of {sorted(FILES)}, got {split!r}")
        self.split = split
        self.name = name
        self.display = "JudgeBench" if split == "gpt" else "JudgeBench (Claude)"

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PairwiseItem]:
        """The pairs in upstream order, stored A/B order kept (`seed` is unused: that order is mixed)."""
        if data_dir is not None:
            filename = FILES[self.split]
            path = base.data_folder(data_dir, FOLDER, required=[filename]) / filename
            return _items(read_jsonl(path), limit)
        rows = base.load_hub(HUB_ID, split=self.split)
        return _items(((f"{HUB_ID}[{self.split}] row {i}", row) for i, row in enumerate(rows)), limit)


JUDGEBENCH = JudgeBench("gpt", name="judgebench")
JUDGEBENCH_CLAUDE = JudgeBench("claude", name="judgebench_claude")
