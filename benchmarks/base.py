"""Benchmark items, the benchmark protocols, and the helpers loaders share.

An evaluator benchmark yields items; each item becomes one `score_set` call (`judges.base.Evaluator`): pairwise
items with K=2, listwise items with K=len(responses). A policy benchmark yields prompts for a policy to answer,
each with what its judge needs (`PolicyItem`). Items are frozen records; nothing here imports torch.

A benchmark loads from `data_dir/<folder>/` holding the upstream files in their original formats when a data dir is
given, else from its Hugging Face dataset through `datasets` (the real path users run).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from harness.backends.base import Message
from harness.errors import ConfigError
from harness.seeds import derive_seed

if TYPE_CHECKING:
    from benchmarks.scoring import Metric


@dataclass(frozen=True, slots=True)
class PairwiseItem:
    """Two responses to one prompt, one of them preferred by the benchmark."""

    id: str
    """Unique within the benchmark (stable across runs: records are keyed by it)."""
    prompt: str
    """The user prompt (multi-turn context rendered into one string where the upstream has several turns)."""
    responses: tuple[str, str]
    """The two responses in presentation order (A, B), after any A/B randomisation."""
    preferred: int
    """Index (0 or 1) into `responses` of the preferred response."""
    meta: Mapping[str, str] = field(default_factory=dict)
    """Upstream facts metrics need (subset, source, domain, styles, ...)."""


@dataclass(frozen=True, slots=True)
class ListwiseItem:
    """A ranked list of responses to one prompt."""

    id: str
    """Unique within the benchmark."""
    prompt: str
    """The user prompt."""
    responses: tuple[str, ...]
    """The candidates, in upstream order (not rank order)."""
    gold_ranks: tuple[int, ...]
    """Gold rank of each response, aligned with `responses`: 1 = best; equal ranks are gold ties."""
    meta: Mapping[str, str] = field(default_factory=dict)
    """Upstream facts metrics need."""


Item = PairwiseItem | ListwiseItem


@dataclass(frozen=True, slots=True)
class PolicyItem:
    """One prompt a policy answers (policy benchmarks: AlpacaEval 2, Arena-Hard v2.0, WildBench, WritingBench),
    with what its judge needs."""

    id: str
    """Unique within the benchmark (stable across runs: generations and judgments are keyed by it)."""
    messages: tuple[Message, ...]
    """The conversation the policy continues: one user turn, or the upstream's earlier turns then the last user
    turn (WildBench's multi-turn tasks)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """What the judge needs, as upstream names it: AlpacaEval's reference `output` and `dataset`; Arena-Hard's
    `category`, `subcategory` and the category's `baseline` answer; WildBench's `checklist` and tags; WritingBench's
    `criteria`. JSON-ready values only."""


@runtime_checkable
class Benchmark(Protocol):
    """What every evaluator benchmark implements; catalogued by name (`harness.catalog`, or a plugin's entry
    point in the group `harness.benchmark`)."""

    name: str
    """Registry name (`judgebench`, `rm_bench`, ...)."""
    display: str
    """How tables name it (the paper's column name: `JudgeBench`, `RM-Bench`, `LMSYS-Chat-1M`, ...)."""
    kind: Literal["pairwise", "listwise"]
    """The item type it yields."""
    metrics: tuple[Metric, ...]
    """Its metrics, headline first (`benchmarks.scoring`): reports, tables and `harness compare` ask these."""

    def load(self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0) -> list[Item]:
        """The benchmark's items, in a stable order; `limit` keeps the first N; `seed` drives A/B randomisation."""
        ...


@runtime_checkable
class PolicyBenchmark(Protocol):
    """What every policy benchmark implements; catalogued by name like the others, with its judge under the
    registry kind "judge" by the same name.

    `harness generate --benchmark NAME` answers its items' `messages`; its judge (`judges/`) reads their `meta`
    and reads its judgments into record parts (`read`); `record_fields` says what every record of an item carries
    (the meta its metrics group by, the trace fields they read), judged or not.
    """

    name: str
    display: str
    """How tables name it (`AlpacaEval 2`, `Arena-Hard v2.0`, `WildBench`, `WritingBench`)."""
    kind: Literal["policy"]
    metrics: tuple[Metric, ...]
    """Its metrics, headline first, read from the judged records of a policy table (`judges.policy`)."""

    def load(self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0) -> list[PolicyItem]:
        """The benchmark's items in the upstream order; `limit` keeps the first N."""
        ...

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """(meta, trace fields) every record of `item` carries."""
        ...


def fingerprint(items: Sequence[Any]) -> str:
    """A short hash of every item's id, prompt, responses and gold label (policy items: messages and what the
    judge reads), in order: what a run records of the data it loaded, and what `harness view` checks."""
    h = hashlib.sha256()
    for item in items:
        if hasattr(item, "messages"):
            chat = [[m.role, m.content] for m in item.messages]
            h.update(json.dumps([item.id, chat, item.meta], ensure_ascii=False, sort_keys=True, default=str).encode())
            continue
        gold = item.preferred if hasattr(item, "preferred") else list(item.gold_ranks)
        h.update(json.dumps([item.id, item.prompt, list(item.responses), gold], ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def randomise_pair(item_id: str, preferred_text: str, other_text: str, *, seed: int) -> tuple[tuple[str, str], int]:
    """Put the preferred response at A or B by a seed derived from (seed, item id); returns (responses, preferred).

    For upstreams that always store the preferred response first (`chosen`), so a position-biased evaluator cannot
    score well by position alone.
    """
    if random.Random(derive_seed(seed, item_id, "ab")).random() < 0.5:
        return (preferred_text, other_text), 0
    return (other_text, preferred_text), 1


def data_folder(data_dir: Path | None, folder: str, *, required: Sequence[str]) -> Path:
    """`data_dir/folder`, checked to hold the `required` files (glob patterns).

    Raises:
        ConfigError: naming the folder and what is missing there.
    """
    path = Path(data_dir) / folder  # type: ignore[arg-type]
    if not path.is_dir():
        raise ConfigError(f"benchmark data folder not found: {path}")
    missing = [pattern for pattern in required if not any(path.glob(pattern))]
    if missing:
        raise ConfigError(f"{path}: missing {', '.join(missing)}")
    return path


def load_hub(dataset_id: str, *, split: str, config: str | None = None, revision: str | None = None):
    """A Hugging Face dataset split through `datasets` (hub or local HF cache).

    Raises:
        ConfigError: with the dataset id and the reason, plus a hint to use `--data-dir` offline.
    """
    return _load_dataset(f"Hugging Face dataset {dataset_id!r} (split {split!r})",
                         "offline, pass --data-dir with the upstream files",
                         dataset_id, config, split=split, revision=revision)


def load_json_file(url: str, *, hint: str = "offline, pass --data-dir with the upstream files"):
    """A JSON array or JSON-lines file at `url` (`hf://datasets/...`, `https://...`) through `datasets`' json
    builder (its one split, `train`): for upstreams that publish files rather than a loadable dataset.

    Raises:
        ConfigError: with the URL, the reason and `hint`.
    """
    return _load_dataset(url, hint, "json", data_files=url, split="train")


def _load_dataset(what: str, hint: str, *args, **kwargs):
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a core dependency
        raise ConfigError("loading benchmarks from the Hugging Face hub needs `datasets`") from exc
    try:
        return datasets.load_dataset(*args, **kwargs)
    except Exception as exc:  # datasets raises many types (connection, missing split, gated repo, bad JSON)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot load {what}: {reason}; {hint}") from None
