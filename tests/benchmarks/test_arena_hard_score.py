"""Arena-Hard v2.0 scoring (`benchmarks.arena_hard_score`) and the judge's label reader on hand-built verdict sets, checked against hand arithmetic,
the real baseline answers' style metadata, and torch's L-BFGS as upstream configures it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.arena_hard_score import (
    BASELINES,
    AnswerStyle,
    ArenaGame,
    arena_hard_score,
    battles,
    fit_bradley_terry,
    style_features,
)
from harness.errors import ConfigError
from harness.seeds import derive_seed
from judges.arena_hard import parse_verdict


def pair(uid: str, category: str, baseline_as_a: str | None, model_as_a: str | None, judge: str = "") -> list:
    """Both games of one question: upstream's game 1 (baseline shown as A), then game 2 (model shown as A)."""
    return [
        ArenaGame(uid, category, baseline_as_a, model_as_a=False, judge=judge),
        ArenaGame(uid, category, model_as_a, model_as_a=True, judge=judge),
    ]


# Hard prompts. Model's outcomes per question, model-as-A game first (as upstream's battle rows):
#   h1: model-as-A "A>B" -> 1; baseline-as-A "B>>A" -> baseline 0 -> model 1, strong x3 -> [1, 1, 1, 1]
#   h2: model-as-A "A<B" -> 0; baseline-as-A "A=B" (a tie) -> 0.5                    -> [0, 0.5]
#   h3: model-as-A "B>A" -> 0; baseline-as-A "A>>B" -> baseline 1 -> model 0, x3      -> [0, 0, 0, 0]
#   h4: baseline-as-A unparsed -> the whole question is dropped (1 unparsed game, 1 dropped question)
#   10 rows summing to 4 + 0.5 + 0 = 4.5 -> win rate 4.5 / 10 = 0.45; 6 kept games, 1 tie.
HARD = [
    *pair("h1", "hard_prompt", "B>>A", "A>B"),
    *pair("h2", "hard_prompt", "A=B", "A<B"),
    *pair("h3", "hard_prompt", "A>>B", "B>A"),
    *pair("h4", "hard_prompt", None, "A>>B"),
]
HARD_ROWS = [1, 1, 1, 1, 0, 0.5, 0, 0, 0, 0]
# Creative writing:
#   c1: model-as-A "A=B" -> 0.5; baseline-as-A "B>A" -> baseline 0 -> model 1           -> [0.5, 1]
#   c2: model-as-A "B<<A" -> A much better -> 1 x3; baseline-as-A "B<<A" -> model 0 x3  -> [1, 1, 1, 0, 0, 0]
#   c3: both games unparsed -> dropped (2 unparsed games, 1 dropped question)
#   8 rows summing to 1.5 + 3 = 4.5 -> win rate 4.5 / 8 = 0.5625; 4 kept games, 1 tie.
CREATIVE = [
    *pair("c1", "creative_writing", "B>A", "A=B"),
    *pair("c2", "creative_writing", "B<<A", "B<<A"),
    *pair("c3", "creative_writing", None, None),
]


# ------------------------------------------------------------------------------------------------------------
# Parsing (gen_judgment.get_score with the v2.0 config's patterns)


@pytest.mark.parametrize(
    "text, label",
    [
        ("My final verdict is tie: [[A=B]]", "A=B"),
        ("Assistant B is significantly better: [[B>>A]]", "B>>A"),
        ("lower case counts: [[a>b]]", "A>B"),
        ("mirrored spellings are scored too: [[B<<A]]", "B<<A"),
        # The last match of the first pattern that matches at all wins...
        ("At first [[A>>B]], but on reflection [[A=B]]", "A=B"),
        # ...so a double-bracket label beats a later single-bracket one.
        ("Verdict [[B>A]]; the format was [A>B]", "B>A"),
        # Single brackets are the fallback pattern.
        ("My verdict: [A>B]", "A>B"),
        ("No label here.", None),
        ("[[A > B]]", None),  # spaces are not in the label's character class
        # A decided label outside the ten scored ones gives None, even after an earlier valid one
        # (upstream returns "A" here and fails on it in show_result.load_judgments).
        ("[[A>B]] ... then [[A]]", None),
        ("[[A>B>B]]", None),
    ],
)
def test_parse_verdict(text: str, label: str | None):
    assert parse_verdict(text) == label


