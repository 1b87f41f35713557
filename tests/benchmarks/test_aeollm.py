"""AEOLLM loader: competition ranks from human scores, rows grouped by question, malformed CSV, Hub path.

No AEOLLM file exists offline, so the CSV fixtures are synthetic and use only the columns the loader documents
as assumed: taskId, questionId, answerId, question, answer, score (or rank).
"""

import csv
from pathlib import Path

import pytest

import benchmarks.base
from benchmarks.aeollm import AEOLLM_BENCHMARK, HUB_ID, SUBTASKS, competition_ranks
from harness.errors import ConfigError
from harness.registry import lookup

HEADER = ["taskId", "questionId", "answerId", "question", "answer", "score"]
SCORES = [3, 5, 1, 5, 2, 4, 3]
"""Human scores of answers 0..6: two ties (5, 5) and (3, 3)."""
RANKS = (4, 1, 7, 1, 6, 3, 4)
"""Their competition ranks ("1224"), worked by hand: 5, 5 -> 1; 4 -> 3; 3, 3 -> 4; 2 -> 6; 1 -> 7."""


def _rows(task: int, question: int, scores=SCORES, *, order=(4, 0, 6, 2, 1, 5, 3)) -> list[list]:
    """One question's answer rows, written in a shuffled answerId order."""
    return [
        [
            task,
            question,
            a,
            f"task {task} question {question}",
            f"answer {a}, of {task}/{question}",
            scores[a],
        ]
        for a in order
    ]


def _write(path: Path, rows: list[list], header=HEADER) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


def _folder(tmp_path: Path, **override: list[list]) -> Path:
    folder = tmp_path / "aeollm"
    folder.mkdir()
    for task, subtask in enumerate(SUBTASKS, start=1):
        _write(folder / f"train_{subtask}.csv", override.get(subtask, _rows(task, 0) + _rows(task, 1)))
    return tmp_path


def test_registered():
    assert lookup("benchmark", "aeollm") is AEOLLM_BENCHMARK and AEOLLM_BENCHMARK.kind == "listwise"


def test_competition_ranks():
    assert competition_ranks([5, 3, 5, 1]) == (1, 3, 1, 4)
    assert competition_ranks(SCORES) == RANKS
    assert competition_ranks([2, 2, 2]) == (1, 1, 1)
    assert competition_ranks([1, 2, 2, 3], higher_is_better=False) == (1, 2, 2, 4)
    assert competition_ranks([]) == ()


def test_local_files_grouped_ranked_and_ordered(tmp_path: Path):
    items = AEOLLM_BENCHMARK.load(data_dir=_folder(tmp_path))
    assert [i.id for i in items] == [f"aeollm:{t}:{q}" for t in (1, 2, 3, 4) for q in (0, 1)]
    assert [i.meta["subtask"] for i in items] == [s for s in SUBTASKS for _ in range(2)]
    first = items[0]
    assert first.prompt == "task 1 question 0"
    assert first.responses == tuple(f"answer {a}, of 1/0" for a in range(7))  # answerId order, not file order
    assert first.gold_ranks == RANKS  # ties share a rank; 1 = best
    assert first.meta == {
        "task_id": "1",
        "question_id": "0",
        "answer_ids": "0,1,2,3,4,5,6",
        "gold_scores": "3,5,1,5,2,4,3",
        "subtask": "dialog",
    }
    assert AEOLLM_BENCHMARK.load(data_dir=tmp_path, limit=3) == items[:3]
    assert AEOLLM_BENCHMARK.load(data_dir=tmp_path, limit=0) == []


def test_quoted_multiline_text_and_non_contiguous_rows(tmp_path: Path):
    rows = _rows(1, 0) + _rows(1, 1)
    rows[0][4] = 'He said "hi",\nthen left.'  # answer 4 of question 0
    rows.insert(3, rows.pop(10))  # a row of question 1 between rows of question 0
    items = AEOLLM_BENCHMARK.load(data_dir=_folder(tmp_path, dialog=rows))
    assert [i.id for i in items[:2]] == ["aeollm:1:0", "aeollm:1:1"]
    assert items[0].responses[4] == 'He said "hi",\nthen left.'
    assert all(len(i.responses) == 7 for i in items)


def test_rank_column_when_no_score(tmp_path: Path):
    header = [*HEADER[:5], "rank"]
    rows = _rows(1, 0, [1, 2, 2, 3, 4, 5, 6], order=range(7))  # the last column now holds a dense human rank
    folder = Path(_folder(tmp_path)) / "aeollm"
    _write(folder / "train_dialog.csv", rows, header)
    item = AEOLLM_BENCHMARK.load(data_dir=tmp_path)[0]
    assert item.gold_ranks == (1, 2, 2, 4, 5, 6, 7)
    assert item.meta["gold_ranks"] == "1,2,2,3,4,5,6"


