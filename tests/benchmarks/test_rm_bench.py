"""RM-Bench loader: 9 style pairs per prompt from the real files, malformed input, the Hugging Face path."""

import json
from collections import Counter
from pathlib import Path

import pytest

import benchmarks.base
from benchmarks.rm_bench import RM_BENCH, STYLES, difficulty
from harness.errors import ConfigError
from harness.registry import lookup

PROMPTS = {"chat": 129, "code": 228, "safety-refuse": 284, "safety-response": 157}


@pytest.fixture(scope="module")
def items(shared_data: Path):
    return RM_BENCH.load(data_dir=shared_data)


def test_registered():
    assert lookup("benchmark", "rm_bench") is RM_BENCH and RM_BENCH.kind == "pairwise"


def test_counts(items):
    assert len(items) == 798 * 9 == 7182
    assert len({i.id for i in items}) == 7182
    assert Counter(i.meta["domain"] for i in items) == {d: n * 9 for d, n in PROMPTS.items()}
    assert Counter(i.meta["domain_group"] for i in items) == {"chat": 1161, "code": 2052, "safety": 3969}
    assert Counter(i.meta["difficulty"] for i in items) == {
        "hard": 3 * 798,
        "normal": 3 * 798,
        "easy": 3 * 798,
    }


def test_positions_balanced_and_seeded(items, shared_data: Path):
    assert all(i.preferred in (0, 1) for i in items)
    share = sum(i.preferred == 0 for i in items) / len(items)
    assert 0.4 < share < 0.6
    again = RM_BENCH.load(data_dir=shared_data, limit=200)
    assert again == items[:200]
    other = RM_BENCH.load(data_dir=shared_data, limit=200, seed=1)
    assert [i.preferred for i in other] != [i.preferred for i in again]
    assert [i.id for i in other] == [i.id for i in again]


def test_first_record_mapped(items, shared_data: Path):
    first = json.loads((shared_data / "rm_bench" / "chat_filtered.json").read_text())[0]
    cells = items[:9]
    assert [c.id for c in cells] == [f"chat:{first['id']}:{i}{j}" for i in range(3) for j in range(3)]
    for c in cells:
        i, j = int(c.meta["chosen_style"]), int(c.meta["rejected_style"])
        assert c.prompt == first["prompt"]
        assert c.responses[c.preferred] == first["chosen"][i]
        assert c.responses[1 - c.preferred] == first["rejected"][j]
        assert c.meta["chosen_style_name"] == STYLES[i] and c.meta["rejected_style_name"] == STYLES[j]
        assert c.meta["difficulty"] == difficulty(i, j)
        assert c.meta["record_id"] == str(first["id"]) and c.meta["subset"] == first["subset"]
    assert cells[1].meta["difficulty"] == "hard" and cells[3].meta["difficulty"] == "easy"  # (0,1) and (1,0)
    assert cells[4].meta["difficulty"] == "normal"


def test_limit(items, shared_data: Path):
    assert RM_BENCH.load(data_dir=shared_data, limit=13) == items[:13]
    assert RM_BENCH.load(data_dir=shared_data, limit=0) == []


def _record(rid=1, **over) -> dict:
    return {
        "id": rid,
        "prompt": "p",
        "chosen": ["c0", "c1", "c2"],
        "rejected": ["r0", "r1", "r2"],
        "subset": "s",
        **over,
    }


def _folder(tmp_path: Path, chat: str) -> Path:
    folder = tmp_path / "rm_bench"
    folder.mkdir()
    for domain in PROMPTS:
        (folder / f"{domain}_filtered.json").write_text(json.dumps([_record()]))
    (folder / "chat_filtered.json").write_text(chat)
    return tmp_path


@pytest.mark.parametrize(
    ("chat", "message"),
    [
        (
            json.dumps([_record(1), _record(2, rejected=["r0", "r1"])]),
            r"chat_filtered.json: record 1: .*'rejected'",
        ),
        (json.dumps([_record(1), _record(2, prompt=None)]), r"chat_filtered.json: record 1: .*'prompt'"),
        (json.dumps([_record(1), _record(1)]), r"chat_filtered.json: record 1: duplicate id chat:1"),
        ("[\n" + json.dumps(_record()) + ",\n{oops}\n]", r"chat_filtered.json:3: invalid JSON"),
        (json.dumps({"id": 1}), r"chat_filtered.json: expected a JSON array"),
    ],
)
def test_malformed_names_file_and_record(tmp_path: Path, chat: str, message: str):
    with pytest.raises(ConfigError, match=message):
        RM_BENCH.load(data_dir=_folder(tmp_path, chat))


def test_math_file_read_when_present(tmp_path: Path):
    data_dir = _folder(tmp_path, json.dumps([_record()]))
    assert len(RM_BENCH.load(data_dir=data_dir)) == 4 * 9
    (data_dir / "rm_bench" / "math_filtered.json").write_text(json.dumps([_record(7)]))
    loaded = RM_BENCH.load(data_dir=data_dir)
    assert [i.meta["domain"] for i in loaded[::9]] == [
        "chat",
        "code",
        "math",
        "safety-refuse",
        "safety-response",
    ]
    assert loaded[18].id == "math:7:00"
    (data_dir / "rm_bench" / "code_filtered.json").unlink()
    with pytest.raises(ConfigError, match="code_filtered.json"):
        RM_BENCH.load(data_dir=data_dir)


