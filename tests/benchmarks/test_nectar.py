"""Nectar: row mapping on the authors' real sample rows, LMSYS / anchor split, prompt extraction, Hub path."""

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import benchmarks.base
from benchmarks.nectar import (
    HUB_ID,
    LMSYS_SOURCE,
    NECTAR_LMSYS,
    AnchorSet,
    extract_prompt,
    nectar_anchors,
    read_rows,
    split_turns,
    to_anchor,
    to_item,
)
from harness.errors import ConfigError
from harness.registry import lookup

RANKED = "ablation_baseline_no_tiebreak_rankings.jsonl"
SOURCED = "ablation_pointwise_pairwise_baseline_data.jsonl"


@pytest.fixture(scope="module")
def ranked(shared_data: Path) -> list:
    return list(read_rows(shared_data / "nectar" / RANKED))


@pytest.fixture(scope="module")
def sourced(shared_data: Path) -> list:
    return list(read_rows(shared_data / "nectar" / SOURCED))


def test_registered():
    assert lookup("benchmark", "nectar_lmsys") is NECTAR_LMSYS and NECTAR_LMSYS.kind == "listwise"


def test_real_ranked_rows_map_to_items(ranked: list):
    items = [to_item(row, index, where) for index, where, row in ranked]
    assert len(items) == 194  # PROVENANCE.md
    assert [i.id for i in items[:2]] == ["nectar:0", "nectar:1"]
    for item, (_, _, row) in zip(items, ranked):
        assert len(item.responses) == 7 and sorted(item.gold_ranks) == [1, 2, 3, 4, 5, 6, 7]
        assert item.responses == tuple(a["answer"] for a in row["answers"])  # upstream order kept
        assert item.gold_ranks == tuple(int(a["rank"]) for a in row["answers"])
        assert item.meta["models"] == ",".join(a["model"] for a in row["answers"])
    # `answers` is never stored best-first in this sample: the mapping must not assume rank order.
    assert sum(list(i.gold_ranks) == sorted(i.gold_ranks) for i in items) == 0
    first = items[0]
    assert first.gold_ranks == (5, 7, 1, 2, 6, 3, 4)
    anchor = to_anchor(ranked[0][2], 0, ranked[0][1])
    assert anchor == AnchorSet(
        "nectar:0", first.prompt, tuple(first.responses[i] for i in (2, 3, 5, 6, 0, 4, 1))
    )


def test_real_prompts_single_and_multi_turn(ranked: list, sourced: list):
    humans = Counter(row["prompt"].count("\n\nHuman: ") for _, _, row in ranked)
    assert humans[1] == 147 and sum(humans.values()) == 194
    for _, where, row in ranked:
        prompt = extract_prompt(row["prompt"], where)
        if row["prompt"].count("\n\nHuman: ") == 1 and row["prompt"].count("\n\nAssistant: ") == 1:
            assert prompt == row["prompt"].removeprefix("\n\nHuman: ").removesuffix("\n\nAssistant: ").strip()
            assert not prompt.startswith("User: ")
        else:
            assert prompt.startswith("User: ") and "\n\nAssistant: " in prompt and "\n\nHuman: " not in prompt
    # `turns` counts human turns; one HH row has two assistant turns in a row and turns=3 for 2 human turns.
    mismatched = []
    for index, where, row in sourced:
        turns = split_turns(row["prompt"])
        assert turns[0][0] == "User" and extract_prompt(row["prompt"], where)
        if sum(role == "User" for role, _ in turns) != row["turns"]:
            mismatched.append(index)
    assert mismatched == [12]
    roles = [role for role, _ in split_turns(sourced[12][2]["prompt"])]
    assert roles == ["User", "Assistant", "Assistant", "User"]
    assert extract_prompt(sourced[12][2]["prompt"]).endswith(
        "\n\nUser: I am looking for a place that is very open to LGBTQ people"
    )


def test_real_sourced_rows_counts(sourced: list):
    assert len(sourced) == 100  # PROVENANCE.md
    assert Counter(s for _, _, row in sourced for s in row["source"]) == {
        "anthropic-hh": 38,
        LMSYS_SOURCE: 27,
        "flan_v2_niv2": 11,
        "sharegpt": 10,
        "ultrachat": 5,
        "evol_instruct": 4,
        "false_qa": 2,
        "flan_v2_flan2021": 1,
        "flan_v2_cot": 1,
        "flan_v2_p3": 1,
    }
    assert Counter(row["turns"] for _, _, row in sourced) == {1: 76, 2: 5, 3: 14, 4: 5}
    # These rows carry no `rank`: they cannot serve as gold, and say so with the file and line.
    with pytest.raises(ConfigError, match=rf"{SOURCED}:1: answers\[0\] has no integer-valued 'rank'"):
        to_item(sourced[0][2], 0, sourced[0][1])


