"""AlpacaEval 2 and Arena-Hard v2.0 loaders: real files, the baseline join, malformed input, Hub paths."""

import json
import logging
from pathlib import Path

import pytest

import benchmarks.alpaca_eval2 as alpaca
import benchmarks.arena_hard as arena
from benchmarks.alpaca_eval2 import ALPACA_EVAL2
from benchmarks.arena_hard import ARENA_HARD_V2, load_arena_hard
from benchmarks.base import PolicyBenchmark, PolicyItem
from harness.backends.base import Message
from harness.commands.prompts import benchmark_prompts
from harness.generation import PromptRecord
from harness.errors import ConfigError
from harness.registry import lookup

O3 = "o3-mini-2025-01-31"
GEMINI = "gemini-2.0-flash-001"


def _jsonl(path: Path) -> list[dict]:
    # split on "\n" only: str.splitlines() also breaks at U+2028 and friends, which some prompts hold
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


@pytest.fixture(scope="module")
def alpaca_raw(shared_data: Path) -> list[dict]:
    return json.loads((shared_data / alpaca.FOLDER / alpaca.FILENAME).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def alpaca_items(shared_data: Path) -> list[PolicyItem]:
    return ALPACA_EVAL2.load(data_dir=shared_data)


@pytest.fixture(scope="module")
def questions(shared_data: Path) -> list[dict]:
    return _jsonl(shared_data / arena.FOLDER / arena.QUESTIONS)


@pytest.fixture(scope="module")
def o3_answers(shared_data: Path) -> list[dict]:
    return _jsonl(shared_data / arena.FOLDER / arena.ANSWERS / f"{O3}.jsonl")


@pytest.fixture(scope="module")
def arena_load(shared_data: Path) -> arena.ArenaHardLoad:
    return load_arena_hard(data_dir=shared_data, missing_baseline="skip")


def _arena_dir(tmp_path: Path, questions: list, answers: dict[str, list] | None = None) -> Path:
    """A `data_dir` with `arena_hard_v2/question.jsonl` and `model_answer/<model>.jsonl` (str/dict lines)."""
    folder = tmp_path / arena.FOLDER
    (folder / arena.ANSWERS).mkdir(parents=True)

    def write(path: Path, lines: list) -> None:
        text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
        path.write_text(text, encoding="utf-8")

    write(folder / arena.QUESTIONS, questions)
    for model, lines in (answers or {}).items():
        write(folder / arena.ANSWERS / f"{model}.jsonl", lines)
    return tmp_path


def test_registered():
    for name, obj, display, metrics in [
        ("alpaca_eval2", ALPACA_EVAL2, "AlpacaEval 2", ["lc_win_rate", "win_rate", "discrete_win_rate"]),
        ("arena_hard_v2", ARENA_HARD_V2, "Arena-Hard v2.0", ["hard_prompt", "creative_writing"]),
    ]:
        assert lookup("benchmark", name) is obj and isinstance(obj, PolicyBenchmark)
        assert (obj.name, obj.display, obj.kind) == (name, display, "policy")
        assert [m.name for m in obj.metrics] == metrics


# AlpacaEval 2


def test_alpaca_counts_and_ids(alpaca_items, shared_data: Path):
    assert len(alpaca_items) == 805
    ids = [i.id for i in alpaca_items]
    assert (
        len(set(ids)) == 805
        and ids[:2] == ["alpaca_eval:0000", "alpaca_eval:0001"]
        and ids[-1] == "alpaca_eval:0804"
    )
    assert [i.meta["index"] for i in alpaca_items] == list(range(805))
    assert ALPACA_EVAL2.load(data_dir=shared_data) == alpaca_items  # stable across loads
    datasets = {}
    for item in alpaca_items:
        datasets[item.meta["dataset"]] = datasets.get(item.meta["dataset"], 0) + 1
    assert datasets == {"selfinstruct": 252, "oasst": 188, "koala": 156, "helpful_base": 129, "vicuna": 80}


def test_alpaca_item_fields(alpaca_items, alpaca_raw):
    first, raw = alpaca_items[0], alpaca_raw[0]
    assert first.messages == (Message("user", raw["instruction"]),)
    assert first.meta == {
        "index": 0,
        "instruction": raw["instruction"],
        "reference": raw["output"],
        "reference_generator": "gpt4_1106_preview",
        "dataset": raw["dataset"],
    }
    assert raw["instruction"].startswith("What are the names of some famous actors")
    assert all(
        i.meta["instruction"] == r["instruction"] for i, r in zip(alpaca_items, alpaca_raw, strict=True)
    )
    json.dumps(first.meta)  # JSON-ready


def test_alpaca_limit(alpaca_items, shared_data: Path):
    assert ALPACA_EVAL2.load(data_dir=shared_data, limit=3) == alpaca_items[:3]
    assert ALPACA_EVAL2.load(data_dir=shared_data, limit=0) == []
    with pytest.raises(ConfigError, match="limit must be >= 0"):
        ALPACA_EVAL2.load(data_dir=shared_data, limit=-1)


def _alpaca_dir(tmp_path: Path, text: str) -> tuple[Path, Path]:
    (tmp_path / alpaca.FOLDER).mkdir(parents=True)
    path = tmp_path / alpaca.FOLDER / alpaca.FILENAME
    path.write_text(text, encoding="utf-8")
    return tmp_path, path


def test_alpaca_malformed(tmp_path: Path, alpaca_raw):
    with pytest.raises(ConfigError, match=rf"not found: {tmp_path / alpaca.FOLDER}"):
        ALPACA_EVAL2.load(data_dir=tmp_path)
    (tmp_path / alpaca.FOLDER).mkdir()
    with pytest.raises(ConfigError, match=rf"{tmp_path / alpaca.FOLDER}: missing {alpaca.FILENAME}"):
        ALPACA_EVAL2.load(data_dir=tmp_path)
    text = json.dumps(alpaca_raw[:3], indent=1)
    lines = text.splitlines()
    data_dir, path = _alpaca_dir(tmp_path / "truncated", "\n".join(lines[:7]) + '\n  "output": "cut')
    with pytest.raises(ConfigError, match=rf"{path}:8: invalid JSON"):
        ALPACA_EVAL2.load(data_dir=data_dir)
    data_dir, path = _alpaca_dir(tmp_path / "short", json.dumps(alpaca_raw[:804]))
    with pytest.raises(ConfigError, match=rf"{path}: expected 805 AlpacaEval instructions, found 804"):
        ALPACA_EVAL2.load(data_dir=data_dir)
    assert len(ALPACA_EVAL2.load(data_dir=data_dir, limit=5)) == 5  # a limited load does not need all 805
    repeated = [
        *alpaca_raw[:10],
        {**alpaca_raw[10], "instruction": alpaca_raw[3]["instruction"]},
        *alpaca_raw[11:],
    ]
    data_dir, path = _alpaca_dir(tmp_path / "dup", json.dumps(repeated))
    with pytest.raises(ConfigError, match=r"1 instruction\(s\) repeated .*at records \[3, 10\]"):
        ALPACA_EVAL2.load(data_dir=data_dir)
    broken = [*alpaca_raw[:2], {k: v for k, v in alpaca_raw[2].items() if k != "output"}, *alpaca_raw[3:]]
    data_dir, path = _alpaca_dir(tmp_path / "field", json.dumps(broken))
    with pytest.raises(ConfigError, match=rf"{path}: record 2: missing field\(s\) output"):
        ALPACA_EVAL2.load(data_dir=data_dir)
    data_dir, path = _alpaca_dir(tmp_path / "object", json.dumps({"instruction": "x"}))
    with pytest.raises(ConfigError, match=rf"{path}: expected a JSON array"):
        ALPACA_EVAL2.load(data_dir=data_dir)


def test_alpaca_hub_path(monkeypatch: pytest.MonkeyPatch, alpaca_raw, alpaca_items):
    import datasets

    calls = []

    def fake_load_dataset(path, *args, **kwargs):
        calls.append((path, args, kwargs))
        return alpaca_raw

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert ALPACA_EVAL2.load() == alpaca_items
    expected = "hf://datasets/tatsu-lab/alpaca_eval/alpaca_eval_gpt4_baseline.json"
    assert calls == [("json", (), {"data_files": expected, "split": "train"})]
    assert ALPACA_EVAL2.load(limit=2) == alpaca_items[:2]

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError, match=r"cannot load hf://datasets/tatsu-lab/alpaca_eval/.*--data-dir"):
        ALPACA_EVAL2.load()


