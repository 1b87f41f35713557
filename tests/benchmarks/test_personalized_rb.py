"""Personalized RewardBench loader: exported Hub files in three formats, the profile in the prompt, Hub path.

No real rows exist offline (the data is Hub-only): every fixture here is synthetic, built from the
card's schema.
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import benchmarks.base
from benchmarks.personalized_rb import HUB_ID, PERSONALIZED_RB, PROFILE_POSTS, SUBSETS
from harness.errors import ConfigError
from harness.registry import lookup

LIFESTYLE, ART, SOCIETY = SUBSETS


def _row(rid: str, *, posts: int = 2, **over) -> dict:
    return {
        "id": rid,
        "question": f"question {rid}?",
        "profile": [
            {"id": f"{rid}-p{k}", "category": f"cat{k}", "text": f"past post {k} of {rid}"}
            for k in range(posts)
        ],
        "rubric_aspects": [
            {"aspect": "SECRET-ASPECT", "evidence": "SECRET-EVIDENCE", "reason": "SECRET-REASON"}
        ],
        "narrative": "SECRET-NARRATIVE",
        "category": "topic",
        "chosen": f"chosen {rid}",
        "rejected": f"rejected {rid}",
        **over,
    }


def _folder(tmp_path: Path, *, art: str | None = None) -> Path:
    """Lifestyle as upstream-style JSONL, Art as a JSON array, Society in the Hub's parquet layout."""
    folder = tmp_path / "personalized_rewardbench"
    (folder / SOCIETY).mkdir(parents=True)
    lines = [json.dumps(_row(f"L{i}")) for i in range(30)]
    (folder / f"{LIFESTYLE}_test.jsonl").write_text("\n".join(lines) + "\n")
    (folder / f"{ART}_test.json").write_text(
        art if art is not None else json.dumps([_row("A0"), _row("A1", posts=12)])
    )
    pq.write_table(
        pa.Table.from_pylist([_row("S0", posts=0)]), folder / SOCIETY / "test-00000-of-00001.parquet"
    )
    return tmp_path


def test_registered():
    assert lookup("benchmark", "personalized_rb") is PERSONALIZED_RB and PERSONALIZED_RB.kind == "pairwise"


def test_local_formats_order_ids_and_meta(tmp_path: Path):
    items = PERSONALIZED_RB.load(data_dir=_folder(tmp_path))
    assert len(items) == 33 and len({i.id for i in items}) == 33
    assert [i.id for i in items[:2]] == ["Lifestyle:L0", "Lifestyle:L1"]
    assert [i.id for i in items[30:]] == ["Art:A0", "Art:A1", "Society:S0"]
    assert [i.meta["subset"] for i in items[29:]] == ["Lifestyle", "Art", "Art", "Society"]
    assert items[30].meta == {
        "subset": "Art",
        "config": ART,
        "category": "topic",
        "record_id": "A0",
        "profile_posts": "2",
    }
    for item in items:
        rid = item.meta["record_id"]
        assert item.responses[item.preferred] == f"chosen {rid}"
        assert item.responses[1 - item.preferred] == f"rejected {rid}"


def test_prompt_shows_profile_then_question_and_hides_rubric(tmp_path: Path):
    items = {i.id: i for i in PERSONALIZED_RB.load(data_dir=_folder(tmp_path))}
    prompt = items["Art:A0"].prompt
    assert "Post 1 (Category: cat0):\npast post 0 of A0" in prompt
    assert "Post 2 (Category: cat1):\npast post 1 of A0" in prompt
    assert prompt.index("past post 1 of A0") < prompt.index("question A0?")
    assert prompt.endswith("The user's current question:\nquestion A0?")
    for item in items.values():
        assert "SECRET" not in item.prompt
    capped = items["Art:A1"]
    assert f"Post {PROFILE_POSTS} (" in capped.prompt and f"Post {PROFILE_POSTS + 1} (" not in capped.prompt
    assert "past post 9 of A1" in capped.prompt and "past post 10 of A1" not in capped.prompt
    assert capped.meta["profile_posts"] == "10"
    assert items["Society:S0"].prompt == "question S0?"  # empty profile: just the question


def test_ab_randomisation_deterministic_per_seed(tmp_path: Path):
    data_dir = _folder(tmp_path)
    first = PERSONALIZED_RB.load(data_dir=data_dir, seed=0)
    assert PERSONALIZED_RB.load(data_dir=data_dir, seed=0) == first
    positions = [i.preferred for i in first]
    assert 0 in positions and 1 in positions
    other = PERSONALIZED_RB.load(data_dir=data_dir, seed=1)
    assert [i.id for i in other] == [i.id for i in first]
    assert [i.preferred for i in other] != positions


