"""WildBench v2: 1,024 real user tasks from WildChat, many with earlier turns, each with a judge checklist.

Upstream: GitHub `allenai/WildBench` (code, Apache-2.0), snapshot `d6b8dcaf` (2024-08-01); the task set is only on
the Hugging Face Hub: `allenai/WildBench`, config `v2`, split `test` (parquet `v2/test-00000-of-00001.parquet`;
card licence AI2 ImpACT LR), loaded upstream by `load_dataset("allenai/WildBench", "v2", split="test")`
(`src/unified_utils.py`, `src/eval.py`). Abbreviated row:

    {"id": "...", "session_id": "ae006110bb364606",
     "conversation_input": [{"role": "user", "content": "...", "language": "English", "redacted": false,
                             "toxic": false, "timestamp": null}, ...],
     "references": {"gpt-4": "..."}, "length": 1, "checklist": ["Does the response ...?", ...],
     "intent": "...", "primary_tag": "Coding & Debugging", "secondary_tags": ["Reasoning"]}

Local data: the upstream GitHub repository holds no task set (`data_dir/wildbench/` in `../shared/data` has only
judge templates, leaderboard and per-model results), so with `data_dir` the loader reads a local export of the
Hub split in `data_dir/wildbench/`, exactly one of:
- `v2.jsonl`: one Hub row per line, as `load_dataset("allenai/WildBench", "v2", split="test").to_json(...)`
  writes it;
- `v2/test-*.parquet`: the Hub's own parquet file(s), at the Hub path (what `huggingface-cli download
  allenai/WildBench --repo-type dataset --include "v2/*" --local-dir DATA_DIR/wildbench` leaves), shards in name
  order.

Items, in the upstream row order: id `wildbench:<session_id>`; `messages` = the turns of `conversation_input`,
which must alternate user / assistant starting and ending with a user turn (upstream's generation asserts the
last role is `user` and assigns roles by position, `src/unified_infer.py`: for alternating turns the two agree;
anything else is an error here). No system turn: upstream's API engines prepend "You are a helpful AI
assistant.", its HF/vLLM engines use the model's conversation template; we leave that to the policy's template.
`meta` (JSON-ready): `session_id`, `checklist` (list of strings), `primary_tag`, `secondary_tags` (both checked
against `TASK_GROUPS`), `intent` where present, and the judge prompt's inputs as
`src/eval.py:compose_eval_item` builds them: `history` = `"USER: <content>\\n\\n"` / `"ASSISTANT: <content>\\n\\n"`
per earlier turn ("" for a single-turn task) and `user_query` = the last turn's content, both unshortened (the
judge applies upstream's `shorten` to its word limit). The GPT-4 `references` are not kept (WB-Reward compares
against other models' outputs, not them).

Official scoring (`benchmarks/wildbench_score.py`): WB-Score, the checklist judge's 1-10 score per task,
`(mean - 5) * 2`, plus the weighted task-macro over five task groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks import base, metrics
from benchmarks.base import PolicyItem
from benchmarks.scoring import Aggregate, Metric
from benchmarks.wildbench_score import GROUP_WEIGHTS, TASK_GROUPS, TaskScore, task_groups, wb_result
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "allenai/WildBench"
HUB_CONFIG = "v2"
HUB_SPLIT = "test"
FOLDER = "wildbench"
JSONL_FILE = "v2.jsonl"
PARQUET_GLOB = "v2/test-*.parquet"
"""The Hub's parquet path for config `v2` (one shard, `v2/test-00000-of-00001.parquet`, when this was written)."""

_ROLES = ("user", "assistant")
_HUB_HINT = (
    f"the WildBench task set lives only on the Hugging Face Hub ({HUB_ID}, config {HUB_CONFIG!r}, split "
    f"{HUB_SPLIT!r}): put {JSONL_FILE} (one Hub row per line, e.g. load_dataset({HUB_ID!r}, {HUB_CONFIG!r}, "
    f"split={HUB_SPLIT!r}).to_json(...)) or the Hub's {PARQUET_GLOB} there, or load without a data dir"
)


