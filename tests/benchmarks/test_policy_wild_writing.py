"""WildBench and WritingBench policy loaders: local files, the Hub/remote call, and malformed input."""

import json
from pathlib import Path

import pytest

import benchmarks.base
import benchmarks.wildbench as wb
import benchmarks.writingbench as wr
from benchmarks.base import PolicyBenchmark
from harness.backends.base import Message
from harness.commands.prompts import benchmark_prompts
from harness.generation import PromptRecord
from harness.errors import ConfigError
from harness.registry import lookup


def _turn(role: str, content: str) -> dict:
    return {
        "role": role,
        "content": content,
        "language": "English",
        "redacted": False,
        "toxic": False,
        "timestamp": None,
    }


# Three tasks in the Hub's `v2` row layout (written for this test; not WildBench data).
TASKS = [
    {
        "id": "3f1e0c9a7b2d4e58",
        "session_id": "3f1e0c9a7b2d4e58",
        "conversation_input": [
            _turn(
                "user",
                "Write a Python function that merges two sorted lists into one sorted list "
                "without calling sort() or sorted().",
            )
        ],
        "references": {"gpt-4": "def merge(a, b):\n    out, i, j = [], 0, 0\n    ..."},
        "length": 1,
        "checklist": [
            "Does the function avoid sort() and sorted()?",
            "Does it handle empty input lists?",
            "Is the merge linear in the total length?",
        ],
        "intent": "The user wants a linear-time merge of two sorted lists in Python.",
        "primary_tag": "Coding & Debugging",
        "secondary_tags": ["Reasoning"],
    },
    {
        "id": "b7c2a19e04f36d81",
        "session_id": "b7c2a19e04f36d81",
        "conversation_input": [
            _turn("user", "Write a short poem about autumn in Kyoto."),
            _turn("assistant", "Crimson maples lean\nover the temple's stone path,\nbells fade into mist."),
            _turn("user", "Turn it into a sequence of three haiku and keep the temple imagery."),
        ],
        "references": {"gpt-4": "I.\nCrimson maples lean ..."},
        "length": 3,
        "checklist": [
            "Are there exactly three haiku?",
            "Does each haiku follow a 5-7-5 syllable pattern?",
            "Is the temple imagery from the first poem kept?",
        ],
        "intent": "The user wants the earlier poem rewritten as three haiku.",
        "primary_tag": "Creative Writing",
        "secondary_tags": ["Editing"],
    },
    {
        "id": "0d94e6b1c8a2f357",
        "session_id": "0d94e6b1c8a2f357",
        "conversation_input": [
            _turn("user", "A train leaves at 9:40 and travels 210 km at 84 km/h. When does it arrive?")
        ],
        "references": {"gpt-4": "210 / 84 = 2.5 hours, so it arrives at 12:10."},
        "length": 1,
        "checklist": ["Is the travel time 2.5 hours?", "Is the arrival time 12:10?"],
        "intent": "The user wants an arrival time from distance and speed.",
        "primary_tag": "Math",
        "secondary_tags": [],
    },
]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def wild_dir(tmp_path: Path) -> Path:
    _write_jsonl(tmp_path / "wildbench" / wb.JSONL_FILE, TASKS)
    return tmp_path


# --- WildBench -----------------------------------------------------------------------------------------------


def test_wildbench_registered():
    bench = lookup("benchmark", "wildbench")
    assert bench is wb.WILDBENCH and isinstance(bench, PolicyBenchmark)
    assert (bench.kind, bench.display, [m.name for m in bench.metrics]) == ("policy", "WildBench", ["score", "task_macro"])


def test_wildbench_local_jsonl(wild_dir: Path):
    items = wb.WILDBENCH.load(data_dir=wild_dir)
    assert [i.id for i in items] == [f"wildbench:{t['session_id']}" for t in TASKS]
    single, multi, math = items
    assert single.messages == (Message("user", TASKS[0]["conversation_input"][0]["content"]),)
    assert multi.messages == tuple(Message(t["role"], t["content"]) for t in TASKS[1]["conversation_input"])
    assert [m.role for m in multi.messages] == ["user", "assistant", "user"]
    assert single.meta == {
        "session_id": "3f1e0c9a7b2d4e58",
        "checklist": TASKS[0]["checklist"],
        "primary_tag": "Coding & Debugging",
        "secondary_tags": ["Reasoning"],
        "history": "",
        "user_query": TASKS[0]["conversation_input"][0]["content"],
        "intent": TASKS[0]["intent"],
    }
    # src/eval.py:compose_eval_item: earlier turns as "USER: ...\n\n" / "ASSISTANT: ...\n\n", then the query
    turns = TASKS[1]["conversation_input"]
    assert multi.meta["history"] == f"USER: {turns[0]['content']}\n\nASSISTANT: {turns[1]['content']}\n\n"
    assert multi.meta["user_query"] == turns[2]["content"]
    assert math.meta["secondary_tags"] == [] and math.meta["checklist"] == TASKS[2]["checklist"]
    json.dumps([dict(i.meta) for i in items])  # JSON-ready
    assert wb.WILDBENCH.load(data_dir=wild_dir, limit=2) == items[:2]
    assert wb.WILDBENCH.load(data_dir=wild_dir, limit=0) == []