def _broken(rows: list[list], line: int, column: int, value) -> list[list]:
    rows = [list(r) for r in rows]
    rows[line - 2][column] = value  # line 1 is the header
    return rows


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            _broken(_rows(2, 0), 3, 5, ""),
            r"train_story.csv:3: no numeric human score .*only the train_\*.csv",
        ),
        (_broken(_rows(2, 0), 4, 5, "good"), r"train_story.csv:4: no numeric human score \('good'\)"),
        (_broken(_rows(2, 0), 5, 2, 4), r"train_story.csv:5: duplicate answerId 4 for question \('2', '0'\)"),
        (_broken(_rows(2, 0), 6, 3, "other"), r"train_story.csv:6: question text of \('2', '0'\) differs"),
        (_broken(_rows(2, 0), 2, 1, ""), r"train_story.csv:2: empty 'questionId'"),
        (_rows(2, 0)[:1], r"train_story.csv:2: question \('2', '0'\) has fewer than 2 answers"),
        (_rows(1, 0), r"train_story.csv:2: question \('1', '0'\) also appears in train_dialog.csv"),
    ],
)
def test_malformed_names_file_and_line(tmp_path: Path, rows: list[list], message: str):
    with pytest.raises(ConfigError, match=message):
        AEOLLM_BENCHMARK.load(data_dir=_folder(tmp_path, story=rows))


def test_missing_columns_listed(tmp_path: Path):
    folder = Path(_folder(tmp_path)) / "aeollm"
    _write(folder / "train_Xsum.csv", [row[:5] for row in _rows(3, 0)], HEADER[:5])
    with pytest.raises(
        ConfigError, match=r"train_Xsum.csv:2: missing column\(s\) a human score .*columns found: taskId"
    ):
        AEOLLM_BENCHMARK.load(data_dir=tmp_path)
    _write(
        folder / "train_Xsum.csv",
        [[r[0], r[1], r[2], r[4], r[5]] for r in _rows(3, 0)],
        ["taskId", "qid", "answerId", "answer", "score"],
    )
    with pytest.raises(
        ConfigError, match=r"missing column\(s\) question_id \(questionId\); question \(question /"
    ):
        AEOLLM_BENCHMARK.load(data_dir=tmp_path)


def test_missing_files_name_them_and_the_hub(tmp_path: Path, shared_data: Path):
    data_dir = _folder(tmp_path)
    (data_dir / "aeollm" / "train_NFCATS.csv").unlink()
    with pytest.raises(
        ConfigError, match=rf"missing train_NFCATS.csv; the data is on the Hugging Face Hub \({HUB_ID}"
    ):
        AEOLLM_BENCHMARK.load(data_dir=data_dir)
    # The reference folder documents AEOLLM but holds none of its files.
    with pytest.raises(ConfigError, match=rf"missing train_dialog.csv, train_story.csv, .*{HUB_ID}"):
        AEOLLM_BENCHMARK.load(data_dir=shared_data)


def test_hub_path(monkeypatch: pytest.MonkeyPatch):
    calls = []
    rows = [dict(zip(HEADER, r)) for r in _rows(1, 0) + _rows(4, 7)]
    rows.insert(2, rows.pop(-1))  # `datasets` gives ints; rows of one question need not be adjacent

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, split, config))
        return rows

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    items = AEOLLM_BENCHMARK.load()
    assert calls == [(HUB_ID, "train", None)]
    assert [i.id for i in items] == ["aeollm:1:0", "aeollm:4:7"]
    assert items[1].gold_ranks == RANKS and items[1].responses[0] == "answer 0, of 4/7"
    assert "subtask" not in items[0].meta
    assert AEOLLM_BENCHMARK.load(limit=1) == items[:1]
    rows[0] = {**rows[0], "answer": None, "questionId": 0.0}  # an empty answer cell; a float-typed id column
    assert AEOLLM_BENCHMARK.load()[0].responses[4] == "" and AEOLLM_BENCHMARK.load()[0].id == "aeollm:1:0"
    rows[5]["score"] = float("nan")  # what `datasets` gives for an empty CSV cell
    with pytest.raises(ConfigError, match=rf"{HUB_ID}\[train\] row 5: no numeric human score"):
        AEOLLM_BENCHMARK.load()
