"""UltraFeedback loader: the local 500-pair file, malformed input, and the Hugging Face path."""

import json
from pathlib import Path

import pytest

import benchmarks.base
from benchmarks.ultrafeedback import FILENAME, ULTRAFEEDBACK
from harness.errors import ConfigError
from harness.registry import lookup


@pytest.fixture(scope="module")
def raw(shared_data: Path) -> list[dict]:
    text = (shared_data / "ultrafeedback" / FILENAME).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def items(shared_data: Path):
    return ULTRAFEEDBACK.load(data_dir=shared_data)


def test_registered():
    assert lookup("benchmark", "ultrafeedback") is ULTRAFEEDBACK and ULTRAFEEDBACK.kind == "pairwise"


def test_counts(items):
    assert len(items) == 500 and len({i.id for i in items}) == 500
    assert [i.id for i in items[:2]] == ["test_prefs:0", "test_prefs:1"]
    identical = [i for i in items if i.meta["identical_responses"] == "true"]
    assert len(identical) == 11  # kept: an evaluator can only tie on them
    assert all(i.responses[0] == i.responses[1] for i in identical)


def test_positions_balanced_and_seeded(items, shared_data: Path):
    assert all(i.preferred in (0, 1) for i in items)
    assert 0.4 < sum(i.preferred == 0 for i in items) / len(items) < 0.6
    assert ULTRAFEEDBACK.load(data_dir=shared_data) == items
    other = ULTRAFEEDBACK.load(data_dir=shared_data, seed=1)
    assert [i.preferred for i in other] != [i.preferred for i in items]


def test_every_record_mapped(items, raw):
    first = raw[0]
    assert items[0].prompt == first["chosen"][0]["content"]
    assert items[0].responses[items[0].preferred] == first["chosen"][1]["content"]
    assert items[0].responses[1 - items[0].preferred] == first["rejected"][1]["content"]
    assert items[0].meta == {
        "row": "0",
        "identical_responses": "false",
    }  # no prompt_id/scores in the local copy
    for row, item in zip(raw, items, strict=True):
        assert item.responses[item.preferred] == row["chosen"][1]["content"]
        assert item.responses[1 - item.preferred] == row["rejected"][1]["content"]


def test_limit(items, shared_data: Path):
    assert ULTRAFEEDBACK.load(data_dir=shared_data, limit=7) == items[:7]
    assert ULTRAFEEDBACK.load(data_dir=shared_data, limit=0) == []


def _row(prompt="p", chosen="c", rejected="r") -> dict:
    return {
        "chosen": [{"role": "user", "content": prompt}, {"role": "assistant", "content": chosen}],
        "rejected": [{"role": "user", "content": prompt}, {"role": "assistant", "content": rejected}],
    }


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (json.dumps({"chosen": _row()["chosen"]}), "'rejected'"),
        (json.dumps({**_row(), "rejected": _row(prompt="other")["rejected"]}), "user turns"),
        (json.dumps({**_row(), "chosen": list(reversed(_row()["chosen"]))}), "'chosen'"),
        ("[1, 2", "invalid JSON"),
        ("[]", "expected a JSON object"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad: str, message: str):
    folder = tmp_path / "ultrafeedback"
    folder.mkdir()
    (folder / FILENAME).write_text(json.dumps(_row()) + "\n" + bad + "\n")
    with pytest.raises(ConfigError, match=rf"{FILENAME}:2: .*{message}"):
        ULTRAFEEDBACK.load(data_dir=tmp_path)


def test_hub_path(monkeypatch: pytest.MonkeyPatch, items, raw):
    calls = []
    hub_rows = [
        {
            **row,
            "prompt": row["chosen"][0]["content"],
            "prompt_id": f"id{n}",
            "messages": row["chosen"],
            "score_chosen": 8.0,
            "score_rejected": 5.5,
        }
        for n, row in enumerate(raw[:3])
    ]

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, split))
        return hub_rows

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    loaded = ULTRAFEEDBACK.load(limit=2)
    assert calls == [("HuggingFaceH4/ultrafeedback_binarized", "test_prefs")]
    assert len(loaded) == 2
    for hub_item, local_item in zip(
        loaded, items, strict=False
    ):  # same ids, prompts and A/B draws as the local copy
        assert (hub_item.id, hub_item.prompt, hub_item.responses, hub_item.preferred) == (
            local_item.id,
            local_item.prompt,
            local_item.responses,
            local_item.preferred,
        )
    assert loaded[1].meta == {
        "row": "1",
        "identical_responses": "false",
        "prompt_id": "id1",
        "score_chosen": "8.0",
        "score_rejected": "5.5",
    }
    hub_rows.append({"chosen": None, "rejected": None})
    with pytest.raises(ConfigError, match=r"ultrafeedback_binarized\[test_prefs\] row 3"):
        ULTRAFEEDBACK.load()