def test_limit(tmp_path: Path):
    data_dir = _folder(tmp_path)
    assert PERSONALIZED_RB.load(data_dir=data_dir, limit=31) == PERSONALIZED_RB.load(data_dir=data_dir)[:31]
    assert PERSONALIZED_RB.load(data_dir=data_dir, limit=0) == []
    with pytest.raises(ConfigError, match="limit"):
        PERSONALIZED_RB.load(data_dir=data_dir, limit=-1)


def test_json_lines_in_a_json_file(tmp_path: Path):
    """`Dataset.to_json` writes JSON lines even with a `.json` suffix."""
    art = json.dumps(_row("A0")) + "\n" + json.dumps(_row("A1")) + "\n"
    items = PERSONALIZED_RB.load(data_dir=_folder(tmp_path, art=art))
    assert [i.id for i in items[30:32]] == ["Art:A0", "Art:A1"]


@pytest.mark.parametrize(
    ("art", "message"),
    [
        (
            json.dumps([_row("A0"), {**_row("A1"), "chosen": ""}]),
            rf"{ART}_test.json: record 1: field 'chosen'",
        ),
        (
            json.dumps([_row("A0"), _row("A1", question=None)]),
            rf"{ART}_test.json: record 1: field 'question'",
        ),
        (json.dumps([_row("A0"), _row("A0")]), r"record 1: duplicate id Art:A0 \(first at .*record 0\)"),
        (json.dumps([_row("A0", profile="none")]), r"record 0: field 'profile' must be a list"),
        (
            json.dumps([_row("A0", profile=[{"id": "x", "category": "c"}])]),
            r"record 0: profile\[0\] must have",
        ),
        (json.dumps([_row("A0", id=None)]), r"record 0: field 'id'"),
        (json.dumps(_row("A0")) + "\n{oops\n", rf"{ART}_test.json:2: invalid JSON"),
        ("[" + json.dumps(_row("A0")) + ",\n{oops}]", rf"{ART}_test.json:2: invalid JSON"),
    ],
)
def test_malformed_names_file_and_record(tmp_path: Path, art: str, message: str):
    with pytest.raises(ConfigError, match=message):
        PERSONALIZED_RB.load(data_dir=_folder(tmp_path, art=art))


def test_missing_files_name_config_and_hub(tmp_path: Path, shared_data: Path):
    data_dir = _folder(tmp_path)
    (data_dir / "personalized_rewardbench" / f"{ART}_test.json").unlink()
    with pytest.raises(ConfigError, match=rf"missing data for {ART} \(expected .*\); .*{HUB_ID}"):
        PERSONALIZED_RB.load(data_dir=data_dir)
    with pytest.raises(ConfigError, match=rf"not found.*{HUB_ID}"):
        PERSONALIZED_RB.load(data_dir=tmp_path / "nowhere")
    # The reference folder holds the upstream prompt templates only, no data.
    with pytest.raises(ConfigError, match=rf"missing data for {LIFESTYLE}, {ART}, {SOCIETY} .*{HUB_ID}"):
        PERSONALIZED_RB.load(data_dir=shared_data)


def test_hub_path(monkeypatch: pytest.MonkeyPatch):
    calls = []
    tables = {
        LIFESTYLE: [_row("L0"), _row("L1")],
        ART: [_row("A0")],
        SOCIETY: [_row("S0"), {**_row("S1"), "rejected": 3}],
    }

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, split, config))
        return tables[config]

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    assert [i.id for i in PERSONALIZED_RB.load(limit=2)] == ["Lifestyle:L0", "Lifestyle:L1"]
    assert calls == [(HUB_ID, "test", LIFESTYLE)]  # later configs are not fetched once the limit is reached
    with pytest.raises(ConfigError, match=rf"{HUB_ID}\[{SOCIETY}/test\] row 1: field 'rejected'"):
        PERSONALIZED_RB.load()
    tables[SOCIETY].pop()
    calls.clear()
    items = PERSONALIZED_RB.load(seed=5)
    assert calls == [(HUB_ID, "test", c) for c in SUBSETS]
    assert [i.id for i in items] == ["Lifestyle:L0", "Lifestyle:L1", "Art:A0", "Society:S0"]
    assert "past post 0 of A0" in items[2].prompt and items[2].responses[items[2].preferred] == "chosen A0"