def test_real_folder_is_not_the_benchmark(shared_data: Path):
    with pytest.raises(ConfigError, match=rf"missing data/rlaif.parquet or .*format samples.*{HUB_ID}"):
        NECTAR_LMSYS.load(data_dir=shared_data)
    with pytest.raises(ConfigError, match=HUB_ID):
        nectar_anchors(data_dir=shared_data)


def test_real_rows_through_a_data_folder(tmp_path: Path, ranked: list):
    """The real ranked rows, given sources in turn, read through the folder path as `rlaif.jsonl`."""
    folder = tmp_path / "nectar"
    folder.mkdir()
    sources = [[LMSYS_SOURCE], ["anthropic-hh"], ["sharegpt", LMSYS_SOURCE]]
    rows = [{**row, "source": sources[index % 3]} for index, _, row in ranked]
    (folder / "rlaif.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    items = NECTAR_LMSYS.load(data_dir=tmp_path)
    assert len(items) == 129 and [i.id for i in items[:3]] == ["nectar:0", "nectar:2", "nectar:3"]
    assert items[1].meta["source"] == f"sharegpt,{LMSYS_SOURCE}"
    anchors = list(nectar_anchors(data_dir=tmp_path))
    assert len(anchors) == 65 and anchors[0].id == "nectar:1"
    assert {a.id for a in anchors}.isdisjoint(i.id for i in items)
    best = next(a["answer"] for a in ranked[1][2]["answers"] if a["rank"] == 1.0)
    assert anchors[0].responses_in_rank_order[0] == best
    assert NECTAR_LMSYS.load(data_dir=tmp_path, limit=5) == items[:5]
    assert [a.id for a in nectar_anchors(data_dir=tmp_path, limit=2)] == ["nectar:1", "nectar:4"]


def _answers(ranks=(3.0, 1.0, 2.0)) -> list[dict]:
    return [{"answer": f"answer ranked {int(r)}", "model": f"m{int(r)}", "rank": r} for r in ranks]


def _row(text: str = "hello?", source=(LMSYS_SOURCE,), **over) -> dict:
    row = {
        "prompt": f"\n\nHuman: {text}\n\nAssistant: ",
        "answers": _answers(),
        "turns": 1,
        "num_responses": 3,
        "source": list(source),
        "good_natured": True,
    }
    return {**row, **over}


def test_prompt_extraction():
    assert extract_prompt("\n\nHuman: What is 2+2?\n\nAssistant: ") == "What is 2+2?"
    assert extract_prompt("\n\nHuman: Hi\n\nAssistant:") == "Hi"
    multi = "\n\nHuman: Name a fruit.\n\nAssistant: Apple.\n\nHuman: Another one?\n\nAssistant: "
    assert extract_prompt(multi) == "User: Name a fruit.\n\nAssistant: Apple.\n\nUser: Another one?"
    assert extract_prompt("Plain text, no markers") == "Plain text, no markers"
    assert split_turns(multi) == [
        ("User", "Name a fruit."),
        ("Assistant", "Apple."),
        ("User", "Another one?"),
    ]
    for bad in ("\n\nHuman: \n\nAssistant: ", "", "\n\nAssistant: only me"):
        with pytest.raises(ConfigError, match="here: field 'prompt' has no non-empty Human turn"):
            extract_prompt(bad, "here")


def test_item_and_anchor_from_shuffled_answers():
    item = to_item(_row(), 9, "x")
    assert item.id == "nectar:9" and item.prompt == "hello?"
    assert item.responses == ("answer ranked 3", "answer ranked 1", "answer ranked 2")
    assert item.gold_ranks == (3, 1, 2)
    assert item.meta == {"row": "9", "models": "m3,m1,m2", "source": LMSYS_SOURCE, "turns": "1"}
    anchor = to_anchor(_row(), 9, "x")
    assert anchor.responses_in_rank_order == ("answer ranked 1", "answer ranked 2", "answer ranked 3")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            _row(answers=_answers((1.0, 1.0, 3.0))),
            r"rlaif.jsonl:2: ranks \[1, 1, 3\] are not a permutation of 1..3",
        ),
        (_row(answers=_answers((1.0, 2.0, 4.0))), r"rlaif.jsonl:2: ranks .* not a permutation"),
        (
            _row(answers=[{"answer": "a", "rank": 1.5}, {"answer": "b", "rank": 2.0}]),
            r":2: answers\[0\] has no integer",
        ),
        (
            _row(answers=[{"answer": "a", "rank": 1.0}, {"answer": None, "rank": 2.0}]),
            r":2: answers\[1\] must be",
        ),
        (_row(answers=[{"answer": "a", "rank": 1.0}, {"answer": "b"}]), r":2: answers\[1\] has no integer"),
        (
            _row(answers=[{"answer": "a", "rank": 1.0}, {"answer": "b", "rank": float("nan")}]),
            r":2: answers\[1\] has no integer-valued 'rank' \(got nan\)",
        ),
        (_row(answers=_answers((1.0,))), r"rlaif.jsonl:2: field 'answers' must be a list of at least 2"),
        (_row(source=()), r"rlaif.jsonl:2: field 'source' must be a non-empty list"),
        (_row(text=""), r"rlaif.jsonl:2: field 'prompt' has no non-empty Human turn"),
        ("{not json", r"rlaif.jsonl:2: invalid JSON"),
    ],
)
def test_malformed_names_file_and_line(tmp_path: Path, row, message: str):
    folder = tmp_path / "nectar"
    folder.mkdir()
    second = row if isinstance(row, str) else json.dumps(row)
    (folder / "rlaif.jsonl").write_text(json.dumps(_row()) + "\n" + second + "\n")
    with pytest.raises(ConfigError, match=message):
        NECTAR_LMSYS.load(data_dir=tmp_path)