def test_wildbench_local_parquet_as_the_hub_serves_it(tmp_path: Path, wild_dir: Path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "pq" / "wildbench" / "v2" / "test-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(TASKS), path)
    assert wb.WILDBENCH.load(data_dir=tmp_path / "pq") == wb.WILDBENCH.load(data_dir=wild_dir)


def test_wildbench_folder_without_task_set(shared_data: Path, tmp_path: Path):
    # the shared folder has judge templates, leaderboard and results, but no tasks
    with pytest.raises(ConfigError, match=r"no WildBench task file .*only on the Hugging Face Hub") as exc:
        wb.WILDBENCH.load(data_dir=shared_data)
    message = str(exc.value)
    assert "allenai/WildBench" in message and "'v2'" in message and "v2.jsonl" in message
    with pytest.raises(ConfigError, match=r"data folder not found.*allenai/WildBench"):
        wb.WILDBENCH.load(data_dir=tmp_path)


def test_wildbench_two_task_files_are_ambiguous(wild_dir: Path):
    (wild_dir / "wildbench" / "v2").mkdir()
    (wild_dir / "wildbench" / "v2" / "test-00000-of-00001.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="keep one task file"):
        wb.WILDBENCH.load(data_dir=wild_dir)
    (wild_dir / "wildbench" / wb.JSONL_FILE).unlink()
    with pytest.raises(ConfigError, match=r"test-00000-of-00001.parquet: not a readable parquet file"):
        wb.WILDBENCH.load(data_dir=wild_dir)


def test_wildbench_hub_call(monkeypatch):
    calls = []

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, config, split))
        return TASKS

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    items = wb.WILDBENCH.load(limit=2)
    assert calls == [("allenai/WildBench", "v2", "test")]
    assert [i.id for i in items] == ["wildbench:3f1e0c9a7b2d4e58", "wildbench:b7c2a19e04f36d81"]


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"primary_tag": "Poetry"}, r"unknown WildBench task tag 'Poetry' in 'primary_tag'"),
        (
            {"secondary_tags": ["Math", "Chit-chat"]},
            r"unknown WildBench task tag 'Chit-chat' in 'secondary_tags'",
        ),
        ({"secondary_tags": "Math"}, r"'secondary_tags' must be a list of strings"),
        ({"checklist": ["ok", 3]}, r"'checklist' must be a list of strings"),
        ({"session_id": ""}, r"missing or empty 'session_id'"),
        ({"conversation_input": []}, r"non-empty list"),
        ({"conversation_input": [_turn("user", "a"), _turn("assistant", "b")]}, r"last turn .* user's query"),
        (
            {"conversation_input": [_turn("user", "a"), _turn("user", "b")]},
            r"\[1\] has role 'user', expected",
        ),
        ({"conversation_input": [_turn("user", "  ")]}, r"query\) is empty"),
    ],
)
def test_wildbench_malformed_task(tmp_path: Path, change: dict, pattern: str):
    path = _write_jsonl(tmp_path / "wildbench" / wb.JSONL_FILE, [TASKS[0], {**TASKS[2], **change}])
    with pytest.raises(ConfigError, match=pattern) as exc:
        wb.WILDBENCH.load(data_dir=tmp_path)
    assert str(exc.value).startswith(f"{path}:2")