def test_generate_gets_alpaca_prompts(shared_data: Path, alpaca_raw):
    records = benchmark_prompts("alpaca_eval2", data_dir=shared_data, limit=3)
    assert records == [
        PromptRecord(f"alpaca_eval:{i:04d}", (Message("user", alpaca_raw[i]["instruction"]),))
        for i in range(3)
    ]


# Arena-Hard v2.0


def test_arena_counts(arena_load, questions, caplog: pytest.LogCaptureFixture, shared_data: Path):
    assert len(questions) == 750
    assert len(arena_load.items) == 500 and arena_load.n_skipped == 250
    assert {i.meta["category"] for i in arena_load.items} == {"hard_prompt"}
    assert {i.meta["baseline"] for i in arena_load.items} == {O3}
    creative = [q["uid"] for q in questions if q["category"] == "creative_writing"]
    assert list(arena_load.skipped) == [GEMINI] and list(arena_load.skipped[GEMINI]) == creative
    with caplog.at_level(logging.WARNING, logger="benchmarks.arena_hard"):
        items = ARENA_HARD_V2.load(data_dir=shared_data, missing_baseline="skip")
    assert items == list(arena_load.items)
    assert "skipped 250 question(s)" in caplog.text and f"{GEMINI}.jsonl" in caplog.text