def test_a_game_accepts_only_scored_labels():
    with pytest.raises(ConfigError, match="not one of"):
        ArenaGame("q", "hard_prompt", "A", model_as_a=True)
    with pytest.raises(ConfigError, match="no outcome"):
        ArenaGame("q", "hard_prompt", None, model_as_a=True).model_outcomes()


@pytest.mark.parametrize(
    "verdict, model_as_a, outcomes",
    [
        ("A>>B", True, (1.0, 1.0, 1.0)),  # the model is A and much better: 3 wins
        ("A>>B", False, (0.0, 0.0, 0.0)),  # the baseline is A and much better: 3 losses
        ("B>A", False, (1.0,)),
        ("A<<B", True, (0.0, 0.0, 0.0)),
        ("B=A", False, (0.5,)),
    ],
)
def test_model_outcomes_per_game(verdict: str, model_as_a: bool, outcomes: tuple[float, ...]):
    assert ArenaGame("q", "hard_prompt", verdict, model_as_a).model_outcomes() == outcomes


def test_battles_are_upstreams_rows_and_drop_unparsed_questions():
    rows = battles(HARD)
    assert [r.outcome for r in rows] == HARD_ROWS
    assert [r.uid for r in rows] == ["h1"] * 4 + ["h2"] * 2 + ["h3"] * 4


def test_swapped_positions_cancel_a_position_bias():
    # A judge that always prefers A: the model loses as B and wins as A -> rows [1, 0] -> 0.5.
    biased = pair("q", "hard_prompt", "A>B", "A>B")
    assert [r.outcome for r in battles(biased)] == [1.0, 0.0]
    # Both orders agree the model is better -> [1, 1].
    assert [r.outcome for r in battles(pair("q", "hard_prompt", "B>A", "A>B"))] == [1.0, 1.0]


# ------------------------------------------------------------------------------------------------------------
# Scores


def test_categories_are_scored_separately_with_their_counts():
    result = arena_hard_score(HARD + CREATIVE)
    assert [c.category for c in result.categories] == ["creative_writing", "hard_prompt"]
    assert result.style_control is False and result.bootstrap_rounds == 100
    hard, creative = result.category("hard_prompt"), result.category("creative_writing")
    assert hard.baseline == "o3-mini-2025-01-31" and creative.baseline == "gemini-2.0-flash-001"
    assert hard.win_rate == pytest.approx(0.45)
    assert creative.win_rate == pytest.approx(0.5625)
    counts = ("n_questions", "n_games", "n_battles", "n_ties", "n_unparsed", "n_dropped")
    assert [getattr(hard, k) for k in counts] == [3, 6, 10, 1, 1, 1]
    assert [getattr(creative, k) for k in counts] == [2, 4, 8, 1, 2, 1]
    assert hard.tie_rate == pytest.approx(1 / 6) and creative.tie_rate == pytest.approx(1 / 4)
    for c in (hard, creative):
        assert c.lower <= c.score <= c.upper and c.style_coefs == ()
    json.dumps(result.to_json())


def test_score_is_the_mean_of_row_bootstrap_means_with_a_5_95_interval():
    # show_result.print_leaderboard: resample the 10 battle rows with replacement, 100 times; the score is the
    # mean of the 100 resample means, the interval their 5% and 95% quantiles.
    seed = 7
    result = arena_hard_score(HARD, seed=seed).category("hard_prompt")
    rng = np.random.default_rng(derive_seed(seed, "arena-hard", "hard_prompt"))
    means = np.array(HARD_ROWS, dtype=float)[rng.integers(0, 10, size=(100, 10))].mean(axis=1)
    assert result.score == pytest.approx(means.mean())
    assert (result.lower, result.upper) == pytest.approx(tuple(np.quantile(means, [0.05, 0.95])))
    # With many resamples the bootstrap mean approaches the win rate 0.45 (standard error about
    # sqrt(0.2225 / 10) / sqrt(4000) = 0.0024).
    many = arena_hard_score(HARD, bootstrap_rounds=4000).category("hard_prompt")
    assert many.score == pytest.approx(0.45, abs=0.015)


