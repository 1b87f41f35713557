"""CodeScope: the tasks of its eight that an exact match scores, code smell and code review's `diff_tag`.

Upstream: GitHub `WeixiangYAN/CodeScope` (MIT; ACL 2024, arXiv 2311.08588), one JSON-lines file per task; on the
Hub `WeixiangYan/CodeScope` (no configs: the files sit at the repo root, read one at a time with
`data_files=<task>_data.jsonl`, split `train`). Local (`data_dir/codescope/`): the same files.

Which tasks: code smell (200 C# and Java snippets, five labels) and code review's classification sub-task (the
change needs a review comment, 1, or not, 0) have one gold label, which a policy's answer matches or not. Program
synthesis, translation, repair and optimisation are judged by running the programs on the tests (upstream's
ExecEval sandbox, 14 languages' compilers); summarisation and review comments by text-overlap metrics against one
reference; automated testing by coverage. None of those is an exact match, so they are not here.

    task    file                        fields read                                       gold
    smell   code_smell_data.jsonl       id, lang_cluster, source_code, smell_code         smell
    review  code_review_data.jsonl      id, lang_cluster, source_code, diff_hunk          diff_tag (0 / 1)

`tasks` (a loader option: `--bench-option codescope.tasks=smell`): `auto` (the default) loads code smell, and code
review where its file is there (on the Hub it is; the GitHub folder never held it: 4 MB, kept out of git), or a
comma-separated list of `smell`, `review` (a listed task without its file is an error).

Prompts: as upstream's inference scripts build them (`run_gpt.py`, temperature 0), in our words: the expert's
instruction with the labels as a list, the language, the snippet (smell) or the diff hunk (review), the whole
source file, and "answer with the label alone". The labels are upstream's. Items: ids `codescope:smell:<id>`,
`codescope:review:<id>`; `meta`: `task`, `gold` (a smell label, or "0" / "1"), `lang_cluster`.

Scoring (`judges.codescope`): upstream's label extraction (the label named earliest in the answer; none is wrong,
counted in n_failed as an unextracted answer) and exact match. Accuracy is over all loaded items; per task and per
(task, language) in the details. (Upstream's tables also print weighted precision, recall and F1 over length
buckets; exact-match accuracy is what Figure 3 reads.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from benchmarks import base
from benchmarks.base import PolicyItem
from benchmarks.scoring import checked_accuracy, checked_right
from harness.backends.base import Message
from harness.errors import ConfigError
from harness.jsonl import read_jsonl

HUB_ID = "WeixiangYan/CodeScope"
FOLDER = "codescope"
TASKS = ("smell", "review")
FILES = {"smell": "code_smell_data.jsonl", "review": "code_review_data.jsonl"}
SMELLS = ("large class", "long method", "data class", "blob", "feature envy")
"""Upstream's labels, in the order its extraction tries them (the earliest named in the answer wins; ties cannot
happen: no label is another's prefix)."""
DIFF_TAGS = ("0", "1")
N_SMELL = 200

SMELL_PROMPT = """You are an experienced software engineer. Read the code snippet below, taken from the source file \
that follows it, and say which one of these code smells it has:
- large class
- data class
- blob
- feature envy
- long method
Details:
1. Programming language: {lang}
2. The snippet:
```
{snippet}
```
3. The source file that contains it:
```
{source}
```
Answer with one of the categories above and nothing else."""

REVIEW_PROMPT = """You are an experienced code reviewer. Read the code change below and say which of these describes \
its quality:
- 0: good, the change needs no review comment.
- 1: poor, the change needs a review comment.
Details:
1. Programming language: {lang}
2. The code before the change:
```
{source}
```
3. The diff hunk:
```
{diff}
```
Answer with the number alone: 0 or 1."""


