"""Every metric against hand-computed values, sklearn's ndcg_score, and JudgeBench's published check value.

Pairwise and listwise metrics are computed as the harness computes them: `benchmarks.scoring`'s metrics over
`EvalRecord`s (an unscored response is None in `scores`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from benchmarks.metrics import (
    MetricResult,
    avg_at_k,
    bootstrap_ci,
    decisions_from_scores,
    judgebench_pair_correct,
    judgebench_result,
    rm_bench_domain_average,
    rm_bench_matrix,
)
from benchmarks.scoring import NDCG, PAIRWISE_ACC, TOP1_ACC
from harness.records import EvalRecord

L3 = 1 / math.log2(3)  # discount of position 2; position 1 is 1, position 3 is 1/2, position 4 is 1/log2(5)
IDCG_3 = 2 * 1 + 1 * L3 + 0 * 0.5  # gold order of a 3-list with rel = 3 - rank = (2, 1, 0)


def pairs(preferred, other) -> list[EvalRecord]:
    """One pairwise record per (preferred score, other score); the preferred response shown second in every
    other record, so the metric reads `preferred`, not the position."""
    out = []
    for i, (p, o) in enumerate(zip(preferred, other, strict=True)):
        scores, first = ((p, o), 0) if i % 2 == 0 else ((o, p), 1)
        out.append(EvalRecord("ev", "b", f"i{i}", 0, 0, "pairwise", scores, preferred=first))
    return out


def lists(scores, gold_ranks) -> list[EvalRecord]:
    """One listwise record per list of scores (None: a list that could not be scored at all)."""
    out = []
    for i, (s, g) in enumerate(zip(scores, gold_ranks, strict=True)):
        s = (None,) * len(g) if s is None else tuple(None if x is None else float(x) for x in s)
        out.append(EvalRecord("ev", "b", f"i{i}", 0, 0, "listwise", s, gold_ranks=tuple(int(x) for x in g)))
    return out


def ndcg(scores, gold_ranks) -> float:
    return NDCG.result(lists(scores, gold_ranks)).value


def top1(scores, gold_ranks) -> float:
    return TOP1_ACC.result(lists(scores, gold_ranks)).value


# --- pairwise -------------------------------------------------------------------------------------


def test_strict_pairwise_accuracy_ties_are_wrong():
    # win, loss, tie, win
    r = PAIRWISE_ACC.result(pairs([3, 1, 2, 2], [1, 2, 2, 0.5]))
    assert r.value == 0.5
    assert r.tie_rate == 0.25
    assert PAIRWISE_ACC.result(pairs([1.0], [1.0])).value == 0.0


def test_pairwise_needs_records():
    with pytest.raises(ValueError):
        PAIRWISE_ACC.result([])


def test_pairwise_result_counts_failures_as_wrong():
    found = pairs([1.0, None, 0.5, 0.0, 2.0], [0.0, 1.0, 0.5, 1.0, None])
    r = PAIRWISE_ACC.result(found)
    # only the first pair is a strict win; the two unscorable pairs stay in n and count wrong
    assert (r.value, r.n, r.n_failed, r.tie_rate) == (pytest.approx(0.2), 5, 2, pytest.approx(0.2))
    assert r.ci_low <= r.value <= r.ci_high
    # the scored subset agrees with the metric over it, rescaled to all n
    kept = [x for x in found if x.n_unscored == 0]
    assert [x.scores[x.preferred] for x in kept] == [1.0, 0.5, 0.0]
    assert r.value == pytest.approx(PAIRWISE_ACC.result(kept).value * 3 / 5)


def test_metric_result_is_frozen_and_json_ready():
    r = PAIRWISE_ACC.result(pairs([1.0, 0.0], [0.0, 1.0]))
    assert set(r.to_json()) == {"name", "value", "n", "n_failed", "tie_rate", "ci_low", "ci_high", "scale",
                                "digits"}
    assert (r.name, r.scale, r.digits) == ("acc", PAIRWISE_ACC.scale, PAIRWISE_ACC.digits)
    json.dumps(r.to_json())
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.value = 1.0  # type: ignore[misc]
    assert isinstance(r, MetricResult) and type(r.n) is int and type(r.value) is float


# --- listwise top-1 -------------------------------------------------------------------------------


def test_strict_top1_accuracy_cases():
    assert top1([[0.2, 0.9, 0.5]], [[2, 1, 3]]) == 1.0  # unique top is gold best
    assert top1([[0.9, 0.9, 0.1]], [[1, 2, 3]]) == 0.0  # tied top is wrong even with gold best in it
    assert top1([[0.3]], [[1]]) == 1.0  # one-response list
    assert top1([[0.1, 0.8, 0.5]], [[1, 1, 3]]) == 1.0  # several gold rank-1: any of them
    assert top1([[0.8, 0.8, 0.1]], [[1, 1, 3]]) == 0.0  # ...but the top must still be unique
    assert top1([[0.9, 0.8, 0.5]], [[2, 1, 1]]) == 0.0
    assert top1([[1, 2], [2, 1], [5, 5]], [[2, 1], [2, 1], [1, 2]]) == pytest.approx(1 / 3)
    tied = TOP1_ACC.result(lists([[1, 2], [5, 5], [3, 3, 1], [1, 1, 3]], [[1, 2], [1, 2], [1, 2, 3], [1, 2, 3]]))
    assert tied.tie_rate == 0.5


def test_listwise_needs_records():
    for metric in (TOP1_ACC, NDCG):
        with pytest.raises(ValueError):
            metric.result([])


# --- nDCG -----------------------------------------------------------------------------------------


def test_ndcg_three_item_example():
    # scores (0.2, 0.9, 0.5), gold ranks (1, 2, 3) -> rel (2, 1, 0).
    # Predicted order: item 1 (rel 1), item 2 (rel 0), item 0 (rel 2):
    #   DCG  = 1/log2(2) + 0/log2(3) + 2/log2(4) = 1 + 0 + 1 = 2
    #   IDCG = 2/log2(2) + 1/log2(3) + 0/log2(4) = 2 + 0.6309 = 2.6309
    #   nDCG = 2 / 2.6309 = 0.76019
    assert ndcg([[0.2, 0.9, 0.5]], [[1, 2, 3]]) == pytest.approx(2 / IDCG_3)
    assert ndcg([[0.2, 0.9, 0.5]], [[1, 2, 3]]) == pytest.approx(0.760188, abs=1e-6)
    assert ndcg([[3, 2, 1]], [[1, 2, 3]]) == pytest.approx(1.0)


def test_ndcg_tie_at_top():
    # (0.9, 0.9, 0.1), rel (2, 1, 0): the tied pair shares positions 1-2 with mean rel 1.5
    expected = (1.5 * (1 + L3) + 0 * 0.5) / IDCG_3
    assert expected == pytest.approx(0.929859, abs=1e-6)
    assert ndcg([[0.9, 0.9, 0.1]], [[1, 2, 3]]) == pytest.approx(expected)


def test_ndcg_all_tied_list():
    # one group over all 3 positions: mean rel 1 times (1 + 1/log2 3 + 1/2)
    expected = 1.0 * (1 + L3 + 0.5) / IDCG_3
    assert expected == pytest.approx(0.809953, abs=1e-6)
    assert ndcg([[0.5, 0.5, 0.5]], [[1, 2, 3]]) == pytest.approx(expected)


def test_ndcg_duplicate_scores_in_the_middle():
    # K=4, scores (4, 2, 2, 1), gold (2, 1, 3, 4) -> rel (2, 3, 1, 0);
    # items 1 and 2 share positions 2-3 with mean rel 2
    dcg = 2 * 1 + 2 * (L3 + 0.5) + 0 / math.log2(5)
    idcg = 3 * 1 + 2 * L3 + 1 * 0.5 + 0
    assert dcg / idcg == pytest.approx(0.894999, abs=1e-6)
    assert ndcg([[4, 2, 2, 1]], [[2, 1, 3, 4]]) == pytest.approx(dcg / idcg)


def test_ndcg_single_item_all_zero_and_mean_over_lists():
    assert ndcg([[0.7]], [[1]]) == 1.0  # one response: trivially in gold order
    assert ndcg([[0.1, 0.9]], [[2, 2]]) == 0.0  # all relevances 0 -> 0, as sklearn
    assert ndcg([[0.7], [0.2, 0.9, 0.5]], [[1], [1, 2, 3]]) == pytest.approx((1 + 2 / IDCG_3) / 2)
    # gold ties at rank 1 (rel 2, 2, 0): any order of the two gold-best is ideal
    assert ndcg([[0.5, 0.9, 0.1]], [[1, 1, 3]]) == pytest.approx(1.0)


def test_ndcg_matches_sklearn_on_random_lists_with_ties():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(7)
    for k in range(2, 8):
        raw_gold = rng.integers(0, 4, size=(40, k))
        # competition ranking with gold ties: rank = 1 + number of strictly better responses
        ranks = 1 + (raw_gold[:, None, :] > raw_gold[:, :, None]).sum(axis=2)
        scores = rng.integers(0, 3, size=(40, k)).astype(float)  # few values: many predicted ties
        rel = k - ranks
        ours = ndcg(scores.tolist(), ranks.tolist())
        assert ours == pytest.approx(sk.ndcg_score(rel, scores, ignore_ties=False), abs=1e-12)
        for row in range(5):
            assert ndcg([scores[row]], [ranks[row]]) == pytest.approx(
                sk.ndcg_score(rel[row : row + 1], scores[row : row + 1])
            )
    assert sk.ndcg_score([[0, 0]], [[0.1, 0.9]]) == 0.0  # the all-zero rule we copy


def test_listwise_result_counts_failed_lists():
    scores = [[0.9, 0.1, 0.5], None, [0.5, None, 0.2], [0.7, 0.7, 0.1]]
    found = lists(scores, [[1, 3, 2], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    acc, gain = TOP1_ACC.result(found), NDCG.result(found)
    assert (acc.value, acc.n, acc.n_failed, acc.tie_rate) == (0.25, 4, 2, 0.25)
    # perfect list (1.0) + tie-at-top list + two failed lists at 0
    assert gain.value == pytest.approx((1.0 + 1.5 * (1 + L3) / IDCG_3) / 4)
    assert (gain.n, gain.n_failed) == (4, 2)
    assert json.loads(json.dumps(gain.to_json()))["name"] == "ndcg"


# --- bootstrap and AVG@k --------------------------------------------------------------------------


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    values = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 1] * 5
    lo, hi = bootstrap_ci(values, seed=3)
    assert lo < np.mean(values) < hi and 0 <= lo and hi <= 1
    assert bootstrap_ci(values, seed=3) == (lo, hi)
    graded = [(i * i % 17) / 17 for i in range(40)]  # continuous values, so quantiles differ between seeds
    assert bootstrap_ci(graded, seed=4) != bootstrap_ci(graded, seed=5)
    assert bootstrap_ci(graded, seed=4) == bootstrap_ci(graded, seed=4)
    lo90, hi90 = bootstrap_ci(values, alpha=0.10, seed=3)
    assert lo <= lo90 and hi90 <= hi
    assert bootstrap_ci([0.4] * 10) == (pytest.approx(0.4), pytest.approx(0.4))
    with pytest.raises(ValueError):
        bootstrap_ci(values, alpha=0.0)


def test_avg_at_k():
    mean, std, lo, hi = avg_at_k([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and (lo, hi) == (0.5, 0.7)
    assert std == pytest.approx(math.sqrt((0.01 + 0 + 0.01) / 3))  # population std
    assert avg_at_k([0.3]) == (0.3, 0.0, 0.3, 0.3)


# --- JudgeBench -----------------------------------------------------------------------------------

# Decisions per order: +1 right, -1 wrong, 0 tie, None unparsable (adds 0). Correct iff the sum is > 0.
JUDGEBENCH_TABLE = {
    (1, 1): True, (1, 0): True, (1, None): True, (1, -1): False,
    (0, 0): False, (0, None): False, (0, -1): False,
    (None, None): False, (None, -1): False, (-1, -1): False,
}  # fmt: skip


@pytest.mark.parametrize(("first", "second"), list(itertools.product([1, 0, -1, None], repeat=2)))
def test_judgebench_truth_table(first, second):
    key = (first, second) if (first, second) in JUDGEBENCH_TABLE else (second, first)
    assert judgebench_pair_correct([first, second]) is JUDGEBENCH_TABLE[key]


def test_judgebench_rejects_bad_decisions_and_maps_scores():
    for bad in (2, True, "A>B"):
        with pytest.raises(ValueError):
            judgebench_pair_correct([bad, 1])
    assert decisions_from_scores([(0.9, 0.1), (0.5, 0.5), (0.1, 0.9), (None, 0.3)]) == [1, 0, -1, None]


def test_judgebench_result_accounting():
    r = judgebench_result([[1, 1], [1, -1], [None, 1], [None, None], [-1, 0]])
    # correct: yes, no, yes, no, no; sums 2, 0, 1, 0, -1 -> two ties; two pairs with an unparsable order
    assert (r.value, r.n, r.n_failed, r.tie_rate) == (0.4, 5, 2, 0.4)


def test_judgebench_published_check_value(shared_data):
    path = (
        shared_data
        / "judgebench"
        / "judge_outputs"
        / "gpt-4o-2024-05-13_pairs__arena_hard_judge__o1-mini-2024-09-12.jsonl"
    )
    if not path.is_file():
        pytest.skip(f"missing {path.name}")
    flip = {"A>B": "B>A", "B>A": "A>B"}
    per_pair = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        first, second = (j["decision"] for j in rec["judgments"])
        label = rec["label"]
        in_gold_frame = [first, flip.get(second, second)]  # the second run saw the responses swapped
        per_pair.append([1 if d == label else -1 if d == flip[label] else 0 for d in in_gold_frame])
    assert len(per_pair) == 350
    assert judgebench_result(per_pair).value * 100 == pytest.approx(65.71, abs=0.005)


# --- RM-Bench -------------------------------------------------------------------------------------


def _nine(pattern: list[list[bool | None]]) -> list[tuple[int, int, bool | None]]:
    return [(c, r, pattern[c][r]) for c in range(3) for r in range(3)]


def test_rm_bench_matrix_nine_pairs():
    # rows = chosen style (concise, plain, markdown), columns = rejected style
    pattern = [
        [True, False, False],  # concise chosen loses to both fancier rejected responses (Hard cells)
        [True, True, False],
        [True, True, True],
    ]
    m = rm_bench_matrix(_nine(pattern))
    assert (m["hard"], m["normal"], m["easy"]) == (0.0, 1.0, 1.0)
    assert m["overall"] == pytest.approx(6 / 9)
    assert m["matrix"] == [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert (m["n"], m["n_failed"]) == (9, 0)


def test_rm_bench_matrix_averages_cells_not_pairs():
    two_prompts = _nine([[True, True, False]] * 3) + _nine(
        [[False, False, False], [True, None, False], [True] * 3]
    )
    m = rm_bench_matrix(two_prompts)
    # cells: (0,1) 1/2, (0,2) 0, (1,2) 0 -> hard 1/6;
    # diagonal (0,0) 1/2, (1,1) 1/2 (the failure counts wrong), (2,2) 1/2 -> normal 1/2
    assert m["hard"] == pytest.approx(1 / 6) and m["normal"] == pytest.approx(0.5)
    assert m["easy"] == pytest.approx((1 + 1 + 1) / 3) and m["n_failed"] == 1
    # an extra pair in one cell changes that cell's accuracy, not the region's weighting
    m2 = rm_bench_matrix(two_prompts + [(0, 1, True)])
    assert m2["hard"] == pytest.approx((2 / 3 + 0 + 0) / 3)  # pooled pairs would give 2/7


def test_rm_bench_errors_and_domain_average():
    with pytest.raises(ValueError):
        rm_bench_matrix(_nine([[True] * 3] * 3)[:-1])  # a missing cell
    with pytest.raises(ValueError):
        rm_bench_matrix([(0, 3, True)])
    chat = {"hard": 0.2, "normal": 0.5, "easy": 0.8, "overall": 0.5}
    code = {"hard": 0.4, "normal": 0.6, "easy": 0.8, "overall": 0.6}
    avg = rm_bench_domain_average({"chat": chat, "code": code})
    assert avg == pytest.approx({"hard": 0.3, "normal": 0.55, "easy": 0.8, "overall": 0.55})