def test_a_model_that_wins_everything_scores_1_with_no_spread():
    games = pair("a", "hard_prompt", "B>>A", "A>>B") + pair("b", "hard_prompt", "B>A", "A>B")
    c = arena_hard_score(games).category("hard_prompt")
    assert (c.score, c.lower, c.upper, c.win_rate, c.n_battles) == (1.0, 1.0, 1.0, 1.0, 8)


def test_bootstrap_is_deterministic_per_seed_and_per_category():
    a, b = arena_hard_score(HARD + CREATIVE, seed=3), arena_hard_score(HARD + CREATIVE, seed=3)
    assert a == b
    other = arena_hard_score(HARD + CREATIVE, seed=4).category("hard_prompt")
    assert (other.score, other.lower, other.upper) != (a.category("hard_prompt").score,) + (
        a.category("hard_prompt").lower,
        a.category("hard_prompt").upper,
    )
    # Each category draws from its own derived seed: removing one leaves the other unchanged.
    assert arena_hard_score(HARD, seed=3).category("hard_prompt") == a.category("hard_prompt")


def test_a_judge_ensemble_keeps_each_judges_record():
    games = pair("q", "creative_writing", "B>A", "A>B", judge="gpt-4.1") + pair(
        "q", "creative_writing", "A>B", None, judge="gemini-2.5"
    )
    c = arena_hard_score(games).category("creative_writing")
    # gpt-4.1's record: [1, 1]; gemini-2.5's is dropped (its model-as-A game is unparsed).
    assert (c.n_questions, c.n_games, c.n_battles, c.n_unparsed, c.n_dropped) == (1, 2, 2, 1, 1)
    assert c.win_rate == 1.0


def test_a_category_whose_questions_all_dropped_has_no_score_but_counts():
    c = arena_hard_score(pair("q", "hard_prompt", None, "A>B")).category("hard_prompt")
    assert (c.score, c.lower, c.upper, c.win_rate, c.tie_rate) == (None, None, None, None, None)
    assert (c.n_questions, c.n_games, c.n_unparsed, c.n_dropped) == (0, 0, 1, 1)