def _strings(value: Any, key: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: field {key!r} must be a list of strings")
    return list(value)


def _tag(tag: Any, key: str, where: str) -> None:
    if tag not in TASK_GROUPS:
        raise ConfigError(
            f"{where}: unknown WildBench task tag {tag!r} in {key!r}; expected one of {', '.join(TASK_GROUPS)}"
        )


def _messages(turns: Any, where: str) -> tuple[Message, ...]:
    if not isinstance(turns, list) or not turns:
        raise ConfigError(
            f"{where}: field 'conversation_input' must be a non-empty list of {{role, content}} turns"
        )
    messages = []
    for i, turn in enumerate(turns):
        expected = _ROLES[i % 2]
        if not isinstance(turn, Mapping) or not isinstance(turn.get("content"), str):
            raise ConfigError(f"{where}: conversation_input[{i}] must be an object with a string 'content'")
        if turn.get("role") != expected:
            raise ConfigError(
                f"{where}: conversation_input[{i}] has role {turn.get('role')!r}, expected {expected!r} (turns "
                "must alternate user / assistant, starting with user)"
            )
        messages.append(Message(expected, turn["content"]))
    if messages[-1].role != "user":
        raise ConfigError(f"{where}: the last turn of 'conversation_input' must be the user's query")
    if not messages[-1].content.strip():
        raise ConfigError(f"{where}: the last user turn (the query) is empty")
    return tuple(messages)


def history_text(messages: Iterable[Message]) -> str:
    """The judge template's `{$history}`: earlier turns as `src/eval.py:compose_eval_item` renders them."""
    return "".join(f"{'USER' if m.role == 'user' else 'ASSISTANT'}: {m.content}\n\n" for m in messages)


def to_item(row: Any, where: str) -> PolicyItem:
    """One Hub row (local line or parquet row) as a policy item."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    session_id = row.get("session_id")
    if not isinstance(session_id, str) or not session_id.strip():
        raise ConfigError(f"{where}: missing or empty 'session_id'")
    where = f"{where} (session_id {session_id})"
    messages = _messages(row.get("conversation_input"), where)
    checklist = _strings(row.get("checklist"), "checklist", where)
    _tag(row.get("primary_tag"), "primary_tag", where)
    secondary = _strings(row.get("secondary_tags"), "secondary_tags", where)
    for tag in secondary:
        _tag(tag, "secondary_tags", where)
    meta: dict[str, Any] = {
        "session_id": session_id,
        "checklist": checklist,
        "primary_tag": row["primary_tag"],
        "secondary_tags": secondary,
        "history": history_text(messages[:-1]),
        "user_query": messages[-1].content,
    }
    if isinstance(row.get("intent"), str):
        meta["intent"] = row["intent"]
    return PolicyItem(f"wildbench:{session_id}", messages, meta)


def _items(rows: Iterable[tuple[str, Any]], *, limit: int | None) -> list[PolicyItem]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    items: list[PolicyItem] = []
    seen: dict[str, str] = {}
    for where, row in islice(rows, limit):
        item = to_item(row, where)
        if item.id in seen:
            raise ConfigError(
                f"{where}: duplicate session_id {item.meta['session_id']!r} (first at {seen[item.id]})"
            )
        seen[item.id] = where
        items.append(item)
    return items


def _parquet_rows(paths: list[Path]) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # a dependency of `datasets`

    for path in paths:
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
            raise ConfigError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
        for index, row in enumerate(rows):
            yield f"{path} row {index}", row


def _local_rows(data_dir: Path) -> Iterator[tuple[str, Any]]:
    try:
        folder = base.data_folder(data_dir, FOLDER, required=[])
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {_HUB_HINT}") from None
    jsonl = folder / JSONL_FILE
    parquet = sorted(folder.glob(PARQUET_GLOB))
    if jsonl.is_file() and parquet:
        raise ConfigError(f"{folder}: both {JSONL_FILE} and {PARQUET_GLOB} are there; keep one task file")
    if jsonl.is_file():
        return read_jsonl(jsonl)
    if parquet:
        return _parquet_rows(parquet)
    raise ConfigError(f"{folder}: no WildBench task file ({JSONL_FILE} or {PARQUET_GLOB}); {_HUB_HINT}")


def _hub_rows() -> Iterator[tuple[str, Any]]:
    rows = base.load_hub(HUB_ID, config=HUB_CONFIG, split=HUB_SPLIT)
    for index, row in enumerate(rows):
        yield f"{HUB_ID}[{HUB_CONFIG}/{HUB_SPLIT}] row {index}", row


# --- metrics over judged records (`judges.policy`: scores = (the 1-10 score,), trace["tags"] the task's tags,
# trace["in_groups"] whether the shown output enters the group scores) ---


def _score(record: Any) -> float | None:
    return record.scores[0] if record.scores else None


def _adjusted(record: Any) -> float:
    """(score - 5) x 2 / 10: the WB-Score contribution as a fraction (x100 prints the leaderboard's x10)."""
    s = _score(record)
    return 0.0 if s is None else (s - 5) * 2 / 10


def _scored_weights(records: Any) -> np.ndarray:
    return np.array([float(_score(r) is not None) for r in records])


def _group_sets(records: Any) -> list[frozenset[str]]:
    """Each record's task groups where it enters the group scores (scored, output shown), else none."""
    return [task_groups(r.trace["tags"]) if _score(r) is not None and r.trace.get("in_groups") else frozenset()
            for r in records]


def _macro_weights(records: Any) -> np.ndarray:
    """Per task: the sum over its groups of the group's weight / the group's task count, so the weighted mean
    is the task-macro score over the groups present (each group's mean weighted by `GROUP_WEIGHTS`)."""
    sets = _group_sets(records)
    counts: dict[str, int] = {}
    for groups in sets:
        for g in groups:
            counts[g] = counts.get(g, 0) + 1
    return np.array([sum(GROUP_WEIGHTS[g] / counts[g] for g in groups) for groups in sets])


def _task_macro(records: Any) -> Aggregate:
    """Upstream's task-macro score (`benchmarks.wildbench_score.wb_result`): a group without a counted task adds 0, so
    the value is the weighted mean's times the present groups' share of the weights; the interval likewise."""
    tasks = [TaskScore(_score(r), tuple(r.trace["tags"]), "x" if r.trace.get("in_groups") else "")
             for r in records]
    found = wb_result(tasks)
    present = {g for groups in _group_sets(records) for g in groups}
    share = sum(GROUP_WEIGHTS[g] for g in present) / sum(GROUP_WEIGHTS.values())
    lo, hi = metrics.bootstrap_ci([_adjusted(r) for r in records], weights=_macro_weights(records))
    details = {"task_categorized_scores": found.task_categorized_scores, "group_n": found.group_n,
               "n_scored": found.n_scored, "n_failed": found.n_failed}
    return Aggregate(found.task_macro_score / 10, (lo * share, hi * share), details)


_FAILED = "; a failed judgment is left out and counted in n_failed; empty outputs score 1 as upstream"
WB_SCORE = Metric(
    "score", "WB-Score",
    "WB-Score: (mean 1-10 checklist score - 5) x 2, printed x10 as the leaderboard" + _FAILED,
    _adjusted, lambda r: False, binary=False, weights=_scored_weights, failed=lambda r: _score(r) is None,
)
WB_TASK_MACRO = Metric(
    "task_macro", "task-macro",
    "WB-Score task-macro: the five task groups' WB-Scores weighted 0.5 (Creative), 1.25 (Planning & "
    "Reasoning), 1.0 (Math & Data), 0.75 (Info/Advice), 1.25 (Coding) over the sum of the weights (a group "
    "without tasks adds 0), printed x10" + _FAILED,
    _adjusted, lambda r: False, binary=False, weights=_macro_weights, failed=lambda r: _score(r) is None,
    aggregate=_task_macro,
)


class WildBench:
    """WildBench v2 tasks: the conversation to continue, the judge's checklist and the task tags."""

    name = "wildbench"
    display = "WildBench"
    metrics = (WB_SCORE, WB_TASK_MACRO)
    kind: Literal["policy"] = "policy"

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        meta = {"session_id": str(item.meta.get("session_id", item.id)), "primary_tag": str(item.meta["primary_tag"])}
        return meta, {"tags": [item.meta["primary_tag"], *item.meta["secondary_tags"]]}

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PolicyItem]:
        """The tasks in the upstream row order; `limit` keeps the first N; `seed` is unused (no randomisation)."""
        rows = _local_rows(Path(data_dir)) if data_dir is not None else _hub_rows()
        return _items(rows, limit=limit)


WILDBENCH = WildBench()
