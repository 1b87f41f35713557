"""JudgeBench loader: the real files in `shared_data`, malformed input, and the Hugging Face path."""

import json
from collections import Counter
from pathlib import Path

import pytest

import benchmarks.base
from benchmarks.judgebench import FILES, JUDGEBENCH, JUDGEBENCH_CLAUDE, JudgeBench
from harness.errors import ConfigError
from harness.registry import lookup

GPT_FILE = "judgebench_gpt-4o-2024-05-13.jsonl"


def _raw(shared_data: Path, name: str) -> list[dict]:
    return [
        json.loads(line)
        for line in (shared_data / "judgebench" / name).read_text().splitlines()
        if line.strip()
    ]


def test_registered():
    assert lookup("benchmark", "judgebench") is JUDGEBENCH and JUDGEBENCH.split == "gpt"
    assert (
        lookup("benchmark", "judgebench_claude") is JUDGEBENCH_CLAUDE and JUDGEBENCH_CLAUDE.split == "claude"
    )
    assert JUDGEBENCH.kind == "pairwise" and isinstance(JUDGEBENCH, benchmarks.base.Benchmark)


def test_gpt_counts_and_labels(shared_data: Path):
    items = JUDGEBENCH.load(data_dir=shared_data)
    assert len(items) == 350 and len({i.id for i in items}) == 350
    assert Counter(i.meta["original_label"] for i in items) == {"A>B": 193, "B>A": 157}
    assert Counter(i.preferred for i in items) == {0: 193, 1: 157}  # stored order kept: 55% at position 0
    assert Counter(i.meta["category"] for i in items) == {
        "Knowledge": 154,
        "Reasoning": 98,
        "Math": 56,
        "Coding": 42,
    }
    assert sum(i.meta["original_id"] == "" for i in items) == 196


def test_claude_counts(shared_data: Path):
    items = JUDGEBENCH_CLAUDE.load(data_dir=shared_data)
    assert len(items) == 270 and len({i.id for i in items}) == 270
    assert Counter(i.preferred for i in items) == {0: 143, 1: 127}
    assert Counter(i.meta["category"] for i in items) == {
        "Knowledge": 154,
        "Reasoning": 51,
        "Math": 34,
        "Coding": 31,
    }
    assert {i.meta["response_model"] for i in items} == {"claude-3-5-sonnet-20240620"}


def test_first_record_mapped(shared_data: Path):
    raw = _raw(shared_data, GPT_FILE)
    item = JUDGEBENCH.load(data_dir=shared_data)[0]
    first = raw[0]
    assert item.id == first["pair_id"] == item.meta["pair_id"]
    assert item.prompt == first["question"]
    assert item.responses == (first["response_A"], first["response_B"])
    assert item.preferred == (0 if first["label"] == "A>B" else 1)
    assert item.meta["source"] == first["source"] and item.meta["original_label"] == first["label"]
    assert item.meta["original_id"] == str(first["original_id"])
    # Every item agrees with its raw line on the label, in the stored order.
    for row, it in zip(raw, JUDGEBENCH.load(data_dir=shared_data), strict=True):
        assert it.responses[it.preferred] == row["response_A" if row["label"] == "A>B" else "response_B"]


def test_seed_keeps_stored_order(shared_data: Path):
    assert JUDGEBENCH.load(data_dir=shared_data, seed=0) == JUDGEBENCH.load(data_dir=shared_data, seed=7)


def test_limit(shared_data: Path):
    full = JUDGEBENCH.load(data_dir=shared_data)
    assert JUDGEBENCH.load(data_dir=shared_data, limit=5) == full[:5]
    assert JUDGEBENCH.load(data_dir=shared_data, limit=0) == []
    with pytest.raises(ConfigError, match="limit"):
        JUDGEBENCH.load(data_dir=shared_data, limit=-1)


def _good_row(pair_id: str = "p1", label: str = "A>B") -> dict:
    return {
        "pair_id": pair_id,
        "original_id": None,
        "source": "livecodebench",
        "question": "q",
        "response_model": "m",
        "response_A": "a",
        "response_B": "b",
        "label": label,
    }


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        (json.dumps(_good_row("p2", label="A=B")), "label"),
        (json.dumps({**_good_row("p2"), "response_B": None}), "response_B"),
        ("{not json", "invalid JSON"),
        (json.dumps(_good_row("p1")), "duplicate pair_id"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str):
    folder = tmp_path / "judgebench"
    folder.mkdir()
    (folder / GPT_FILE).write_text(json.dumps(_good_row()) + "\n\n" + bad_line + "\n")
    with pytest.raises(ConfigError, match=rf"{GPT_FILE}:3: .*{message}"):
        JUDGEBENCH.load(data_dir=tmp_path)


def test_missing_file(tmp_path: Path):
    (tmp_path / "judgebench").mkdir()
    with pytest.raises(ConfigError, match=FILES["gpt"]):
        JUDGEBENCH.load(data_dir=tmp_path)
    with pytest.raises(ConfigError, match="split"):
        JudgeBench("mistral")  # type: ignore[arg-type]


def test_hub_path(monkeypatch: pytest.MonkeyPatch):
    calls = []
    rows = [
        {**_good_row("u1"), "original_id": "10646", "source": "mmlu-pro-law"},
        {**_good_row("u2", label="B>A"), "source": "livebench-math"},
    ]

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, split))
        return rows

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    items = JUDGEBENCH_CLAUDE.load(limit=5)
    assert calls == [("ScalerLab/JudgeBench", "claude")]
    assert [i.id for i in items] == ["u1", "u2"] and [i.preferred for i in items] == [0, 1]
    assert items[0].meta["original_id"] == "10646" and items[0].meta["category"] == "Knowledge"
    assert items[1].meta["original_id"] == "" and items[1].meta["category"] == "Math"
    assert items[1].responses == ("a", "b") and items[1].prompt == "q"
    JUDGEBENCH.load()
    assert calls[-1] == ("ScalerLab/JudgeBench", "gpt")
    rows.append({**_good_row("u3"), "label": None})
    with pytest.raises(ConfigError, match=r"ScalerLab/JudgeBench\[gpt\] row 2"):
        JUDGEBENCH.load()