def test_hub_path(monkeypatch: pytest.MonkeyPatch):
    calls = []
    rows = [{**_record(8), "domain": "chat"}, {**_record(8), "domain": "code", "language": "rust"}]

    def fake_load_hub(dataset_id, *, split, config=None, revision=None):
        calls.append((dataset_id, split))
        return rows

    monkeypatch.setattr(benchmarks.base, "load_hub", fake_load_hub)
    loaded = RM_BENCH.load(seed=3)
    assert calls == [("THU-KEG/RM-Bench", "train")]
    assert len(loaded) == 18 and loaded[0].id == "chat:8:00" and loaded[9].id == "code:8:00"
    assert loaded[9].meta["domain_group"] == "code" and loaded[9].meta["record_id"] == "8"
    cell = loaded[5]  # chat, chosen style 1, rejected style 2
    assert (
        cell.id == "chat:8:12"
        and cell.responses[cell.preferred] == "c1"
        and cell.responses[1 - cell.preferred] == "r2"
    )
    assert RM_BENCH.load(limit=10) == RM_BENCH.load()[:10]
    rows.append({**_record(9), "domain": "maths"})
    with pytest.raises(ConfigError, match=r"THU-KEG/RM-Bench\[train\] row 2: unknown domain 'maths'"):
        RM_BENCH.load()


def _records(items, correct):
    from harness.records import EvalRecord

    return [
        EvalRecord("e", "rm_bench", i.id, 0, 0, "pairwise",
                   (1.0, 0.0) if correct(i) == (i.preferred == 0) else (0.0, 1.0),
                   meta=dict(i.meta), preferred=i.preferred)
        for i in items
    ]


def test_the_table_column_is_the_official_overall_and_the_pooled_accuracy_stays(items):
    """An evaluator right on chat pairs only: officially 1/3 (chat, code, safety), pooled 1161 / 7182."""
    from reports.render import render_markdown
    from reports.results import compute_results
    from reports.tables import get_table

    results = compute_results(_records(items, lambda i: i.meta["domain_group"] == "chat"), {"row": "e"})
    cell = results["row"]["benchmarks"]["rm_bench"]
    assert cell["acc"]["value"] == pytest.approx(1 / 3)
    assert cell["pooled_acc"]["value"] == pytest.approx(1161 / 7182)  # 16.2, what the column used to print
    average = cell["details"]["acc"][0]["average"]
    assert average["overall"] == pytest.approx(cell["acc"]["value"])
    assert average["hard"] == average["normal"] == average["easy"] == pytest.approx(1 / 3)
    spec = get_table("table1")
    table = render_markdown(spec, {"Skywork-27B": results["row"]}, [])
    header = table.splitlines()[2]
    assert "| RM-Bench |" in header and "| LMSYS-Chat-1M nDCG |" in header and "rm_bench" not in header
    assert "| **33.3** |" in table.splitlines()[4]


def test_overall_equals_the_upstream_matrix_mean_on_uneven_correctness(items):
    """Per-pair weights reproduce the mean over domains of 3x3 cell means (cells of unequal accuracy)."""
    import numpy as np

    from benchmarks import metrics
    from benchmarks.rm_bench import OVERALL

    def correct(i):  # depends on domain, cell and prompt: every cell gets its own accuracy
        return (hash((i.meta["domain"], i.meta["chosen_style"], i.meta["rejected_style"], i.meta["record_id"])) % 3) > 0

    records = _records(items, correct)
    by_domain = {}
    for r, i in zip(records, items):
        by_domain.setdefault(i.meta["domain_group"], []).append(
            (int(i.meta["chosen_style"]), int(i.meta["rejected_style"]), correct(i)))
    official = np.mean([metrics.rm_bench_matrix(rows)["overall"] for rows in by_domain.values()])
    assert OVERALL.result(records).value == pytest.approx(official, abs=1e-12)


def test_the_score_gap_is_averaged_over_the_same_domains_and_style_cells_as_the_accuracy(items):
    """Δ_gap on RM-Bench: score(chosen) - score(rejected), the mean over domains of the mean over style cells of
    the cell's mean over scored pairs; an unscored pair is left out of the mean and counted in n_failed."""
    from harness.records import EvalRecord
    from reports.results import compute_results

    def gap(i) -> float:  # chat 0.3; code -0.2 in the hard cells, 0.4 elsewhere (cell mean 0.2); safety 0.1
        if i.meta["domain_group"] == "code":
            return -0.2 if i.meta["difficulty"] == "hard" else 0.4
        return 0.3 if i.meta["domain_group"] == "chat" else 0.1

    unscored = {i.id for i in items if i.meta["domain_group"] == "code" and i.meta["difficulty"] == "hard"
                and int(i.meta["record_id"]) % 2 == 0}
    records = []
    for i in items:
        chosen, rejected = (None, 0.5) if i.id in unscored else (0.5 + gap(i), 0.5)
        scores = (chosen, rejected) if i.preferred == 0 else (rejected, chosen)
        records.append(EvalRecord("e", "rm_bench", i.id, 0, 0, "pairwise", scores, meta=dict(i.meta),
                                  preferred=i.preferred))
    assert unscored and [m.name for m in RM_BENCH.metrics] == ["acc", "pooled_acc", "gap"]
    cell = compute_results(records, {"row": "e"})["row"]["benchmarks"]["rm_bench"]
    assert cell["gap"]["value"] == pytest.approx((0.3 + 0.2 + 0.1) / 3)  # pooled over the scored pairs: 0.180
    assert cell["gap"]["n"] == 7182 and cell["gap"]["n_failed"] == len(unscored)
    code = cell["details"]["gap"][0]["per_domain"]["code"]
    assert (code["hard"], code["normal"], code["easy"]) == pytest.approx((-0.2, 0.4, 0.4))
    assert code["matrix"][0][1] == pytest.approx(-0.2) and code["matrix"][1][0] == pytest.approx(0.4)
