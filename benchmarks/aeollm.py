"""AEOLLM (NTCIR-18 Automatic Evaluation of LLMs): rank the answers of 7 LLMs to one question as humans did.

Upstream: Hugging Face dataset `THUIR/AEOLLM` (CSV files; card licence `mit`), task site `aeollm.github.io`,
leaderboard and evaluation code in the Hugging Face Space `THUIR/AEOLLM`, overview paper arXiv 2503.13038
(THUIR, Tsinghua). Four subtasks, 100 questions each, every question answered by 7 LLMs:

| file suffix | subtask                          | source       |
|-------------|----------------------------------|--------------|
| `dialog`    | Dialogue Generation              | DailyDialog  |
| `story`     | Text Expansion                   | WritingPrompts |
| `Xsum`      | Summary Generation               | XSum         |
| `NFCATS`    | Non-Factoid Question Answering   | NF_CATS      |

Split: only `train_<suffix>.csv` carries human annotations (the `test_*` and historical `final_rank_*` files
do not), so this benchmark is the train split: `load_dataset("THUIR/AEOLLM", split="train")` = the four train
files concatenated, 560 rows = 4 subtasks x 20 questions (inferred) x 7 answers, i.e. 80 listwise items.

Data (`data_dir/aeollm/`): the four files `train_dialog.csv`, `train_story.csv`, `train_Xsum.csv`,
`train_NFCATS.csv` as on the Hub, read in that order. One row per answer. **Assumed columns** (the CSV header
was not visible offline; each is looked up under the names listed in `COLUMNS`, first match wins, and a
missing one is an error naming the file and the columns found): `taskId`, `questionId`, `answerId` (these
three are the official submission key), the question text, the answer text, and the human score (higher =
better) or, failing a score column, a human rank (1 = best). Abbreviated record (shape only; no real row was
visible offline):

    taskId,questionId,answerId,question,answer,score
    1,0,0,"<question or dialogue context>","<one LLM's answer>",4

Items: the rows of one (`taskId`, `questionId`) form one item (id `aeollm:<taskId>:<questionId>`), responses
in `answerId` order (an empty answer cell is an empty response), prompt = the question text (identical on all
its rows, checked). Gold ranks: competition ranking ("1224") of the human scores, higher score = better rank,
so equal scores are gold ties; a rank column (used only without a score column) is re-ranked the same way.
`meta`: `task_id`, `question_id`, `answer_ids`, `gold_scores` (comma-joined; `gold_ranks` when read from a
rank column), and `subtask` (the file suffix; local files only: the Hub split does not say which file a row
came from). Where several answers share the best human score, `gold_ranks` holds several 1s: how top-1
accuracy treats a tied gold best is the metric's rule.

Official scoring (Space `baseline_example/eval.py`): per question, over the answer pairs with different human
scores, 1 if the evaluator orders them the same way, 0.5 if it gives them equal scores, 0 otherwise; Acc = sum
/ #pairs (1 if all human scores tie); also |Kendall tau| and |Spearman rho| between human and evaluator scores
(NaN -> 0); per-question values averaged (inferred). The paper's Table 1 reports AEOLLM Acc. and nDCG, which
we compute with the listwise metrics (`benchmarks.metrics`): strict top-1 accuracy and nDCG with rel = K - rank.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from benchmarks import base, scoring
from benchmarks.base import ListwiseItem
from harness.errors import ConfigError
from harness.jsonl import read_text

HUB_ID = "THUIR/AEOLLM"
HUB_SPLIT = "train"
FOLDER = "aeollm"
SUBTASKS = ("dialog", "story", "Xsum", "NFCATS")
"""File suffixes of the four subtasks, in load order."""
COLUMNS = {
    "task_id": ("taskId",),
    "question_id": ("questionId",),
    "answer_id": ("answerId",),
    "question": ("question", "query", "prompt", "input", "context"),
    "answer": ("answer", "response", "output"),
    "score": ("score", "human_score", "humanScore", "annotation"),
    "rank": ("rank", "human_rank"),
}
"""Our field -> accepted upstream column names (assumed; the real header was not visible offline)."""


def competition_ranks(values: Sequence[float], *, higher_is_better: bool = True) -> tuple[int, ...]:
    """Standard competition ranks ("1224"): 1 + the number of strictly better values; ties share a rank."""
    better = (lambda a, b: a > b) if higher_is_better else (lambda a, b: a < b)
    return tuple(1 + sum(better(other, v) for other in values) for v in values)


def _column(row: Mapping[str, Any], field: str) -> str | None:
    return next((name for name in COLUMNS[field] if name in row), None)


def _number(value: Any, what: str, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number) or isinstance(value, bool):
        raise ConfigError(
            f"{where}: no numeric human {what} ({value!r}); only the train_*.csv files carry annotations"
        )
    return number


def _answer(row: Any, where: str) -> tuple[tuple[str, str], str, str, str, float, bool]:
    """(item key, answer id, question, answer, gold value, value is a score) of one CSV row."""
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a row of named columns, got {type(row).__name__}")
    names = {f: _column(row, f) for f in COLUMNS}
    required = ("task_id", "question_id", "answer_id", "question", "answer")
    missing = [f"{f} ({' / '.join(COLUMNS[f])})" for f in required if names[f] is None]
    if names["score"] is None and names["rank"] is None:
        missing.append(
            f"a human score ({' / '.join(COLUMNS['score'])}) or rank ({' / '.join(COLUMNS['rank'])})"
        )
    if missing:
        raise ConfigError(
            f"{where}: missing column(s) {'; '.join(missing)}; columns found: {', '.join(map(str, row))}"
        )
    ids = []
    for field in ("task_id", "question_id", "answer_id"):
        value = row[names[field]]
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # `datasets` reads an id column holding an empty cell as floats
        if value is None or str(value).strip() == "":
            raise ConfigError(f"{where}: empty {names[field]!r}")
        ids.append(str(value).strip())
    texts = []
    for field in ("question", "answer"):
        value = row[names[field]]
        if field == "answer" and (value is None or (isinstance(value, float) and math.isnan(value))):
            value = ""  # an empty answer cell (`datasets` gives None or NaN): an empty response, kept
        if not isinstance(value, str) or (field == "question" and not value.strip()):
            raise ConfigError(
                f"{where}: column {names[field]!r} must be a{' non-empty' * (field == 'question')} string"
            )
        texts.append(value)
    is_score = names["score"] is not None
    gold = _number(row[names["score" if is_score else "rank"]], "score" if is_score else "rank", where)
    return (ids[0], ids[1]), ids[2], texts[0], texts[1], gold, is_score


def _sort_key(answer_id: str) -> tuple[int, int | str]:
    return (0, int(answer_id)) if answer_id.isdigit() else (1, answer_id)


def _items(rows: Iterable[tuple[str, str, Any]], *, limit: int | None) -> list[ListwiseItem]:
    """Group answer rows (location, subtask or "", row) into one item per question, in first-seen order."""
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for where, subtask, row in rows:
        key, answer_id, question, answer, gold, is_score = _answer(row, where)
        group = groups.setdefault(
            key, {"where": where, "subtask": subtask, "question": question, "answers": {}}
        )
        if group["subtask"] != subtask:
            raise ConfigError(f"{where}: question {key} also appears in train_{group['subtask']}.csv")
        if question != group["question"]:
            raise ConfigError(
                f"{where}: question text of {key} differs from its first row ({group['where']})"
            )
        if answer_id in group["answers"]:
            raise ConfigError(f"{where}: duplicate answerId {answer_id} for question {key}")
        group["answers"][answer_id] = (answer, gold, is_score)
    items = []
    for (task_id, question_id), group in list(groups.items())[:limit]:
        ids = sorted(group["answers"], key=_sort_key)
        if len(ids) < 2:
            raise ConfigError(f"{group['where']}: question {(task_id, question_id)} has fewer than 2 answers")
        answers = [group["answers"][i] for i in ids]
        golds = [gold for _, gold, _ in answers]
        meta = {
            "task_id": task_id,
            "question_id": question_id,
            "answer_ids": ",".join(ids),
            f"gold_{'scores' if answers[0][2] else 'ranks'}": ",".join(f"{g:g}" for g in golds),
        }
        if group["subtask"]:
            meta["subtask"] = group["subtask"]
        ranks = competition_ranks(golds, higher_is_better=answers[0][2])
        items.append(
            ListwiseItem(
                f"aeollm:{task_id}:{question_id}",
                group["question"],
                tuple(a for a, _, _ in answers),
                ranks,
                meta,
            )
        )
    return items


def _local_rows(data_dir: Path) -> Iterator[tuple[str, str, Any]]:
    required = [f"{HUB_SPLIT}_{s}.csv" for s in SUBTASKS]
    try:
        folder = base.data_folder(data_dir, FOLDER, required=required)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}; the data is on the Hugging Face Hub ({HUB_ID}, files {', '.join(required)})"
        ) from None
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # long stories and dialogues
    for subtask, name in zip(SUBTASKS, required):
        path = folder / name
        text = read_text(path).removeprefix("\ufeff")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            for row in reader:
                yield f"{path}:{reader.line_num}", subtask, row
        except csv.Error as exc:
            raise ConfigError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from None


def _hub_rows() -> Iterator[tuple[str, str, Any]]:
    for index, row in enumerate(base.load_hub(HUB_ID, split=HUB_SPLIT)):
        yield f"{HUB_ID}[{HUB_SPLIT}] row {index}", "", row


class AEOLLM:
    """AEOLLM train questions: 7 LLM answers each, gold ranks from the human scores (ties kept)."""

    name = "aeollm"
    display = "AEOLLM"
    metrics = scoring.LISTWISE
    kind: Literal["listwise"] = "listwise"

    def load(
        self, *, data_dir: Path | None = None, limit: int | None = None, seed: int = 0
    ) -> list[ListwiseItem]:
        """One item per question, in file and first-row order; `seed` is unused (upstream order kept)."""
        rows = _local_rows(Path(data_dir)) if data_dir is not None else _hub_rows()
        return _items(rows, limit=limit)


AEOLLM_BENCHMARK = AEOLLM()