def test_wildbench_unknown_tags_listed_and_bad_lines(tmp_path: Path):
    path = _write_jsonl(tmp_path / "wildbench" / wb.JSONL_FILE, [{**TASKS[0], "primary_tag": "Poetry"}])
    with pytest.raises(ConfigError, match="expected one of Information seeking, Creative Writing"):
        wb.WILDBENCH.load(data_dir=tmp_path)
    path.write_text(json.dumps(TASKS[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}:2: invalid JSON"):
        wb.WILDBENCH.load(data_dir=tmp_path)
    _write_jsonl(path, [TASKS[0], TASKS[1], TASKS[0]])
    with pytest.raises(ConfigError, match=rf"^{path}:3: duplicate session_id '3f1e0c9a7b2d4e58'"):
        wb.WILDBENCH.load(data_dir=tmp_path)
    with pytest.raises(ConfigError, match="limit must be >= 0"):
        wb.WILDBENCH.load(data_dir=tmp_path, limit=-1)


# --- WritingBench --------------------------------------------------------------------------------------------


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def length_items(shared_data: Path):
    return wr.WRITINGBENCH.load(data_dir=shared_data, subset="length")


def test_writingbench_registered():
    bench = lookup("benchmark", "writingbench")
    assert bench is wr.WRITINGBENCH and isinstance(bench, PolicyBenchmark)
    assert (bench.kind, bench.display, [m.name for m in bench.metrics]) == ("policy", "WritingBench", ["overall"])


def test_writingbench_v2_length_subset(length_items, shared_data: Path):
    raw = _raw(shared_data / "writingbench" / "v2_current" / "length_subset.jsonl")
    assert len(length_items) == 222 and len({i.id for i in length_items}) == 222
    assert length_items[0].id == "writingbench:16"
    assert all(len(i.meta["criteria"]) == 5 for i in length_items)
    for row, item in zip(raw, length_items, strict=True):
        assert item.id == f"writingbench:{row['index']}"
        assert item.messages == (Message("user", row["query"]),)
        assert item.meta == {
            "index": row["index"],
            "domain1": row["domain1"],
            "domain2": row["domain2"],
            "criteria": row["checklist"],
            "version": "v2",
            "subset": "length",
        }
    assert list(length_items[0].meta["criteria"][0]) == list(wr.CRITERION_KEYS)


def test_writingbench_category_subset(length_items, shared_data: Path):
    c_items = wr.WRITINGBENCH.load(data_dir=shared_data, subset="length_C")
    assert [i.id for i in c_items] == [i.id for i in length_items]  # same queries, same ids
    counts = [len(i.meta["criteria"]) for i in c_items]
    assert (counts.count(1), counts.count(2), len(counts)) == (218, 4, 222)
    for c_item, item in zip(c_items, length_items, strict=True):
        assert c_item.messages == item.messages and c_item.meta["subset"] == "length_C"
        assert all(c in item.meta["criteria"] for c in c_item.meta["criteria"])


def test_writingbench_v1_criteria_field(shared_data: Path):
    folder = shared_data / "writingbench" / "v1_2025-03-10"
    style = wr.WRITINGBENCH.load(data_dir=shared_data, subset="style", version="v1")
    raw = _raw(folder / "style_subset.jsonl")
    assert len(style) == 395 and style[0].id == f"writingbench:v1:{raw[0]['index']}"
    assert style[0].meta["criteria"] == raw[0]["criteria"] and style[0].meta["version"] == "v1"
    assert len(wr.WRITINGBENCH.load(data_dir=shared_data, subset="format", version="v1", limit=5)) == 5


def test_writingbench_default_needs_the_full_file(shared_data: Path, tmp_path: Path):
    with pytest.raises(ConfigError) as exc:
        wr.WRITINGBENCH.load(data_dir=shared_data)
    message = str(exc.value)
    assert "v2_current/benchmark_all.jsonl not found" in message
    assert "files there: length_subset.jsonl, length_subset_C.jsonl" in message
    assert "subset= 'length' or 'length_C'" in message
    assert "raw.githubusercontent.com/X-PLUG/WritingBench/7a30aa4" in message
    with pytest.raises(
        ConfigError,
        match=r"length_subset_C.jsonl not found .*format_subset.jsonl.*subset= 'style' or 'format' or 'length'$",
    ):
        wr.WRITINGBENCH.load(data_dir=shared_data, subset="length_C", version="v1")  # v1 _C files not local
    with pytest.raises(ConfigError, match=r"not found .*no .jsonl files in"):
        wr.WRITINGBENCH.load(data_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"unknown WritingBench subset 'size'; valid: style, style_C"):
        wr.WRITINGBENCH.load(data_dir=shared_data, subset="size")
    with pytest.raises(ConfigError, match="unknown WritingBench version 'v3'"):
        wr.WRITINGBENCH.load(data_dir=shared_data, version="v3")


def _full_dir(tmp_path: Path, shared_data: Path) -> Path:
    """A data dir whose `benchmark_all.jsonl` is the real v2 length subset (same record layout)."""
    folder = tmp_path / "writingbench" / "v2_current"
    folder.mkdir(parents=True)
    (folder / wr.FULL_FILE).symlink_to(shared_data / "writingbench" / "v2_current" / "length_subset.jsonl")
    return tmp_path


def test_writingbench_full_file_and_limit(tmp_path: Path, shared_data: Path, length_items):
    data_dir = _full_dir(tmp_path, shared_data)
    items = wr.WRITINGBENCH.load(data_dir=data_dir, limit=3)
    assert [i.id for i in items] == [i.id for i in length_items[:3]]
    assert all(i.meta["subset"] == "all" for i in items)
    assert [i.messages for i in items] == [i.messages for i in length_items[:3]]
    assert wr.WRITINGBENCH.load(data_dir=data_dir, limit=0) == []
    with pytest.raises(ConfigError, match="limit must be >= 0"):
        wr.WRITINGBENCH.load(data_dir=data_dir, limit=-2)


def test_writingbench_benchmark_prompts(tmp_path: Path, shared_data: Path, length_items):
    records = benchmark_prompts("writingbench", data_dir=_full_dir(tmp_path, shared_data), limit=3)
    assert len(records) == 3 and all(isinstance(r, PromptRecord) for r in records)
    raw = _raw(shared_data / "writingbench" / "v2_current" / "length_subset.jsonl")[:3]
    assert [(r.id, r.messages) for r in records] == [
        (f"writingbench:{row['index']}", (Message("user", row["query"]),)) for row in raw
    ]


def _record(**change) -> dict:
    criterion = {
        "name": "Clarity",
        "criteria_description": "How clear the text is.",
        "1-2": "Unclear.",
        "3-4": "Often unclear.",
        "5-6": "Mostly clear.",
        "7-8": "Clear.",
        "9-10": "Very clear.",
    }
    row = {
        "index": 7,
        "domain1": "Education",
        "domain2": "Lesson Plans",
        "query": "Write a lesson plan.",
        "checklist": [criterion],
    }
    return {**row, **change}


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("{broken", r"invalid JSON"),
        (json.dumps([1, 2]), r"expected a JSON object, got list"),
        (json.dumps(_record(index="7")), r"'index' must be an integer"),
        (json.dumps(_record(query="")), r"'query' must be a non-empty string"),
        (json.dumps(_record(domain2=None)), r"'domain2' must be a string"),
        (json.dumps(_record(checklist=[])), r"'checklist' must be a non-empty list"),
        (
            json.dumps(_record(checklist=[{"name": "Clarity"}])),
            r"checklist\[0\] must be an object with string",
        ),
        (json.dumps(_record(criteria=_record()["checklist"])), r"found \['checklist', 'criteria'\]"),
        (json.dumps({k: v for k, v in _record().items() if k != "checklist"}), r"found none"),
        (json.dumps(_record(checklist=_record()["checklist"] * 2)), r"duplicate criterion name 'Clarity'"),
        (json.dumps(_record(index=1)), r"duplicate index 1 \(first at .*:1\)"),
    ],
)
def test_writingbench_malformed_line(tmp_path: Path, line: str, pattern: str):
    path = tmp_path / "writingbench" / "v2_current" / "length_subset.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_record(index=1)) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=pattern) as exc:
        wr.WRITINGBENCH.load(data_dir=tmp_path, subset="length")
    assert str(exc.value).startswith(f"{path}:2")