@pytest.mark.parametrize(
    "games, kwargs, message",
    [
        ([], {}, "no games"),
        (pair("q", "hard_prompt", "A>B", "A>B"), {"bootstrap_rounds": 0}, "bootstrap_rounds"),
        (pair("q", "coding_v9", "A>B", "A>B"), {}, "no baseline; known: hard_prompt"),
        (pair("q", "hard_prompt", "A>B", "A>B")[:1], {}, "lacks its game with the model as A"),
        (
            pair("q", "hard_prompt", "A>B", "A>B") + pair("q", "hard_prompt", "A>B", "A>B")[:1],
            {},
            "two games",
        ),
        (
            [ArenaGame("q", "hard_prompt", "A>B", False), ArenaGame("q", "math", "A>B", True)],
            {},
            "categories",
        ),
        (pair("q", "hard_prompt", "A>B", "A>B"), {"style_control": True}, "needs model_style"),
        (pair("q", "hard_prompt", "A>B", "A>B"), {"model_style": {}}, "style_control is off"),
    ],
)
def test_bad_input_is_a_config_error(games: list, kwargs: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        arena_hard_score(games, **kwargs)


def test_asking_for_an_unscored_category_lists_the_scored_ones():
    with pytest.raises(ConfigError, match="scored: hard_prompt"):
        arena_hard_score(HARD).category("creative_writing")


def test_baselines_follow_judge_settings():
    assert BASELINES["hard_prompt"] == BASELINES["coding"] == BASELINES["math"] == "o3-mini-2025-01-31"
    assert BASELINES["creative_writing"] == "gemini-2.0-flash-001"


# ------------------------------------------------------------------------------------------------------------
# Style control


def test_style_counts_from_text_skip_code_blocks():
    text = (
        "# Title\n## Sub\n#NoSpace\n1. one\n2. two\n- a\n* b\n**bold** and __also__ and **x**\n"
        "```python\n# comment in code\n- not a list\n```\n"
    )
    # Headers "# Title", "## Sub" (not "#NoSpace", not the code comment); lists "1.", "2.", "-", "*";
    # bold "**bold**", "__also__", "**x**".
    assert AnswerStyle.from_text(text, token_len=40) == AnswerStyle(40, 2, 4, 3)
    meta = {
        "token_len": 40,
        "header_count": {"h1": 1, "h2": 1},
        "list_count": {"ordered": 2, "unordered": 2},
        "bold_count": {"**": 2, "__": 1},
    }
    assert AnswerStyle.from_metadata(meta) == AnswerStyle(40, 2, 4, 3)
    with pytest.raises(ConfigError, match="lacks 'bold_count'"):
        AnswerStyle.from_metadata({k: v for k, v in meta.items() if k != "bold_count"})


def test_style_counts_match_upstream_metadata_of_the_baseline_answers(shared_data: Path):
    path = shared_data / "arena_hard_v2" / "model_answer" / "o3-mini-2025-01-31.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    n = 0
    for line in path.read_text(encoding="utf-8").split("\n")[:-1]:  # answers hold U+2028: no splitlines()
        record = json.loads(line)
        meta = record["metadata"]
        text = record["messages"][-1]["content"]["answer"]
        assert AnswerStyle.from_text(text, token_len=meta["token_len"]) == AnswerStyle.from_metadata(meta), (
            record["uid"]
        )
        n += 1
    assert n == 750


def test_style_features_by_hand():
    model, baseline = AnswerStyle(300, 3, 0, 1), AnswerStyle(100, 0, 2, 1)
    # length: (300 - 100) / (300 + 100) = 0.5
    # headers: d_m = 3/301, d_b = 0 -> (3/301) / (3/301 + 1) = 3/304
    # lists: d_m = 0, d_b = 2/101 -> (-2/101) / (2/101 + 1) = -2/103
    # bold: d_m = 1/301, d_b = 1/101 -> (1/301 - 1/101) / (1/301 + 1/101 + 1) = (101 - 301) / (101 + 301 + 30401)
    assert style_features(model, baseline) == pytest.approx((0.5, 3 / 304, -2 / 103, -200 / 30803))
    with pytest.raises(ConfigError, match="token_len 0"):
        style_features(AnswerStyle(0, 0, 0, 0), AnswerStyle(0, 0, 0, 0))


def _synthetic(n: int = 60):
    """Questions where the model wins more often the longer its answer is than the baseline's (300 tokens)."""
    rng = np.random.default_rng(0)
    games, model_style, baseline_style = [], {}, {}
    for i in range(n):
        uid, length = f"q{i}", int(rng.integers(100, 600))
        model_style[uid] = AnswerStyle(length, *(int(c) for c in rng.integers(0, 5, size=3)))
        baseline_style[uid] = AnswerStyle(300, *(int(c) for c in rng.integers(0, 5, size=3)))
        p_win = 0.2 + 0.6 * (length - 100) / 500
        wins = rng.random(2) < p_win
        games += pair(uid, "hard_prompt", "B>A" if wins[0] else "A>B", "A>B" if wins[1] else "B>A")
    return games, model_style, baseline_style


def test_style_control_is_upstreams_bootstrapped_bradley_terry_fit():
    games, model_style, baseline_style = _synthetic()
    styles = {"model_style": model_style, "baseline_style": baseline_style}
    result = arena_hard_score(games, bootstrap_rounds=20, style_control=True, **styles)
    styled = result.category("hard_prompt")
    assert result.style_control is True and styled.n_battles == 120
    assert styled.lower <= styled.score <= styled.upper
    assert len(styled.style_coefs) == 4 and styled.style_coefs[0] > 0  # longer answers win more
    # show_result.print_leaderboard_with_style_features: features [+1 model, -1 baseline, the four style
    # differences standardised over the battle rows (sample std)], a fit per resample of the rows (here 20), the
    # median of exp(c_m) / (exp(c_m) + exp(c_b)) and its 5% / 95% quantiles.
    rows = battles(games)
    raw = np.array([style_features(model_style[r.uid], baseline_style[r.uid]) for r in rows])
    x = np.hstack([np.tile([1.0, -1.0], (len(rows), 1)), (raw - raw.mean(0)) / raw.std(0, ddof=1)])
    y = np.array([r.outcome for r in rows])
    rng = np.random.default_rng(derive_seed(0, "arena-hard", "hard_prompt"))
    fits = np.array([fit_bradley_terry(x[i], y[i]) for i in rng.integers(0, len(rows), size=(20, len(rows)))])
    p = 1 / (1 + np.exp(fits[:, 1] - fits[:, 0]))
    assert styled.score == pytest.approx(np.median(p))
    assert (styled.lower, styled.upper) == pytest.approx(tuple(np.quantile(p, [0.05, 0.95])))
    assert styled.style_coefs == pytest.approx(tuple(np.median(fits[:, 2:], axis=0)))
    again = arena_hard_score(games, bootstrap_rounds=20, style_control=True, **styles)
    assert again == result and arena_hard_score(games).style_control is False


def test_style_control_errors():
    games, model_style, baseline_style = _synthetic()
    with pytest.raises(ConfigError, match="no baseline answer style for question 'q3'"):
        arena_hard_score(
            games,
            style_control=True,
            model_style=model_style,
            baseline_style={k: v for k, v in baseline_style.items() if k != "q3"},
        )
    flat = {k: AnswerStyle(v.token_len, 0, v.list_count, v.bold_count) for k, v in model_style.items()}
    flat_base = {
        k: AnswerStyle(v.token_len, 0, v.list_count, v.bold_count) for k, v in baseline_style.items()
    }
    with pytest.raises(ConfigError, match="cannot standardise headers"):
        arena_hard_score(games, style_control=True, model_style=flat, baseline_style=flat_base)


def test_an_indicator_only_fit_recovers_the_win_rate():
    # One column pair (+1 model, -1 baseline): the fitted win probability is the mean outcome 0.45, up to
    # what upstream's 50 fixed L-BFGS steps of 0.1 leave.
    x = np.tile([1.0, -1.0], (10, 1))
    w = fit_bradley_terry(x, np.array(HARD_ROWS))
    assert 1 / (1 + np.exp(w[1] - w[0])) == pytest.approx(0.45, abs=0.005)


def _torch_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """utils/math_utils.fit_pairwise_model(loss_type="bt"): weights at 0.5, summed BCE with logits,
    LBFGS(lr=0.1, max_iter=50, tolerance_grad=1e-9, tolerance_change=1e-9), one step (here in float64)."""
    import torch

    tx, ty = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    w = torch.nn.Parameter(torch.full((x.shape[1],), 0.5, dtype=torch.float64))
    opt = torch.optim.LBFGS([w], lr=0.1, max_iter=50, tolerance_grad=1e-9, tolerance_change=1e-9)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(tx @ w, ty, reduction="sum")
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy()


@pytest.mark.parametrize("n, all_wins", [(6, False), (80, False), (300, False), (50, True)])
def test_fit_matches_torch_lbfgs_as_upstream_configures_it(n: int, all_wins: bool):
    pytest.importorskip("torch")
    rng = np.random.default_rng(n)
    x = np.hstack([np.tile([1.0, -1.0], (n, 1)), rng.normal(size=(n, 4))])
    # A model that wins every battle has no finite maximum; the 50 fixed steps still give upstream's number.
    y = np.ones(n) if all_wins else rng.choice([0.0, 0.5, 1.0], size=n, p=[0.5, 0.1, 0.4])
    assert fit_bradley_terry(x, y) == pytest.approx(_torch_fit(x, y), abs=1e-6)