def test_hub_parquet_layout(tmp_path: Path):
    (tmp_path / "nectar" / "data").mkdir(parents=True)
    rows = [_row("a"), _row("b", source=["anthropic-hh"]), _row("c")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "nectar" / "data" / "rlaif.parquet")
    assert [(i.id, i.prompt) for i in NECTAR_LMSYS.load(data_dir=tmp_path)] == [
        ("nectar:0", "a"),
        ("nectar:2", "c"),
    ]
    assert [a.prompt for a in nectar_anchors(data_dir=tmp_path)] == ["b"]


@pytest.mark.parametrize("as_dataset", [False, True])
def test_hub_path(monkeypatch: pytest.MonkeyPatch, as_dataset: bool):
    import datasets

    calls = []
    rows = [
        _row("a", source=["sharegpt"]),
        _row("b"),
        _row("c", source=["ultrachat", LMSYS_SOURCE]),
        _row("d"),
    ]
    rows[1]["prompt"] = "\n\nHuman: b1\n\nAssistant: ok\n\nHuman: b2\n\nAssistant: "

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, split, config))
        return datasets.Dataset.from_list(rows) if as_dataset else rows

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    items = NECTAR_LMSYS.load()
    assert calls == [(HUB_ID, "train", None)]
    assert [i.id for i in items] == ["nectar:1", "nectar:2", "nectar:3"]
    assert items[0].prompt == "User: b1\n\nAssistant: ok\n\nUser: b2"
    assert items[1].gold_ranks == (3, 1, 2) and items[1].meta["source"] == f"ultrachat,{LMSYS_SOURCE}"
    assert NECTAR_LMSYS.load(limit=2) == items[:2]
    assert [(a.id, a.prompt) for a in nectar_anchors()] == [("nectar:0", "a")]
    rows[2] = _row("c", answers=_answers((1.0, 1.0, 2.0)))
    with pytest.raises(ConfigError, match=rf"{HUB_ID}\[train\] row 2: ranks"):
        NECTAR_LMSYS.load()
    rows[2] = {**_row("c"), "source": None} if not as_dataset else _row("c", source=[])
    with pytest.raises(ConfigError, match=rf"{HUB_ID}\[train\] row 2: field 'source'"):
        NECTAR_LMSYS.load()


def test_limit_validated():
    with pytest.raises(ConfigError, match="limit"):
        NECTAR_LMSYS.load(limit=-1)
    with pytest.raises(ConfigError, match="limit"):
        nectar_anchors(limit=-1)
