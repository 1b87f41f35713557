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

Official scoring (`judges/wildbench.py`): WB-Score, the checklist judge's 1-10 score per task, `(mean - 5) * 2`,
plus the weighted task-macro over five task groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from benchmarks import base
from benchmarks.base import PolicyItem
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_jsonl
from harness.registry import register

TASK_GROUPS: Mapping[str, str] = {
    "Information seeking": "Information/Advice seeking",
    "Creative Writing": "Creative Tasks",
    "Coding & Debugging": "Coding & Debugging",
    "Reasoning": "Planning & Reasoning",
    "Editing": "Creative Tasks",
    "Math": "Math & Data Analysis",
    "Planning": "Planning & Reasoning",
    "Brainstorming": "Creative Tasks",
    "Role playing": "Creative Tasks",
    "Advice seeking": "Information/Advice seeking",
    "Data Analysis": "Math & Data Analysis",
    "Others": "Creative Tasks",
}
"""Task tag -> group (`leaderboard/data_dir/_create_tables.py`, `task_group_new`)."""

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


class WildBench:
    """WildBench v2 tasks: the conversation to continue, the judge's checklist and the task tags."""

    name = "wildbench"
    display = "WildBench"
    metrics = ()
    kind: Literal["policy"] = "policy"

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[PolicyItem]:
        """The tasks in the upstream row order; `limit` keeps the first N; `seed` is unused (no randomisation)."""
        rows = _local_rows(Path(data_dir)) if data_dir is not None else _hub_rows()
        return _items(rows, limit=limit)


WILDBENCH = register("benchmark", "wildbench")(WildBench())
