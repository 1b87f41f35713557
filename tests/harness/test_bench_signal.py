"""`harness bench reward-signal`'s arithmetic and its go rule."""

from __future__ import annotations

import math

import pytest

from harness.commands.bench_signal import THRESHOLDS, Signal, measure, pair_accuracy, spearman
from judges.base import Trace


def _trace(verdicts):
    return Trace(rubric=[{"criterion": f"c{i}", "weight": 1} for i in range(len(verdicts))], verdicts=verdicts)


def test_pair_accuracy_counts_ties_half_and_skips_unscored():
    assert pair_accuracy([1.0, 0.5, 0.0]) == (1.0, 3)
    assert pair_accuracy([0.0, 1.0]) == (0.0, 1)
    assert pair_accuracy([0.5, 0.5, None]) == (0.5, 1)
    share, pairs = pair_accuracy([None, None])
    assert pairs == 0 and math.isnan(share)


def test_spearman_ranks_ties_and_refuses_a_constant_list():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_measure_reads_spread_values_agreement_yes_rate_and_clipping():
    groups = [
        {"first": ([0.0, 0.5, 1.0, 1.0], _trace([[0, 1, 1, 1], [0, 0, 1, 1]])),
         "second": ([0.0, 1.0, 0.5, 1.0], _trace([[0, 1, 0, 1], [0, 1, 1, 1]])),
         "anchor": [1.0, 0.0], "clipped": [True, False, False, False]},
        {"first": ([0.0, 0.0, 0.0, 0.0], _trace([[0, 0, 0, 0]])),
         "second": ([0.0, 0.0, 0.0, None], _trace([[0, 0, 0, None]])),
         "anchor": [0.0, 0.0], "clipped": [None, None, False, False]},
    ]
    s = measure(groups, prompts=2)
    assert s.zero_spread == 0.5 and s.distinct == 2.0
    assert s.spearman_groups == 1 and s.spearman == pytest.approx(spearman([0, 0.5, 1, 1], [0, 1, 0.5, 1]))
    assert s.yes_rate == pytest.approx(10 / 23)
    assert s.pair_accuracy == pytest.approx(0.75) and s.pairs == 2
    assert s.clipped == pytest.approx(1 / 6)
    assert s.unscored == 1 and s.rubric_items == 1.5


def test_go_needs_every_bound_and_an_unmeasured_figure_is_a_no_go():
    good = Signal(prompts=1, completions=8, zero_spread=0.1, distinct=4, spearman=0.5, yes_rate=0.4,
                  pair_accuracy=0.7, clipped=0.05)
    assert good.go
    for name, bad in [("zero_spread", THRESHOLDS.max_zero_spread + 0.01), ("distinct", 2.0), ("spearman", 0.1),
                      ("yes_rate", 0.95), ("pair_accuracy", 0.5), ("clipped", 0.5), ("spearman", None)]:
        s = Signal(prompts=1, completions=8, zero_spread=0.1, distinct=4, spearman=0.5, yes_rate=0.4,
                   pair_accuracy=0.7, clipped=0.05)
        setattr(s, name, bad)
        assert not s.go, name
        assert [ok for _, ok in s.checks()].count(True) == 5


def test_the_command_names_a_missing_config_and_exits_2(tmp_path):
    from tests.harness.test_cli import harness

    result = harness("bench", "reward-signal", "--config", str(tmp_path / "nowhere.yaml"))
    assert result.returncode == 2, result.stderr
    assert "nowhere.yaml" in result.stderr and "cannot read the training config" in result.stderr
