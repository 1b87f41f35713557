"""CodeScope: the loader on the local code smell file (and a code review file written here), upstream's label
extraction on answers written here (traps included), and the checker."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import pytest

from benchmarks.base import PolicyItem
from benchmarks.codescope import SMELLS, CodeScope
from harness.errors import ConfigError
from judges.codescope import CodeScopeChecker, extract_label

SMELL_ANSWERS = [
    ("large class", "large class"),
    ("Large Class", "large class"),  # upstream lowercases the answer
    ("**Feature Envy**", "feature envy"),
    ("This is a data class, not a blob.", "data class"),  # the earliest named label wins
    ("Not a long method; it is a blob.", "long method"),  # ... even when negated, as upstream reads it
    ("blob", "blob"),
    ("The smell: long  method", None),  # two spaces: no label
    ("long-method", None),
    ("LargeClass", None),
    ("", None),
    ("It is a god class.", None),  # a synonym upstream does not read
    ("feature envy, then large class", "feature envy"),
    ("Category: Data Class.", "data class"),
    ("The class is large class-like... long method too", "large class"),
]
REVIEW_ANSWERS = [
    ("1", "1"),
    ("0", "0"),
    ("The answer is 1.", "1"),
    ("0: good quality", "0"),
    ("It needs a comment (1), not 0", "1"),  # the earliest digit wins
    ("10 lines changed; 0", "1"),  # characters, not numbers: '1' of '10' comes first
    ("no", None),
    ("", None),
    ("one", None),
]


def _upstream(task: str, text: str) -> str | None:
    """The inference scripts' loop written out again here, as a second reading of each row."""
    labels = ["large class", "long method", "data class", "blob", "feature envy"] if task == "smell" else ["0", "1"]
    haystack = text.lower() if task == "smell" else text
    label, best = None, float("inf")
    for candidate in labels:
        index = haystack.find(candidate)
        if index != -1 and index < best:
            best, label = index, candidate
    return label


@pytest.mark.parametrize("text, label", SMELL_ANSWERS)
def test_smell_extraction(text: str, label: str | None):
    assert extract_label("smell", text) == label == _upstream("smell", text)


@pytest.mark.parametrize("text, label", REVIEW_ANSWERS)
def test_review_extraction(text: str, label: str | None):
    assert extract_label("review", text) == label == _upstream("review", text)


def test_the_local_code_smell_file(shared_data: Path):
    folder = shared_data / "codescope"
    rows = [json.loads(line) for line in (folder / "code_smell_data.jsonl").read_text(encoding="utf-8").splitlines()]
    items = CodeScope().load(data_dir=shared_data)  # auto: no code review file here, so code smell alone
    assert len(items) == 200 and len({i.id for i in items}) == 200
    assert collections.Counter(i.meta["gold"] for i in items) == {"long method": 75, "large class": 50,
                                                                  "data class": 25, "blob": 25, "feature envy": 25}
    first, row = items[0], rows[0]
    assert first.id == "codescope:smell:1" and first.meta == {"task": "smell", "gold": "large class",
                                                              "lang_cluster": "C#"}
    prompt = first.messages[0].content
    assert row["smell_code"].strip() in prompt and row["source_code"].lstrip("\ufeff").strip() in prompt
    assert "\ufeff" not in prompt and "1. Programming language: C#\n" in prompt
    assert all(f"- {label}\n" in prompt for label in SMELLS)
    assert CodeScope().load(data_dir=shared_data, limit=3) == items[:3]
    with pytest.raises(ConfigError, match="code_review_data.jsonl"):
        CodeScope().load(data_dir=shared_data, tasks="review")
    with pytest.raises(ConfigError, match="unknown bugs"):
        CodeScope().load(data_dir=shared_data, tasks="smell,bugs")


def test_code_review_when_its_file_is_there(tmp_path: Path, shared_data: Path):
    folder = tmp_path / "codescope"
    folder.mkdir()
    (folder / "code_smell_data.jsonl").write_bytes((shared_data / "codescope" / "code_smell_data.jsonl").read_bytes())
    review = [{"id": n, "lang_cluster": "Python", "source_code": "def f(x):\n    return x\n",
               "diff_hunk": "@@ -1,2 +1,2 @@\n-    return x\n+    return x + 1", "diff_tag": n % 2,
               "review_comment": "why +1?"} for n in (1, 2, 3)]
    (folder / "code_review_data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in review))
    items = CodeScope().load(data_dir=tmp_path, limit=2)
    assert [i.id for i in items] == ["codescope:smell:1", "codescope:smell:2", "codescope:review:1",
                                     "codescope:review:2"]
    assert [i.meta["gold"] for i in items[2:]] == ["1", "0"]
    assert "+    return x + 1" in items[2].messages[0].content
    assert [i.id for i in CodeScope().load(data_dir=tmp_path, tasks="review")] == [f"codescope:review:{n}"
                                                                                  for n in (1, 2, 3)]
    (folder / "code_review_data.jsonl").write_text(json.dumps({**review[0], "diff_tag": 5}) + "\n")
    with pytest.raises(ConfigError, match=r"code_review_data.jsonl:1: diff_tag 5 is not 0 or 1"):
        CodeScope().load(data_dir=tmp_path, tasks="review")


def test_the_checker_counts_answers_without_a_label():
    smell = PolicyItem("codescope:smell:1", (), {"task": "smell", "gold": "blob", "lang_cluster": "Java"})
    review = PolicyItem("codescope:review:1", (), {"task": "review", "gold": "0", "lang_cluster": "Go"})
    got = asyncio.run(CodeScopeChecker().judge_all(
        [(smell, "Blob."), (smell, "a data class"), (smell, "no idea"), (review, "0"), (review, "1")], seed=0))
    assert [(j.correct, j.label) for j in got] == [(True, "blob"), (False, "data class"), (False, None),
                                                   (True, "0"), (False, "1")]
