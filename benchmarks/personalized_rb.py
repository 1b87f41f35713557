"""Personalized RewardBench: does an evaluator prefer the response that fits *this* user's own rubric?

Upstream: Hugging Face `QiyaoMa/Personalized-RewardBench` (paper arXiv 2604.07343, Qiyao Ma et al.; code
GitHub `Martin-qyma/Personalized-RewardBench`, which holds no data). Licence: the Hub card says `apache-2.0`;
the GitHub repository has no LICENSE file. Questions and user histories come from LaMP-QA
(`alireza7/LaMP-QA`).

Data: three configs (no default), each with one split `test`; read in this order:

| config (subset)                        | short name | rows        |
|----------------------------------------|------------|-------------|
| `Lifestyle_and_Personal_Development`   | Lifestyle  | 989         |
| `Art_and_Entertainment`                | Art        | 767         |
| `Society_and_Culture`                  | Society    | unknown (*) |

(*) The card text we could read offline was cut off before this number. Abbreviated record (schema from the
card; no real row was visible offline):

    {"id": "...", "question": "How do I ...?", "category": "...",
     "profile": [{"id": "...", "category": "...", "text": "<a past question, with details>"}, ...],
     "rubric_aspects": [{"aspect": "...", "evidence": "...", "reason": "..."}, ...], "narrative": "...",
     "chosen": "<response following the user's personal rubric>", "rejected": "<good response violating it>"}

Items: the preferred response is always `chosen`; A/B positions are drawn by `randomise_pair`. Item id =
`<short name>:<id>`. `meta`: `subset` (short name), `config`, `category`, `record_id`, `profile_posts` (how
many past posts the prompt shows).

The prompt: the benchmark is about personalisation, so the evaluator must see who is asking. The upstream
README lists the evaluator input as `question (+ profile)`, and forbids `narrative` and `rubric_aspects` (they
would leak the scoring standard); we never read those two fields. The prompt shows the user's first
`PROFILE_POSTS` = 10 past posts in stored order, formatted `Post i (Category: c):\\n<text>` as the upstream
generation scripts do (their default is k = 10 posts, taken from profiles the upstream re-ranks by relevance
to the question with Contriever), then the current question. **Assumption**: whether the Hub rows store the
profile already relevance-ranked is not known offline; we take the stored order. The upstream pairwise judge
prompt (`prompts/pairwise_user.txt`) shows only the question, so numbers from that exact setting are not
comparable with ours.

Local data (`data_dir/personalized_rewardbench/`): the Hub dataset exported per config, one of (first found
wins) `<config>_test.jsonl` (the upstream repository's own `data/` naming), `<config>_test.json` (a JSON array
or JSON lines, as `Dataset.to_json` writes), `<config>_test.parquet`, or the Hub repository layout
`<config>/test-*.parquet`. All three configs must be present.

Scoring: strict pairwise accuracy (`benchmarks.scoring.PAIRWISE_ACC`): correct iff score(chosen) > score(rejected); a tie is wrong.
The upstream reports accuracy for pairwise judges (A/B shuffled per item; an unparsable verdict defaults to
"A" there, whereas we record it as a failure) and the chosen win rate with strict `>` for pointwise reward
models.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from benchmarks import base, scoring
from benchmarks.base import PairwiseItem, randomise_pair
from harness.errors import ConfigError
from harness.jsonl import read_json, read_jsonl, read_text

HUB_ID = "QiyaoMa/Personalized-RewardBench"
HUB_SPLIT = "test"
FOLDER = "personalized_rewardbench"
SUBSETS = {
    "Lifestyle_and_Personal_Development": "Lifestyle",
    "Art_and_Entertainment": "Art",
    "Society_and_Culture": "Society",
}
"""Hub config -> upstream short name, in load order."""
PROFILE_POSTS = 10
"""Past posts shown in the prompt (the upstream generation scripts' default k)."""


def render_prompt(question: str, posts: Sequence[Mapping[str, str]]) -> str:
    """The evaluator's prompt: the user's past posts (if any), then the current question."""
    if not posts:
        return question
    lines = [
        f"Post {i} (Category: {p.get('category') or 'unknown'}):\n{p['text']}" for i, p in enumerate(posts, 1)
    ]
    return (
        "Past posts by the user asking the question below (their earlier questions with descriptions), "
        "which show the user's interests and preferences:\n\n"
        + "\n\n".join(lines)
        + f"\n\nThe user's current question:\n{question}"
    )


def _text(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: field {key!r} must be a non-empty string")
    return value


def _profile(row: Mapping[str, Any], where: str) -> list[Mapping[str, str]]:
    value = row.get("profile")
    if not isinstance(value, list):
        raise ConfigError(f"{where}: field 'profile' must be a list of {{id, category, text}} posts")
    for index, post in enumerate(value):
        ok = isinstance(post, Mapping) and isinstance(post.get("text"), str) and post["text"].strip()
        if not ok or not isinstance(post.get("category", ""), (str, type(None))):
            raise ConfigError(
                f"{where}: profile[{index}] must have a non-empty string 'text' (and string 'category')"
            )
    return value


def to_item(row: Mapping[str, Any], config: str, where: str, *, seed: int) -> PairwiseItem:
    """One upstream row of `config` (local file or Hub) as a pairwise item; `where` names it in errors."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    record_id = row.get("id")
    if isinstance(record_id, bool) or not isinstance(record_id, (str, int)) or str(record_id) == "":
        raise ConfigError(f"{where}: field 'id' must be a non-empty string, got {record_id!r}")
    question, chosen, rejected = (_text(row, key, where) for key in ("question", "chosen", "rejected"))
    posts = _profile(row, where)[:PROFILE_POSTS]
    short = SUBSETS[config]
    item_id = f"{short}:{record_id}"
    responses, preferred = randomise_pair(item_id, chosen, rejected, seed=seed)
    meta = {
        "subset": short,
        "config": config,
        "category": str(row.get("category") or ""),
        "record_id": str(record_id),
        "profile_posts": str(len(posts)),
    }
    return PairwiseItem(item_id, render_prompt(question, posts), responses, preferred, meta)


def _read(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, record) pairs of a JSONL, JSON (array or lines) or parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # datasets depends on pyarrow

        try:
            batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
            index = 0
            for batch in batches:
                for record in batch.to_pylist():
                    yield f"{path}: row {index}", record
                    index += 1
        except OSError as exc:  # pyarrow's ArrowInvalid is an OSError subclass too
            raise ConfigError(f"{path}: cannot read parquet ({exc})") from None
        return
    if path.suffix == ".json" and read_text(path).lstrip().startswith("["):
        records = read_json(path)
        yield from ((f"{path}: record {i}", r) for i, r in enumerate(records))
        return
    yield from read_jsonl(path)


def _files(folder: Path, config: str) -> list[Path]:
    for name in (f"{config}_test.jsonl", f"{config}_test.json", f"{config}_test.parquet"):
        if (folder / name).is_file():
            return [folder / name]
    return sorted((folder / config).glob("test-*.parquet"))


def _local_rows(data_dir: Path) -> Iterator[tuple[str, str, Any]]:
    hint = f"the data is on the Hugging Face Hub ({HUB_ID}, configs {', '.join(SUBSETS)}, split {HUB_SPLIT})"
    try:
        folder = base.data_folder(data_dir, FOLDER, required=())
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {hint}") from None
    files = {config: _files(folder, config) for config in SUBSETS}
    missing = [c for c, found in files.items() if not found]
    if missing:
        raise ConfigError(
            f"{folder}: missing data for {', '.join(missing)} (expected <config>_test.jsonl, "
            f"<config>_test.json, <config>_test.parquet or <config>/test-*.parquet); {hint}"
        )
    for config, paths in files.items():
        for path in paths:
            for where, row in _read(path):
                yield where, config, row


def _hub_rows() -> Iterator[tuple[str, str, Any]]:
    for config in SUBSETS:
        for index, row in enumerate(base.load_hub(HUB_ID, split=HUB_SPLIT, config=config)):
            yield f"{HUB_ID}[{config}/{HUB_SPLIT}] row {index}", config, row


def _items(rows: Iterable[tuple[str, str, Any]], *, limit: int | None, seed: int) -> list[PairwiseItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    items: list[PairwiseItem] = []
    seen: dict[str, str] = {}
    for where, config, row in islice(rows, limit):  # islice: no Hub config is fetched beyond the limit
        item = to_item(row, config, where, seed=seed)
        if item.id in seen:
            raise ConfigError(f"{where}: duplicate id {item.id} (first at {seen[item.id]})")
        seen[item.id] = where
        items.append(item)
    return items


class PersonalizedRewardBench:
    """Personalized RewardBench chosen/rejected pairs, the user's profile in the prompt, A/B randomised."""

    name = "personalized_rb"
    display = "Personalized-RB"
    metrics = scoring.PAIRWISE
    kind: Literal["pairwise"] = "pairwise"

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PairwiseItem]:
        """All pairs, config by config (Lifestyle, Art, Society), in stored order; `seed` sets A/B."""
        rows = _local_rows(Path(data_dir)) if data_dir is not None else _hub_rows()
        return _items(rows, limit=limit, seed=seed)


PERSONALIZED_RB = PersonalizedRewardBench()