def test_writingbench_v1_schema_and_lang(tmp_path: Path):
    criteria = _record()["checklist"]
    row = {k: v for k, v in _record(criteria=criteria, lang="en").items() if k != "checklist"}
    _write_jsonl(tmp_path / "writingbench" / "v1_2025-03-10" / wr.FULL_FILE, [row])
    (item,) = wr.WRITINGBENCH.load(data_dir=tmp_path, version="v1")
    assert item.id == "writingbench:v1:7"
    assert item.meta["criteria"] == criteria and item.meta["lang"] == "en" and item.meta["subset"] == "all"


def test_writingbench_remote_call(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(path, *args, **kwargs):
        calls.append((path, args, kwargs))
        return [_record(index=3), _record(index=4, lang="zh")]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    items = wr.WRITINGBENCH.load()
    base_url = "https://raw.githubusercontent.com/X-PLUG/WritingBench/"
    assert calls == [
        (
            "json",
            (),
            {
                "data_files": f"{base_url}{wr.VERSIONS['v2'].commit}/benchmark_query/benchmark_all.jsonl",
                "split": "train",
            },
        )
    ]
    assert [i.id for i in items] == ["writingbench:3", "writingbench:4"] and items[1].meta["lang"] == "zh"
    wr.WRITINGBENCH.load(subset="length_C", version="v1", limit=1)
    assert calls[-1][2]["data_files"] == (
        f"{base_url}cf2827a321d842d7182f0dcfe3c60356a10372d4/benchmark_query/requirement/length/length_subset_C.jsonl"
    )

    def failing(*args, **kwargs):
        raise ConnectionError("offline mode is enabled")

    monkeypatch.setattr(datasets, "load_dataset", failing)
    with pytest.raises(
        ConfigError, match=r"cannot load https://raw.*: offline mode is enabled; offline, pass"
    ):
        wr.WRITINGBENCH.load()