def _text(row: Mapping[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: field {name!r} must be a non-empty string")
    return value


def to_item(task: str, row: Any, where: str) -> PolicyItem:
    """One upstream record of `task` as a policy item."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    gold_field = "smell" if task == "smell" else "diff_tag"
    missing = [f for f in ("id", "lang_cluster", "source_code", gold_field) if f not in row]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
    lang, source = _text(row, "lang_cluster", where), _text(row, "source_code", where).lstrip("\ufeff").strip()
    if task == "smell":
        gold = row["smell"]
        if gold not in SMELLS:
            raise ConfigError(f"{where}: smell {gold!r} is not one of {', '.join(SMELLS)}")
        prompt = SMELL_PROMPT.format(lang=lang, snippet=_text(row, "smell_code", where).strip(), source=source)
    else:
        gold = str(row["diff_tag"])
        if gold not in DIFF_TAGS:
            raise ConfigError(f"{where}: diff_tag {row['diff_tag']!r} is not 0 or 1")
        prompt = REVIEW_PROMPT.format(lang=lang, source=source, diff=_text(row, "diff_hunk", where).strip())
    meta = {"task": task, "gold": gold, "lang_cluster": lang}
    return PolicyItem(f"codescope:{task}:{row['id']}", (Message("user", prompt),), meta)


def parse_tasks(tasks: str | Sequence[str]) -> tuple[str, ...] | None:
    """The tasks asked (None: `auto`).

    Raises:
        ConfigError: for an unknown task name or an empty list.
    """
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    if names == ["auto"]:
        return None
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ConfigError(f"codescope tasks: unknown {', '.join(unknown) or '(none given)'}; valid: auto or a "
                          f"comma-separated list of {', '.join(TASKS)}")
    return tuple(dict.fromkeys(names))


def _items(task: str, rows: Iterable[tuple[str, Any]], *, limit: int | None) -> list[PolicyItem]:
    items, seen = [], set()
    for where, row in rows:
        if limit is not None and len(items) >= limit:
            break
        item = to_item(task, row, where)
        if item.id in seen:
            raise ConfigError(f"{where}: duplicate id {row['id']!r}")
        seen.add(item.id)
        items.append(item)
    if task == "smell" and limit is None and len(items) != N_SMELL:
        raise ConfigError(f"expected {N_SMELL} CodeScope code smell records, found {len(items)}")
    return items


def _breakdown(records: Sequence[Any]) -> dict[str, Any]:
    per_task: dict[str, list[float]] = {}
    per_lang: dict[str, list[float]] = {}
    for r in records:
        task = r.meta.get("task", "?")
        per_task.setdefault(task, []).append(checked_right(r))
        per_lang.setdefault(f"{task}/{r.meta.get('lang_cluster', '?')}", []).append(checked_right(r))
    return {"per_task": {k: sum(v) / len(v) for k, v in sorted(per_task.items())},
            "per_task_n": {k: len(v) for k, v in sorted(per_task.items())},
            "per_task_language": {k: sum(v) / len(v) for k, v in sorted(per_lang.items())}}


ACCURACY = checked_accuracy(
    "share of answers whose label (upstream's extraction: the label named earliest) is the gold one, over code "
    "smell and code review's diff_tag; an answer naming no label is wrong, counted in n_failed",
    details=_breakdown,
)


class CodeScope:
    """CodeScope's exact-match tasks: code smell and code review's diff_tag, by upstream's label extraction."""

    name = "codescope"
    display = "CodeScope"
    metrics = (ACCURACY,)
    kind: Literal["policy"] = "policy"

    def record_fields(self, item: PolicyItem) -> tuple[dict[str, str], dict[str, Any]]:
        """What every record of `item` carries, judged or not (`judges.policy`): the meta the metrics group by
        and the trace fields they read beside the scores."""
        return {"task": str(item.meta["task"]), "lang_cluster": str(item.meta.get("lang_cluster", ""))}, {}

    def load(self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0,
             tasks: str = "auto") -> list[PolicyItem]:
        """Each task's records in file order, tasks in `TASKS` order; `limit` keeps the first N of each task;
        `seed` is unused.

        Raises:
            ConfigError: for missing files, malformed records or an unknown task.
        """
        if limit is not None and limit < 0:
            raise ConfigError(f"limit must be >= 0, got {limit}")
        asked = parse_tasks(tasks)
        items: list[PolicyItem] = []
        if data_dir is not None:
            folder = base.data_folder(Path(data_dir), FOLDER, required=[FILES["smell"]] if asked is None else
                                      [FILES[t] for t in asked])
            for task in asked or [t for t in TASKS if (folder / FILES[t]).is_file()]:
                items += _items(task, read_jsonl(folder / FILES[task]), limit=limit)
            return items
        for task in asked or TASKS:
            url = f"hf://datasets/{HUB_ID}/{FILES[task]}"
            rows = base.load_json_file(url)
            items += _items(task, ((f"{url} row {i}", row) for i, row in enumerate(rows)), limit=limit)
        return items


CODESCOPE = CodeScope()
