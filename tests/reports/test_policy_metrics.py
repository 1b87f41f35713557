"""The policy benchmarks' declared metrics, read from policy records as a run writes them: published numbers
through the table's own path (`reports.results.compute_results`), hand-built records, and thinking removal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.records import EvalRecord
from judges.policy import strip_thinking
from reports.results import benchmark, compute_results


def _record(bench: str, item: str, scores, *, meta=None, trace=None, spec: str = "policy") -> EvalRecord:
    return EvalRecord(evaluator=spec, benchmark=bench, item=item, repeat=0, seed=0, kind="policy",
                      scores=tuple(scores), meta=meta or {}, trace=trace or {})


def _cell(records: list[EvalRecord], bench: str) -> dict:
    return compute_results(records, {"row": "policy"})["row"]["benchmarks"][bench]


@pytest.mark.parametrize(
    "text, judged",
    [
        ("<think>plan</think>\n\nThe answer.", "The answer."),
        ("Before <think>a</think> middle <think>b</think> after", "Before  middle  after"),
        ("reasoning the template opened</think>\nAnswer", "Answer"),  # Qwen3-style: the prompt opened the block
        ("Start <think>ran out of budget while thinking", "Start"),
        ("<think>only thinking</think>", ""),
        ("No reasoning at all.", "No reasoning at all."),
    ],
)
def test_strip_thinking(text: str, judged: str):
    assert strip_thinking(text) == judged


def test_policy_records_round_trip_and_refuse_labels():
    r = _record("wildbench", "wildbench:x", (7.0,), meta={"primary_tag": "Math"}, trace={"tags": ["Math"]})
    assert EvalRecord.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert "preferred" not in r.to_json() and "gold_ranks" not in r.to_json()
    with pytest.raises(ValueError, match="neither `preferred` nor `gold_ranks`"):
        EvalRecord("p", "wildbench", "x", 0, 0, "policy", (1.0,), preferred=0)


# --- AlpacaEval 2: the shipped annotations as records give the leaderboard ---


@pytest.fixture(scope="module")
def alpaca_records(shared_data: Path) -> list[EvalRecord]:
    pytest.importorskip("alpaca_eval", reason="the policy extra (alpaca-eval) is not installed")
    folder = shared_data / "alpaca_eval2"
    rows = json.loads((folder / "annotations" / "gpt-3.5-turbo-1106__weighted_alpaca_eval_gpt4_turbo.json")
                      .read_text())
    order = {r["instruction"]: i for i, r in enumerate(json.loads(
        (folder / "reference_gpt4_1106_preview_model_outputs.json").read_text()))}
    return [
        _record("alpaca_eval2", f"alpaca_eval:{order[row['instruction']]:04d}", (row["preference"],),
                meta={"index": str(order[row["instruction"]])},
                trace={"annotation": {k: row[k] for k in ("instruction", "output_1", "generator_1", "output_2")}})
        for row in rows
    ]


def test_alpaca_win_rates_through_the_table_path_equal_the_leaderboard(alpaca_records: list[EvalRecord]):
    cell = _cell(alpaca_records, "alpaca_eval2")
    assert round(cell["win_rate"]["value"] * 100, 3) == 9.178
    board = cell["details"]["win_rate"][0]  # alpaca_eval's own get_winrate on the same rows
    assert (board["n_wins"], board["n_draws"], round(board["standard_error"], 3)) == (64, 4, 0.890)
    assert cell["discrete_win_rate"]["value"] * 100 == pytest.approx(board["discrete_win_rate"], abs=1e-9)
    assert cell["win_rate"]["n"] == 805 and cell["win_rate"]["n_failed"] == 0


def test_alpaca_lc_is_alpaca_evals_glm_or_says_why_not(alpaca_records, monkeypatch, tmp_path: Path):
    from alpaca_fakes import gamed_frame

    import benchmarks.alpaca_eval2 as alpaca

    cell = _cell(alpaca_records[:10], "alpaca_eval2")  # a --limit run
    assert "needs all 805 instructions judged; the run holds 10" in cell["unavailable"]["lc_win_rate"][0]
    gamed = gamed_frame(tmp_path / "df_gamed.csv", 805)
    direct = alpaca.length_controlled(
        [{**r.trace["annotation"], "generator_2": "policy", "preference": r.scores[0]}
         for r in sorted(alpaca_records, key=lambda r: int(r.meta["index"]))],
        [r.trace["annotation"]["instruction"] for r in sorted(alpaca_records, key=lambda r: int(r.meta["index"]))],
        gamed_csv=gamed)
    original = alpaca.length_controlled
    monkeypatch.setattr(alpaca, "length_controlled", lambda rows, ins: original(rows, ins, gamed_csv=gamed))
    cell = _cell(alpaca_records, "alpaca_eval2")
    lc = cell["lc_win_rate"]
    assert lc["value"] * 100 == pytest.approx(direct["length_controlled_winrate"], abs=1e-9)
    se = direct["lc_standard_error"] / 100
    assert (lc["ci_low"], lc["ci_high"]) == pytest.approx((lc["value"] - 1.96 * se, lc["value"] + 1.96 * se))
    failed = [*alpaca_records[:-1], _record("alpaca_eval2", alpaca_records[-1].item, (None,),
                                            meta=dict(alpaca_records[-1].meta), trace=dict(alpaca_records[-1].trace))]
    assert "1 judgments failed" in _cell(failed, "alpaca_eval2")["unavailable"]["lc_win_rate"][0]


# --- WildBench: the shipped per-task judgments as records give the leaderboard's WB-Score ---


def test_wildbench_wb_score_through_the_table_path(shared_data: Path):
    path = shared_data / "wildbench" / "score_results_v2.0625_gpt-4o-judge" / "gpt-3.5-turbo-0125.json"
    rows = json.loads(path.read_text())
    records = [_record("wildbench", r["session_id"], (float(r["score"]),),
                       trace={"tags": ["Math"], "in_groups": True}) for r in rows]
    cell = _cell(records, "wildbench")
    assert round(cell["score"]["value"] * 100, 2) == 32.28  # the leaderboard's WB_score x10
    assert benchmark("wildbench").metrics[0].format(cell["score"]["value"]) == "32.3"


def _wild(item: str, score, tags: list[str], *, in_groups: bool = True) -> EvalRecord:
    return _record("wildbench", item, (score,), trace={"tags": tags, "in_groups": in_groups})


def test_wildbench_task_macro_matches_wb_result_and_skips_failures():
    from benchmarks.wildbench_score import TaskScore, wb_result

    records = [_wild("a", 8.0, ["Coding & Debugging"]), _wild("b", 6.0, ["Creative Writing", "Math"]),
               _wild("c", 3.0, ["Information seeking"]), _wild("d", None, ["Math"]),
               _wild("e", 1.0, ["Planning"], in_groups=False)]
    upstream = wb_result([TaskScore(r.scores[0], tuple(r.trace["tags"]), "shown" if r.trace["in_groups"] else "")
                          for r in records])
    cell = _cell(records, "wildbench")
    assert cell["task_macro"]["value"] * 10 == pytest.approx(upstream.task_macro_score)
    assert cell["score"]["value"] * 10 == pytest.approx(upstream.adjusted_score)  # a, b, c, e; d failed
    assert cell["score"]["n_failed"] == 1 and cell["score"]["n"] == 5
    assert cell["details"]["task_macro"][0]["group_n"] == upstream.group_n
    assert cell["task_macro"]["ci_low"] <= cell["task_macro"]["value"] <= cell["task_macro"]["ci_high"]


# --- Arena-Hard: hand-built games ---


def _arena(item: str, category: str, verdicts: tuple[str | None, str | None]) -> EvalRecord:
    from benchmarks.arena_hard_score import LABEL_POINTS

    games = [{"uid": item, "category": category, "verdict": v, "model_as_a": shown, "judge": "j"}
             for v, shown in zip(verdicts, (False, True))]
    scores = tuple(None if v is None else (LABEL_POINTS[v] if shown else 1 - LABEL_POINTS[v])
                   for v, shown in zip(verdicts, (False, True)))
    return _record("arena_hard_v2", item, scores, meta={"category": category}, trace={"judgment": {"games": games}})


def test_arena_categories_strong_verdicts_and_a_dropped_question():
    from benchmarks.arena_hard import HARD_PROMPT

    records = [
        _arena("q1", "hard_prompt", ("B>>A", "A>B")),  # the policy: 3 wins (strong), then 1 win
        _arena("q2", "hard_prompt", ("A=B", "B>A")),  # a tie, then a loss
        _arena("q3", "hard_prompt", (None, "A>B")),  # a game without a verdict: dropped, counted
        _arena("q4", "creative_writing", ("A>>B", "A=B")),
    ]
    cell = _cell(records, "arena_hard_v2")
    hard = cell["hard_prompt"]
    # Hand count: battles 1, 1, 1, 1 (q1) and 0.5, 0 (q2): the per-item weighted mean is 4.5 / 6.
    assert HARD_PROMPT.values(records[:3]).tolist() == [1.0, 0.25, 0.0]
    assert HARD_PROMPT.item_weights(records[:3]).tolist() == [4.0, 2.0, 0.0]
    assert cell["details"]["hard_prompt"][0]["win_rate"] == pytest.approx(4.5 / 6)
    assert hard["n"] == 3 and hard["n_failed"] == 1 and cell["details"]["hard_prompt"][0]["n_dropped"] == 1
    assert abs(hard["value"] - 4.5 / 6) < 0.1 and hard["ci_low"] <= hard["value"] <= hard["ci_high"]
    # creative writing: 3 baseline wins (strong), a tie: 0.5 / 4
    assert cell["details"]["creative_writing"][0]["win_rate"] == pytest.approx(0.5 / 4)
    assert cell["creative_writing"]["n"] == 1


def test_a_cell_whose_every_judgment_failed_has_no_value_and_says_so():
    cell = _cell([_arena("q1", "hard_prompt", (None, None))], "arena_hard_v2")
    assert "hard_prompt" not in cell and "no record could be scored (1 failed)" in cell["unavailable"]["hard_prompt"][0]


# --- WritingBench: the overall score weighs queries by their scored criteria ---


def test_writingbench_overall_is_the_mean_over_scored_criteria():
    from benchmarks.writingbench_score import QueryScores, writingbench_result

    scores = {"w1": (8.0, 6.0, None), "w2": (3.0,), "w3": ()}
    records = [_record("writingbench", k, v, meta={"domain1": "d", "domain2": "e"}) for k, v in scores.items()]
    cell = _cell(records, "writingbench")["overall"]
    assert cell["value"] == pytest.approx((8 + 6 + 3) / 3 / 10) and cell["n_failed"] == 2
    queries = [QueryScores(k, "d", "e", {f"c{i}": s for i, s in enumerate(v)}) for k, v in scores.items()]
    assert cell["value"] * 10 == pytest.approx(writingbench_result(queries).overall)
