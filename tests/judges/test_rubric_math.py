"""Scores and rewards from weights and verdicts, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from judges.rubric import aggregate, anchor_reward, disc_reward, item_pass_rates, saturated_share


def log_sigmoid(x: float) -> float:
    return math.log(1.0 / (1.0 + math.exp(-x)))


# --- aggregate ---


def test_aggregate_two_items_two_responses():
    # response 1 passes both items: (3 + 1) / 4; response 2 passes only item 2: 1 / 4
    np.testing.assert_allclose(aggregate([3, 1], [[1, 0], [1, 1]]), [1.0, 0.25])


# A 3-item, 4-response case used below. Rows are items, columns responses.
W3 = [2, 1, 3]
V3 = [
    [1, 1, 0, 0],  # p = 0.5,  p(1-p) = 0.25
    [1, 1, 1, 1],  # p = 1.0,  p(1-p) = 0
    [1, 0, 0, 0],  # p = 0.25, p(1-p) = 0.1875
]


def test_aggregate_three_items_four_responses_with_a_tie():
    scores = aggregate(W3, V3)
    # (2+1+3)/6, (2+1)/6, 1/6, 1/6: responses 3 and 4 tie and stay tied
    np.testing.assert_allclose(scores, [1.0, 0.5, 1 / 6, 1 / 6])
    assert scores[2] == scores[3]
    assert scores.shape == (4,) and scores.dtype == np.float64


def test_aggregate_soft_verdicts():
    # 0.9*2 + 0.2*1 = 2.0 -> 2/3;  0.5*2 + 1.0*1 = 2.0 -> 2/3 (a tie under soft verdicts too)
    np.testing.assert_allclose(aggregate([2, 1], [[0.9, 0.5], [0.2, 1.0]]), [2 / 3, 2 / 3])


def test_aggregate_single_response_and_zero_weight_item():
    np.testing.assert_allclose(aggregate([4, 1], [[1], [0]]), [0.8])
    # a zero weight is allowed as long as the sum is positive: that item simply does not count
    np.testing.assert_allclose(aggregate([0, 2], [[1, 0], [0, 1]]), [0.0, 1.0])


def test_aggregate_accepts_bool_verdicts():
    np.testing.assert_allclose(
        aggregate(np.array([1, 1]), np.array([[True, False], [True, True]])), [1.0, 0.5]
    )


@pytest.mark.parametrize(
    ("weights", "verdicts", "message"),
    [
        ([1, 2, 3], [[1, 0], [1, 1]], "3 weights but 2 verdict rows"),
        ([1, 2], [1, 0], "2-D"),
        ([[1, 2]], [[1, 0], [1, 1]], "1-D"),
        ([0, 0], [[1, 0], [1, 1]], "sum to 0"),
        ([-1, 2], [[1, 0], [1, 1]], "non-negative"),
        ([np.nan, 1], [[1, 0], [1, 1]], "weights contain NaN"),
        ([np.inf, 1], [[1, 0], [1, 1]], "weights contain NaN or inf"),
        ([1, 1], [[np.nan, 0], [1, 1]], "verdicts contain NaN"),
        ([1, 1], [[1, 0], [1, np.inf]], "verdicts contain NaN or inf"),
        ([1, 1], [[1, 2], [1, 1]], "[0, 1]"),
        ([1, 1], [[1, -0.1], [1, 1]], "[0, 1]"),
        ([], np.zeros((0, 3)), "M == 0"),
        ([1], np.zeros((1, 0)), "K == 0"),
    ],
)
def test_aggregate_and_disc_reject_bad_input(weights, verdicts, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        aggregate(weights, verdicts)
    with pytest.raises(ValueError):
        disc_reward(weights, verdicts)


# --- disc reward ---


def test_disc_reward_three_items_four_responses():
    # (2 * 0.25 + 1 * 0 + 3 * 0.1875) / (2 + 1 + 3) = 1.0625 / 6
    assert disc_reward(W3, V3) == pytest.approx(1.0625 / 6)


def test_disc_reward_bounds():
    # every item splits the set in half: each p(1-p) = 1/4, the maximum
    assert disc_reward([1, 5], [[1, 0, 1, 0], [0, 0, 1, 1]]) == pytest.approx(0.25)
    # every item saturated: nothing separates the responses
    assert disc_reward([3, 2], [[1, 1, 1], [0, 0, 0]]) == 0.0


def test_disc_reward_single_response():
    # K == 1 with 0/1 verdicts: p is 0 or 1, so every item has zero variance
    assert disc_reward([2, 3], [[1], [0]]) == 0.0
    # with soft verdicts p = the probability itself: (2 * 0.5 * 0.5 + 3 * 0.2 * 0.8) / 5 = (0.5 + 0.48) / 5
    assert disc_reward([2, 3], [[0.5], [0.2]]) == pytest.approx(0.98 / 5)


def test_disc_reward_soft_verdicts():
    # p = mean(0.9, 0.3) = 0.6 -> 0.24 ; p = mean(0.5, 0.5) = 0.5 -> 0.25 ; (1 * 0.24 + 3 * 0.25) / 4
    assert disc_reward([1, 3], [[0.9, 0.3], [0.5, 0.5]]) == pytest.approx(0.99 / 4)


# --- trace helpers ---


def test_item_pass_rates_and_saturated_share():
    np.testing.assert_allclose(item_pass_rates(V3), [0.5, 1.0, 0.25])
    assert saturated_share(V3) == pytest.approx(1 / 3)
    assert saturated_share([[0, 0], [1, 1]]) == 1.0
    assert saturated_share([[0.0, 0.999]]) == 0.0  # soft verdicts saturate only at exactly 0 or 1
    assert saturated_share([[1], [0], [1]]) == 1.0  # K == 1: every item is saturated


def test_trace_helpers_validate():
    for bad in ([[np.nan]], [1, 0], [[1.5]], np.zeros((0, 2))):
        with pytest.raises(ValueError):
            item_pass_rates(bad)
        with pytest.raises(ValueError):
            saturated_share(bad)


# --- anchor reward ---


def test_anchor_reward_three_responses_by_hand():
    # S_1 = 0.8 (gold rank 1), S_2 = 0.5, S_3 = 0.2. Terms log sigmoid(S_i - S_j) / ((j - i) * 2^(i-1)):
    #   (1,2): gap 0.3, discount (2-1) * 2^0 = 1
    #   (1,3): gap 0.6, discount (3-1) * 2^0 = 2
    #   (2,3): gap 0.3, discount (3-2) * 2^1 = 2
    expected = log_sigmoid(0.3) / 1 + log_sigmoid(0.6) / 2 + log_sigmoid(0.3) / 2
    assert expected == pytest.approx(-1.0502768, abs=1e-7)
    assert anchor_reward([0.8, 0.5, 0.2]) == pytest.approx(expected, rel=1e-12)


def test_anchor_reward_two_responses_is_one_log_sigmoid():
    assert anchor_reward([1.0, 0.0]) == pytest.approx(log_sigmoid(1.0))
    assert anchor_reward(np.array([0.0, 1.0])) == pytest.approx(log_sigmoid(-1.0))


def test_anchor_reward_ties():
    # all tied: each pair is log(1/2), discounts 1, 2, 2 -> (1 + 1/2 + 1/2) * log(1/2)
    assert anchor_reward([0.4, 0.4, 0.4]) == pytest.approx(-2 * math.log(2))
    # a tie is worse than the right order and better than the wrong one
    assert anchor_reward([0.6, 0.4]) > anchor_reward([0.5, 0.5]) > anchor_reward([0.4, 0.6])


def test_anchor_reward_is_non_positive_and_stable():
    rng = np.random.default_rng(0)
    for n in (2, 3, 7):
        for _ in range(50):
            assert anchor_reward(rng.random(n)) < 0.0
    # large gaps: no overflow, the right order tends to 0, the wrong one to -(gap * weight sum)
    assert anchor_reward([1e4, 0.0]) == pytest.approx(0.0, abs=1e-12)
    assert anchor_reward([0.0, 1e4]) == pytest.approx(-1e4)


def test_anchor_reward_swapping_a_better_ranked_pair_lowers_it():
    ordered = [0.9, 0.6, 0.3, 0.1]
    base = anchor_reward(ordered)
    for a in range(len(ordered)):
        for b in range(a + 1, len(ordered)):
            swapped = list(ordered)
            swapped[a], swapped[b] = swapped[b], swapped[a]
            assert anchor_reward(swapped) < base, (a, b)
    assert anchor_reward(ordered[::-1]) < base


def test_anchor_reward_swapping_the_best_always_lowers_it():
    rng = np.random.default_rng(1)
    for _ in range(200):
        scores = np.sort(rng.random(7))[::-1]
        base = anchor_reward(scores)
        for b in range(1, 7):
            swapped = scores.copy()
            swapped[[0, b]] = swapped[[b, 0]]
            assert anchor_reward(swapped) < base


def test_anchor_reward_known_non_monotonicity_deep_in_a_long_list():
    # The 2^(i-1) discount makes low-ranked pairs nearly free (documented in anchor_reward): with 7 evenly
    # spaced scores, putting ranks 6 and 7 in the wrong order raises the reward slightly (pins the formula).
    scores = np.linspace(1.0, 0.0, 7)
    swapped = scores.copy()
    swapped[[5, 6]] = swapped[[6, 5]]
    assert anchor_reward(swapped) - anchor_reward(scores) == pytest.approx(0.0026, abs=1e-4)


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ([0.5], "at least 2"),
        ([], "at least 2"),
        ([0.5, np.nan], "NaN"),
        ([np.inf, 0.1], "NaN or inf"),
        ([[1, 0]], "1-D"),
    ],
)
def test_anchor_reward_rejects_bad_input(scores, message):
    with pytest.raises(ValueError, match=message):
        anchor_reward(scores)
