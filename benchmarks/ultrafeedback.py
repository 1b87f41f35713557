"""UltraFeedback (binarized): GPT-4-rated preference pairs over prompts from many instruction sets.

Upstream: Hugging Face `HuggingFaceH4/ultrafeedback_binarized` (licence MIT), split `test_prefs` (2,000
pairs), built from `openbmb/UltraFeedback` (MIT): chosen = the completion with the highest `overall_score` of
four, rejected = a random other one. The local file
`data_dir/ultrafeedback/ultrafeedback_binarized_test_prefs_first500.jsonl` is a third-party copy
(`chanys/tnlp`, Apache-2.0) of the **first 500 rows** of `test_prefs`, keeping only `chosen` and `rejected`.
Abbreviated record (Hub rows add `prompt`, `prompt_id`, `messages`, `score_chosen`, `score_rejected`):

    {"chosen":   [{"role": "user", "content": "You are given a sentence in Spanish. ... into Galician. ..."},
                  {"role": "assistant", "content": "..."}],
     "rejected": [{"role": "user", "content": "You are given a sentence in Spanish. ..."},
                  {"role": "assistant", "content": "..."}]}

Items: prompt = the user turn (identical in `chosen` and `rejected`, checked), the preferred response is the
chosen assistant turn, A/B positions drawn by `randomise_pair`. Item id = `test_prefs:<row index>`, so the
local file and the first 500 Hub rows share ids. `meta`: `row`, `identical_responses` (`true`/`false`), and
where present `prompt_id`, `score_chosen`, `score_rejected`. Counts: 500 pairs locally, 2,000 on the Hub.

Scoring: strict pairwise accuracy (`benchmarks.scoring.PAIRWISE_ACC`): right iff score(chosen) > score(rejected); a tie is wrong.
The upstream allows equal ratings and identical texts; 11 of the local 500 pairs have byte-identical chosen
and rejected responses. They are kept (not dropped), so on them an evaluator can only tie and is scored wrong;
the tie rate reported next to the accuracy counts them (`meta["identical_responses"]` finds them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from benchmarks import base, scoring
from benchmarks.base import PairwiseItem, randomise_pair
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "HuggingFaceH4/ultrafeedback_binarized"
HUB_SPLIT = "test_prefs"
FOLDER = "ultrafeedback"
FILENAME = "ultrafeedback_binarized_test_prefs_first500.jsonl"


def _turns(row: Mapping[str, Any], key: str, where: str) -> tuple[str, str]:
    """(user content, assistant content) of a `[user, assistant]` message list."""
    value = row.get(key)
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in value)
        and [m.get("role") for m in value] == ["user", "assistant"]
    )
    if not ok:
        raise ConfigError(
            f"{where}: field {key!r} must be a [user, assistant] list of {{role, content}} messages"
        )
    return value[0]["content"], value[1]["content"]


def to_item(row: Mapping[str, Any], index: int, where: str, *, seed: int) -> PairwiseItem:
    """One upstream row (local line or Hub row; `index` = its row in `test_prefs`) as a pairwise item."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    prompt, chosen = _turns(row, "chosen", where)
    rejected_prompt, rejected = _turns(row, "rejected", where)
    if prompt != rejected_prompt:
        raise ConfigError(f"{where}: the user turns of 'chosen' and 'rejected' differ")
    if not prompt:
        raise ConfigError(f"{where}: empty user turn")
    item_id = f"{HUB_SPLIT}:{index}"
    responses, preferred = randomise_pair(item_id, chosen, rejected, seed=seed)
    meta = {"row": str(index), "identical_responses": "true" if chosen == rejected else "false"}
    for key in ("prompt_id", "score_chosen", "score_rejected"):
        if row.get(key) is not None:
            meta[key] = str(row[key])
    return PairwiseItem(item_id, prompt, responses, preferred, meta)


def _read_jsonl(path: Path) -> Iterator[tuple[int, str, Any]]:
    for index, (where, row) in enumerate(read_jsonl(path)):
        yield index, where, row


def _items(rows: Iterable[tuple[int, str, Any]], *, limit: int | None, seed: int) -> list[PairwiseItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    return [to_item(row, index, where, seed=seed) for index, where, row in islice(rows, limit)]


class UltraFeedback:
    """UltraFeedback binarized `test_prefs` pairs (chosen vs rejected), A/B randomised."""

    name = "ultrafeedback"
    display = "UltraFeedback"
    metrics = scoring.PAIRWISE
    kind: Literal["pairwise"] = "pairwise"

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PairwiseItem]:
        """The pairs in dataset order; `seed` places the chosen response at A or B."""
        if data_dir is not None:
            path = base.data_folder(data_dir, FOLDER, required=[FILENAME]) / FILENAME
            return _items(_read_jsonl(path), limit=limit, seed=seed)
        rows = base.load_hub(HUB_ID, split=HUB_SPLIT)
        return _items(
            ((index, f"{HUB_ID}[{HUB_SPLIT}] row {index}", row) for index, row in enumerate(rows)),
            limit=limit,
            seed=seed,
        )


ULTRAFEEDBACK = UltraFeedback()