def test_arena_missing_baseline_is_an_error_by_default(shared_data: Path):
    missing = shared_data / arena.FOLDER / arena.ANSWERS / f"{GEMINI}.jsonl"
    with pytest.raises(
        ConfigError, match=rf"{missing}: file not found: .*'creative_writing'.*question.jsonl:501"
    ):
        ARENA_HARD_V2.load(data_dir=shared_data)
    with pytest.raises(ConfigError, match="missing_baseline must be"):
        ARENA_HARD_V2.load(data_dir=shared_data, missing_baseline="drop")


def test_arena_ids_and_order(arena_load, questions):
    ids = [i.id for i in arena_load.items]
    assert len(set(ids)) == 500
    assert ids == [f"arena_hard_v2:{q['uid']}" for q in questions if q["category"] == "hard_prompt"]
    assert ids[0] == "arena_hard_v2:2edbb5f36f5b42be"


def test_arena_item_fields(arena_load, questions, o3_answers):
    item, question = arena_load.items[0], questions[0]
    answer = next(a for a in o3_answers if a["uid"] == question["uid"])
    assert item.messages == (Message("user", question["prompt"]),)
    assert item.meta == {
        "uid": "2edbb5f36f5b42be",
        "category": "hard_prompt",
        "subcategory": "coding",
        "baseline": O3,
        "baseline_answer": answer["messages"][-1]["content"]["answer"],
        "baseline_metadata": answer["metadata"],
    }
    assert item.meta["baseline_metadata"]["token_len"] == 1131
    assert item.meta["baseline_answer"].startswith("Below is one acceptable Zig solution")
    subcategories = {}
    for i in arena_load.items:
        subcategories[i.meta["subcategory"]] = subcategories.get(i.meta["subcategory"], 0) + 1
    assert subcategories == {"coding": 253, "math": 247}
    json.dumps(item.meta)  # JSON-ready


def test_arena_limit(arena_load, shared_data: Path):
    # The first questions are hard_prompt: a limited load needs no creative-writing baseline.
    assert ARENA_HARD_V2.load(data_dir=shared_data, limit=5) == list(arena_load.items[:5])
    with pytest.raises(ConfigError, match="limit must be >= 0"):
        ARENA_HARD_V2.load(data_dir=shared_data, limit=-1)


