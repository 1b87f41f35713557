"""WildBench WB-Score: the judgment parser, the group and macro rules, and the published leaderboard numbers.

The shipped per-task judge files hold the parsed judge object (`parsed_result`), not the raw reply; the tests
re-serialise it and run the parser on that text. The task tags live on the Hugging Face dataset only, so the
per-group scores of the two shipped models are not checked here; the group and macro rules are checked on a
hand-computed example and, for the macro weights, on all 61 published models.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.wildbench_score import (
    GROUP_WEIGHTS,
    GROUPS,
    LEADERBOARD_SCALE,
    TASK_GROUPS,
    TRUNCATION_MARKER,
    TaskScore,
    counts_in_groups,
    task_groups,
    task_macro_score,
    wb_result,
    wb_score,
)
from harness.errors import ConfigError
from judges.wildbench import EMPTY_OUTPUT_JUDGMENT, is_empty_output, parse_judgment, parse_score

JUDGE_JSON = """{
    "strengths": "The response lists the three steps the user asked for and gives a working example.",
    "weaknesses": "It does not mention the edge case in the checklist (empty input).",
    "score": "7"
}"""


# --- parser -----------------------------------------------------------------------------------------------


def test_valid_json_with_a_string_score():
    j = parse_judgment(JUDGE_JSON)
    assert j.score == 7.0
    assert j.strengths.startswith("The response lists") and j.weaknesses.endswith("(empty input).")
    assert not j.fallback and j.error is None


@pytest.mark.parametrize(
    "value, expected", [("8", 8.0), (8, 8.0), ("10", 10.0), ("1", 1.0), (6.5, 6.5), (" 9 ", 9.0)]
)
def test_json_score_values_are_read_with_float(value, expected):
    assert parse_score(json.dumps({"strengths": "s", "weaknesses": "w", "score": value})) == expected


def test_json_in_a_fence_is_read_by_the_regex_fallback():
    text = f"Here is my evaluation.\n```json\n{JUDGE_JSON}\n```"
    j = parse_judgment(text)
    assert j.score == 7.0 and j.fallback
    assert j.strengths is None  # the fallback reads only the score, as upstream's does


def test_the_fallback_reads_only_quoted_scores():
    # extract_values_from_json is called without allow_no_quotes: `"score": 8` outside valid JSON is unread.
    j = parse_judgment('```json\n{"strengths": "ok", "weaknesses": "none", "score": 8}\n```')
    assert j.score is None and "no quoted" in j.error


@pytest.mark.parametrize(
    "text",
    [
        # cut off before the closing brace
        '{"strengths": "Correct formula.", "weaknesses": "No units.", "score": "6"',
        # an unescaped quote inside a string breaks json.loads
        '{"strengths": "Uses the "divide and conquer" idea.", "weaknesses": "Slow.", "score": "6"}',
        # single-quoted keys elsewhere, trailing comma
        "{'strengths': 'fine', \"score\": \"6\",}",
    ],
)
def test_broken_json_is_read_by_the_regex_fallback(text):
    j = parse_judgment(text)
    assert j.score == 6.0 and j.fallback and j.error is None


def test_the_fallback_takes_the_first_quoted_score():
    assert parse_score('analysis: "score": "4" ... final {"score": "9"') == 4.0


def test_valid_json_without_a_score_fails_without_trying_the_regex():
    text = json.dumps({"strengths": 'I would give "score": "9"', "weaknesses": "none"})
    j = parse_judgment(text)
    assert j.score is None and not j.fallback and 'no "score"' in j.error


@pytest.mark.parametrize("value", ["11", "0", "-3", 10.5, "nan", "inf"])
def test_a_score_out_of_range_fails(value):
    j = parse_judgment(json.dumps({"strengths": "s", "weaknesses": "w", "score": value}))
    assert j.score is None and "outside 1..10" in j.error


@pytest.mark.parametrize("value", ["8/10", "eight", "", None, True, [8], {"value": 8}])
def test_a_score_that_is_not_a_number_fails(value):
    j = parse_judgment(json.dumps({"strengths": "s", "weaknesses": "w", "score": value}))
    assert j.score is None and "not a number" in j.error


@pytest.mark.parametrize("text", ["", "   \n", "The response is good. I rate it 8/10.", "[8]", "8"])
def test_no_score_at_all_fails_and_never_defaults(text):
    j = parse_judgment(text)
    assert j.score is None and j.error


def test_empty_output_rule():
    assert is_empty_output("") and is_empty_output(" \n\t") and not is_empty_output(" x ")
    j = parse_judgment(EMPTY_OUTPUT_JUDGMENT)
    assert j.score == 1.0 and j.weaknesses == "The model output is empty." and not j.fallback


# --- groups and macro -------------------------------------------------------------------------------------


def test_tags_map_to_the_five_groups_and_deduplicate():
    assert set(TASK_GROUPS.values()) == set(GROUPS) == set(GROUP_WEIGHTS)
    assert len(TASK_GROUPS) == 12
    assert task_groups(["Reasoning", "Planning", "Math"]) == {"Planning & Reasoning", "Math & Data Analysis"}
    assert task_groups(["Others"]) == {"Creative Tasks"}


@pytest.mark.parametrize("tags", [[], ["Poetry"], ["Math", "math"]])
def test_unknown_or_missing_tags_are_config_errors(tags):
    with pytest.raises(ConfigError):
        task_groups(tags)


def test_truncated_and_empty_outputs_do_not_count_in_groups():
    assert counts_in_groups("An answer.")
    assert not counts_in_groups("")
    assert not counts_in_groups("  \n")
    assert not counts_in_groups("A long answer" + TRUNCATION_MARKER + "\n")


def test_wb_score_formula():
    assert wb_score([5, 5]) == 0.0
    assert wb_score([10]) == 10.0 and wb_score([1]) == -8.0
    assert wb_score([8, 6, 4, 1, 10]) == pytest.approx(1.6)
    with pytest.raises(ValueError):
        wb_score([])


def test_task_macro_divides_by_all_five_weights():
    full = {g: 2.0 for g in GROUPS}
    assert task_macro_score(full) == pytest.approx(2.0)
    assert sum(GROUP_WEIGHTS.values()) == 4.75
    # a missing group adds 0; the denominator stays 4.75
    assert task_macro_score({"Coding & Debugging": 4.0}) == pytest.approx(4.0 * 1.25 / 4.75)
    with pytest.raises(ConfigError):
        task_macro_score({"Coding": 1.0})


def test_wb_result_hand_computed():
    tasks = [
        TaskScore(8.0, ("Coding & Debugging", "Reasoning", "Planning"), "a" * 10),
        TaskScore(6.0, ("Math",), "b" * 20),
        TaskScore(4.0, ("Creative Writing", "Editing"), " " + "c" * 30 + "\n"),
        TaskScore(None, ("Math",), "judge failed"),
        TaskScore(1.0, ("Information seeking",), ""),
        TaskScore(10.0, ("Math",), "d d d" + TRUNCATION_MARKER),
    ]
    r = wb_result(tasks)
    # overall: 8, 6, 4, 1, 10 (the empty and the truncated count; the failure does not)
    assert r.score == pytest.approx(5.8) and r.adjusted_score == pytest.approx(1.6)
    assert (r.n_scored, r.n_failed) == (5, 1)
    # groups: the first task counts once in Coding and once in Planning & Reasoning (Reasoning + Planning)
    assert r.task_categorized_scores == pytest.approx(
        {
            "Coding & Debugging": 6.0,
            "Planning & Reasoning": 6.0,
            "Math & Data Analysis": 2.0,
            "Creative Tasks": -2.0,
        }
    )
    assert list(r.task_categorized_scores) == [g for g in GROUPS if g != "Information/Advice seeking"]
    assert r.group_n == {
        "Creative Tasks": 1,
        "Planning & Reasoning": 1,
        "Math & Data Analysis": 1,
        "Coding & Debugging": 1,
    }
    assert r.task_macro_score == pytest.approx((6 * 1.25 + 6 * 1.25 + 2 * 1.0 - 2 * 0.5) / 4.75)
    assert r.avg_len == pytest.approx((10 + 20 + 30) / 3)
    assert json.loads(json.dumps(r.to_json()))["n_failed"] == 1


def test_wb_result_with_every_judgment_failed():
    r = wb_result([TaskScore(None, ("Math",), "x"), TaskScore(None, ("Others",), "y")])
    assert (r.score, r.adjusted_score, r.task_macro_score, r.avg_len) == (None, None, None, None)
    assert (r.n_scored, r.n_failed, r.task_categorized_scores) == (0, 2, {})
    with pytest.raises(ValueError):
        wb_result([])
    with pytest.raises(ConfigError):
        wb_result([TaskScore(7.0, ("Unknown",), "x")])


# --- published numbers ------------------------------------------------------------------------------------


def _leaderboard(shared_data: Path) -> dict:
    return json.loads((shared_data / "wildbench" / "leaderboard" / "score.json").read_text())


@pytest.mark.parametrize(
    "model, adjusted, shown, total",
    [("gpt-3.5-turbo-0125", 3.2278, 32.28, 1023), ("gemma-7b-it", 1.0176, 10.18, 1024)],
)
def test_shipped_judgments_reproduce_the_leaderboard_wb_score(
    shared_data: Path, model, adjusted, shown, total
):
    path = shared_data / "wildbench" / "score_results_v2.0625_gpt-4o-judge" / f"{model}.json"
    records = json.loads(path.read_text())
    published = _leaderboard(shared_data)[model]
    judgments = [parse_judgment(json.dumps(r["parsed_result"])) for r in records]
    assert all(j.error is None and not j.fallback for j in judgments)
    assert [j.score for j in judgments] == [float(r["score"]) for r in records]
    # the tags are on the HF dataset only: a placeholder tag, so only the tag-free numbers are checked
    result = wb_result(
        [TaskScore(j.score, ("Others",), r["model_output"]) for j, r in zip(judgments, records)]
    )
    assert result.n_scored == published["total"] == total and result.n_failed == 0
    assert result.score == pytest.approx(published["score"], abs=1e-12)
    assert result.adjusted_score == pytest.approx(published["adjusted_score"], abs=1e-12)
    assert round(result.adjusted_score, 4) == adjusted
    assert round(result.adjusted_score * LEADERBOARD_SCALE, 2) == shown
    # avg_len leaves out empty and truncated responses (gemma-7b-it has one empty response, judged 1)
    assert result.avg_len == pytest.approx(published["avg_len"], abs=1e-9)
    assert sum(is_empty_output(r["model_output"]) for r in records) == (model == "gemma-7b-it")


def test_task_macro_reproduces_all_published_models(shared_data: Path):
    board = _leaderboard(shared_data)
    stats = json.loads((shared_data / "wildbench" / "leaderboard" / "all_stat_wildbench.-1.json").read_text())
    assert len(board) == 61
    for name, row in board.items():
        assert set(row["task_categorized_scores"]) == set(GROUPS), name
        macro = task_macro_score(row["task_categorized_scores"])
        assert macro == pytest.approx(row["task_macro_score"], abs=1e-6), name
        assert macro * LEADERBOARD_SCALE == pytest.approx(stats[name]["WB_score.task_macro"], abs=1e-5), name
        assert row["adjusted_score"] == pytest.approx((row["score"] - 5) * 2, abs=1e-12), name