def test_arena_judge_settings_override(tmp_path: Path, questions, o3_answers):
    # A copy whose judge_settings.json maps every category to o3-mini: all 750 join.
    data_dir = _arena_dir(tmp_path, questions, {O3: o3_answers})
    (tmp_path / arena.FOLDER / "judge_config").mkdir()
    settings = {c: {"baseline": O3} for c in ("hard_prompt", "creative_writing")}
    (tmp_path / arena.FOLDER / arena.SETTINGS).write_text(json.dumps(settings), encoding="utf-8")
    items = ARENA_HARD_V2.load(data_dir=data_dir)
    assert len(items) == 750 and {i.meta["baseline"] for i in items} == {O3}
    (tmp_path / arena.FOLDER / arena.SETTINGS).write_text(json.dumps({"hard_prompt": O3}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"judge_settings.json: expected \{category"):
        ARENA_HARD_V2.load(data_dir=data_dir)
    (tmp_path / arena.FOLDER / arena.SETTINGS).write_text(json.dumps({"hard_prompt": {"baseline": O3}}))
    with pytest.raises(ConfigError, match=r"question.jsonl:501: category 'creative_writing' has no baseline"):
        ARENA_HARD_V2.load(data_dir=data_dir)


def test_arena_malformed(tmp_path: Path, questions, o3_answers):
    qs = questions[:3]
    by_uid = {a["uid"]: a for a in o3_answers}
    answers = [by_uid[q["uid"]] for q in qs]
    with pytest.raises(ConfigError, match=rf"not found: {tmp_path / arena.FOLDER}"):
        ARENA_HARD_V2.load(data_dir=tmp_path)
    (tmp_path / arena.FOLDER).mkdir()
    with pytest.raises(ConfigError, match=rf"{tmp_path / arena.FOLDER}: missing question.jsonl"):
        ARENA_HARD_V2.load(data_dir=tmp_path)

    def load(name: str, qlines: list, alines: list) -> list[PolicyItem]:
        return ARENA_HARD_V2.load(data_dir=_arena_dir(tmp_path / name, qlines, {O3: alines}))

    assert [i.id for i in load("ok", qs, answers)] == [f"arena_hard_v2:{q['uid']}" for q in qs]
    truncated = [qs[0], qs[1], json.dumps(qs[2])[:50]]
    with pytest.raises(ConfigError, match=rf"{arena.FOLDER}/question.jsonl:3: invalid JSON"):
        load("truncated", truncated, answers)
    with pytest.raises(ConfigError, match=rf"{O3}.jsonl:2: invalid JSON"):
        load("truncated_answer", qs, [answers[0], json.dumps(answers[1])[:80], answers[2]])
    with pytest.raises(ConfigError, match=r"question.jsonl:3: duplicate uid .*first at .*question.jsonl:1"):
        load("dup", [qs[0], qs[1], qs[0]], answers)
    with pytest.raises(ConfigError, match=r"question.jsonl:2: field 'prompt' must be a non-empty string"):
        load("noprompt", [qs[0], {**qs[1], "prompt": ""}], answers)
    plain = {**answers[1], "messages": [answers[1]["messages"][0], {"role": "assistant", "content": "text"}]}
    with pytest.raises(ConfigError, match=rf"{O3}.jsonl:2: the last of 'messages' must be an assistant turn"):
        load("plain", qs, [answers[0], plain, answers[2]])
    with pytest.raises(ConfigError, match=rf"{O3}.jsonl:4: duplicate answer for uid"):
        load("dupanswer", qs, [*answers, answers[0]])
    # A baseline file that lacks one question's answer: an error naming the file and uid, or skipped.
    data_dir = _arena_dir(tmp_path / "gap", qs, {O3: [answers[0], answers[2]]})
    with pytest.raises(
        ConfigError, match=rf"{O3}.jsonl: no answer for uid '{qs[1]['uid']}'.*question.jsonl:2"
    ):
        ARENA_HARD_V2.load(data_dir=data_dir)
    result = load_arena_hard(data_dir=data_dir, missing_baseline="skip")
    assert [i.meta["uid"] for i in result.items] == [qs[0]["uid"], qs[2]["uid"]]
    assert result.skipped == {O3: (qs[1]["uid"],)} and result.n_skipped == 1
    no_metadata = {k: v for k, v in answers[0].items() if k != "metadata"}
    assert load("nometa", qs[:1], [no_metadata])[0].meta["baseline_metadata"] is None


def test_arena_hub_path(monkeypatch: pytest.MonkeyPatch, shared_data: Path, arena_load):
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    calls = []
    local = shared_data / arena.FOLDER

    def fake_download(*, repo_id, filename, repo_type, **kwargs):
        calls.append((repo_id, filename, repo_type))
        path = local / filename.removeprefix("data/arena-hard-v2.0/")
        if not path.is_file():
            raise EntryNotFoundError(f"{filename} not in {repo_id}")
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    result = load_arena_hard(missing_baseline="skip")
    assert result == arena_load
    assert calls == [
        ("lmarena-ai/arena-hard-auto", "data/arena-hard-v2.0/question.jsonl", "dataset"),
        ("lmarena-ai/arena-hard-auto", f"data/arena-hard-v2.0/model_answer/{O3}.jsonl", "dataset"),
        ("lmarena-ai/arena-hard-auto", f"data/arena-hard-v2.0/model_answer/{GEMINI}.jsonl", "dataset"),
    ]
    with pytest.raises(
        ConfigError, match=rf"lmarena-ai/arena-hard-auto:data/arena-hard-v2.0/model_answer/{GEMINI}"
    ):
        ARENA_HARD_V2.load()
    assert ARENA_HARD_V2.load(limit=2) == list(arena_load.items[:2])

    def offline(*, repo_id, filename, repo_type, **kwargs):
        raise LocalEntryNotFoundError("offline and not in the cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(
        ConfigError, match=r"cannot download data/arena-hard-v2.0/question.jsonl .*--data-dir"
    ):
        ARENA_HARD_V2.load(missing_baseline="skip")  # offline is never "absent upstream"
