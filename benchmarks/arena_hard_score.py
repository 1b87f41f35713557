"""Arena-Hard v2.0 (Arena-Hard-Auto) scoring: battles against the baseline, bootstrap scores, style control.

Upstream: `lmarena/arena-hard-auto` (Apache-2.0), snapshot `196f6b8` (2025-06-20), the v2.0 code path:
`gen_judgment.py`, `show_result.py`, `utils/math_utils.py`, `utils/add_markdown_info.py`,
`utils/judge_utils.py` and `config/arena-hard-v2.0.yaml`. This module is our own code for the scoring; the judge
that plays the games and reads their labels is `judges.arena_hard`.

One upstream judgment record (`data/arena-hard-v2.0/model_judgment/<judge>/<model>.jsonl`, abbreviated):
`{"uid": "2edbb5f36f5b42be", "category": "hard_prompt", "judge": "gpt-4.1", "model": "m",
"baseline": "o3-mini-2025-01-31", "games": [{"score": "B>A", ...}, {"score": "A>>B", ...}]}`. Here each of
the two games is an `ArenaGame`.

Official scoring rule (what `show_result.py` does):
- Two games per question (`gen_judgment.judgment`): the first shows the category's baseline as A and the model
  as B, the second swaps them. Baselines (`judge_utils.JUDGE_SETTINGS`): `o3-mini-2025-01-31` for
  `hard_prompt` (and its `coding`/`math` keys), `gemini-2.0-flash-001` for `creative_writing`.
- A game's label is read by `gen_judgment.get_score` with the config's `regex_patterns`
  (`judges.arena_hard.parse_verdict`).
- Each label gives A's points (`show_result.load_judgments`): `A>B` 1, `A=B` 0.5, `A<B` 0 and their mirrored
  spellings; a strong label (`A>>B`, `B>>A`, `A<<B`, `B<<A`) counts 3 times. The model's battles are its own
  points in the game where it is A, plus one minus the baseline's points in the game where the baseline is A.
  A question with either game unparsed (or failed) is dropped, both games; we count it.
- Score (`show_result.print_leaderboard`): each category on its own; 100 bootstrap resamples of the battle
  rows (with replacement, as many rows as there are), the mean outcome of each; the score is the mean of those
  resample means and the interval their 5% and 95% quantiles. Without style control this is a bootstrapped
  win rate, not a Bradley-Terry fit (the code fits Bradley-Terry only under style control).
- Style control (`show_result.print_leaderboard_with_style_features`, `math_utils.bootstrap_pairwise_model`):
  a Bradley-Terry (logistic) fit of the battle outcomes on the model-vs-baseline indicator plus four style
  differences (token length, header, list and bold density; see `style_features`), standardised over the
  battle rows; fitted on 100 bootstrap resamples of the rows; the score is the median of the fitted win
  probabilities against the baseline, the interval their 5% and 95% quantiles.

Values are fractions in [0, 1] (the leaderboard prints percent; the baseline itself is 0.5).

Deviations, stated:
- A label outside the ten scored ones (e.g. `[[A]]`): `get_score` returns it and `load_judgments` then raises
  `KeyError`; here the judge's `parse_verdict` returns None and the question is dropped and counted like an
  unparsed one.
- Random draws come from a numpy `Generator` seeded from (`seed`, category), not from numpy's global state:
  the same procedure, other draws.
- Style control fits one model against its baseline, as upstream does when the judgment folder holds only that
  model; the leaderboard fits every model in the folder at once (shared style coefficients, features
  standardised over all of them). Because the features are centred on their mean over the battles, a lone
  model's win rate is read at its own average style: a systematic length or markdown edge over the baseline
  is not taken out, as it is against a pool's average on the leaderboard. The L-BFGS fit is replicated in
  float64 (upstream runs torch in float32). Upstream's single-feature modes (`-f length`, `-f markdown`)
  slice the wrong columns of its feature matrix, so only the full control (`-f markdown length`, the README's
  official configuration) is offered. Token lengths (upstream: tiktoken's `gpt-4o` encoding) are supplied by
  the caller.
- `show_result.py`'s category loop filters an already filtered frame, so it can only score one category per
  run; here every category in the games is scored from all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.errors import ConfigError
from harness.seeds import derive_seed

if TYPE_CHECKING:
    from benchmarks.base import PolicyItem

__all__ = [
    "BASELINES",
    "LABEL_POINTS",
    "STRONG_WEIGHT",
    "AnswerStyle",
    "ArenaGame",
    "ArenaResult",
    "Battle",
    "CategoryScore",
    "answer_styles",
    "arena_hard_score",
    "battles",
    "fit_bradley_terry",
    "style_features",
]

STRONG_WEIGHT = 3
"""How many battles a strong label counts for (`show_result.load_judgments(weight=3)`)."""
LABEL_POINTS: Mapping[str, float] = {
    "A>>B": 1.0,
    "A>B": 1.0,
    "A=B": 0.5,
    "A<B": 0.0,
    "A<<B": 0.0,
    "B<<A": 1.0,
    "B<A": 1.0,
    "B=A": 0.5,
    "B>A": 0.0,
    "B>>A": 0.0,
}
"""Points of the answer shown as A for each scored label (`show_result.load_judgments`' `label_to_score`)."""
BASELINES: Mapping[str, str] = {
    "hard_prompt": "o3-mini-2025-01-31",
    "coding": "o3-mini-2025-01-31",
    "math": "o3-mini-2025-01-31",
    "creative_writing": "gemini-2.0-flash-001",
}
"""The baseline model per category (`utils/judge_utils.JUDGE_SETTINGS`, v2.0 keys)."""

_CODE_BLOCK = re.compile(r"```([^`]*)```")
_HEADERS = tuple(re.compile(rf"^#{{{level}}}\s", re.MULTILINE) for level in range(1, 7))
_LISTS = (re.compile(r"^\s*\d+\.\s", re.MULTILINE), re.compile(r"^\s*[-*+]\s", re.MULTILINE))
_BOLDS = (re.compile(r"\*\*[^*\n]+\*\*"), re.compile(r"__[^_\n]+__"))
_QUANTILES = (0.05, 0.95)
# torch.optim.LBFGS as `math_utils.fit_pairwise_model` configures it (history_size stays at its default of
# 100, which 50 iterations never fill, and max_eval at 62, which they never reach).
_LBFGS_LR = 0.1
_LBFGS_MAX_ITER = 50
_LBFGS_TOL = 1e-9
_LBFGS_INIT = 0.5


@dataclass(frozen=True, slots=True)
class ArenaGame:
    """One judge call on one question: the model's answer against the category baseline's.

    Raises:
        ConfigError: for a verdict that is not one of `LABEL_POINTS` (nor None).
    """

    uid: str
    """Question id (`question.jsonl`'s `uid`)."""
    category: str
    """Question category (`hard_prompt` or `creative_writing`): selects the baseline and the score."""
    verdict: str | None
    """The label the judge read (e.g. `"B>>A"`); None when the answer had none or the call failed."""
    model_as_a: bool
    """Whether the model's answer was shown as A (upstream's second game) or the baseline's (the first)."""
    judge: str = ""
    """The judge model. Games of several judges on one question are separate records, as when
    `show_result.load_judgments` reads several judges' folders (the creative-writing judge ensemble)."""

    def __post_init__(self) -> None:
        if self.verdict is not None and self.verdict not in LABEL_POINTS:
            raise ConfigError(
                f"arena-hard: question {self.uid!r}: verdict {self.verdict!r} is not one of "
                f"{', '.join(LABEL_POINTS)} (or None for an unparsed game)"
            )

    def model_outcomes(self) -> tuple[float, ...]:
        """The model's battle outcomes in this game: its points, `STRONG_WEIGHT` times for a strong label.

        Raises:
            ConfigError: for an unparsed game (it has no outcome).
        """
        if self.verdict is None:
            raise ConfigError(f"arena-hard: question {self.uid!r}: an unparsed game has no outcome")
        points = LABEL_POINTS[self.verdict]
        model = points if self.model_as_a else 1.0 - points
        return (model,) * (STRONG_WEIGHT if ">>" in self.verdict or "<<" in self.verdict else 1)


@dataclass(frozen=True, slots=True)
class Battle:
    """One row of upstream's exploded battle table: one outcome of the model against the baseline."""

    uid: str
    """Question id."""
    category: str
    """Question category."""
    outcome: float
    """1 the model won, 0.5 a tie, 0 the baseline won."""


@dataclass(frozen=True, slots=True)
class _Question:
    judge: str
    uid: str
    category: str
    baseline_as_a: ArenaGame
    model_as_a: ArenaGame

    @property
    def kept(self) -> bool:
        return self.baseline_as_a.verdict is not None and self.model_as_a.verdict is not None


def _questions(games: Iterable[ArenaGame]) -> list[_Question]:
    """Pair the two games of every (judge, question), in order of first appearance."""
    slots: dict[tuple[str, str], dict[bool, ArenaGame]] = {}
    for g in games:
        pair = slots.setdefault((g.judge, g.uid), {})
        if g.model_as_a in pair:
            shown = "the model" if g.model_as_a else "the baseline"
            where = f"question {g.uid!r} (judge {g.judge!r})"
            raise ConfigError(f"arena-hard: {where}: two games show {shown} as A")
        pair[g.model_as_a] = g
    out = []
    for (judge, uid), pair in slots.items():
        if len(pair) != 2:
            missing = "the model" if True not in pair else "the baseline"
            raise ConfigError(
                f"arena-hard: question {uid!r} (judge {judge!r}) lacks its game with {missing} as A; "
                "record a failed game with verdict None instead of leaving it out"
            )
        if pair[True].category != pair[False].category:
            raise ConfigError(
                f"arena-hard: question {uid!r} (judge {judge!r}) has games in categories "
                f"{pair[False].category!r} and {pair[True].category!r}"
            )
        out.append(_Question(judge, uid, pair[True].category, pair[False], pair[True]))
    return out


def battles(games: Iterable[ArenaGame]) -> list[Battle]:
    """The battle rows of `show_result.load_judgments`: per kept question, the model-as-A game's outcomes,
    then the baseline-as-A game's; questions with an unparsed game are left out (`arena_hard_score` counts
    them).

    Raises:
        ConfigError: when a (judge, question) lacks one of its two games, has one twice, or mixes categories.
    """
    return _rows(_questions(games))


def _rows(questions: Iterable[_Question]) -> list[Battle]:
    rows = []
    for q in questions:
        if q.kept:
            for game in (q.model_as_a, q.baseline_as_a):
                rows.extend(Battle(q.uid, q.category, o) for o in game.model_outcomes())
    return rows


@dataclass(frozen=True, slots=True)
class AnswerStyle:
    """The style metadata of one answer (`utils/add_markdown_info.py`), each count summed over its kinds."""

    token_len: int
    """Tokens in the answer (upstream: tiktoken's `gpt-4o` encoding, special tokens allowed)."""
    header_count: int
    """Lines starting with `#` .. `######` and a space."""
    list_count: int
    """Ordered (`1. `) and unordered (`- `, `* `, `+ `) list items."""
    bold_count: int
    """`**bold**` and `__bold__` spans."""

    @classmethod
    def from_text(cls, text: str, *, token_len: int) -> AnswerStyle:
        """Count markdown as `add_markdown_info.count_markdown_elements` does, after its code-block removal.

        `add_markdown_info.remove_pattern` deletes every occurrence of each fenced block's *inside* (the text
        between the triple backticks, fences left in place), then headers, list items and bold spans are
        counted with upstream's patterns.
        """
        for inside in _CODE_BLOCK.findall(text):
            text = text.replace(inside, "")
        return cls(
            token_len,
            sum(len(p.findall(text)) for p in _HEADERS),
            sum(len(p.findall(text)) for p in _LISTS),
            sum(len(p.findall(text)) for p in _BOLDS),
        )

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> AnswerStyle:
        """From an upstream answer record's `metadata` (`{"token_len": 179, "header_count": {"h1": 0, ...}}`),
        summing each count's kinds as `show_result.print_leaderboard_with_style_features` does.

        Raises:
            ConfigError: when a key is missing.
        """

        def total(key: str) -> int:
            if key not in metadata:
                raise ConfigError(f"arena-hard: answer metadata lacks {key!r} (see add_markdown_info.py)")
            value = metadata[key]
            return int(value) if isinstance(value, int) else int(sum(value.values()))

        return cls(total("token_len"), total("header_count"), total("list_count"), total("bold_count"))


def style_features(model: AnswerStyle, baseline: AnswerStyle) -> tuple[float, float, float, float]:
    """The four raw style differences of one battle (`show_result.print_leaderboard_with_style_features`).

    Length: `(len_m - len_b) / (len_m + len_b)`. Each markdown count becomes a density `count / (len + 1)`,
    and its feature is `(d_m - d_b) / (d_m + d_b + 1)`. Order: length, headers, lists, bold.

    Raises:
        ConfigError: when both answers have 0 tokens (upstream's NaN assertion).
    """
    total = model.token_len + baseline.token_len
    if total == 0:
        raise ConfigError("arena-hard: style control needs answers with tokens; both have token_len 0")
    out = [(model.token_len - baseline.token_len) / total]
    for m_count, b_count in (
        (model.header_count, baseline.header_count),
        (model.list_count, baseline.list_count),
        (model.bold_count, baseline.bold_count),
    ):
        m_density, b_density = m_count / (model.token_len + 1), b_count / (baseline.token_len + 1)
        out.append((m_density - b_density) / (m_density + b_density + 1))
    return out[0], out[1], out[2], out[3]


def _bt_loss(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """Summed binary cross-entropy with logits `x @ w` (`math_utils.bt_loss`) and its gradient."""
    z = x @ w
    loss = float(np.sum(np.logaddexp(0.0, z) - y * z))
    return loss, x.T @ (1.0 / (1.0 + np.exp(-z)) - y)


def fit_bradley_terry(features: np.ndarray, outcomes: np.ndarray) -> np.ndarray:
    """The coefficients `math_utils.fit_pairwise_model(loss_type="bt")` fits, with its exact optimiser.

    Loss: summed binary cross-entropy of `outcomes` (0, 0.5 or 1) against `sigmoid(features @ w)`, no
    intercept. Optimiser: one `step` of `torch.optim.LBFGS(lr=0.1, max_iter=50, tolerance_grad=1e-9,
    tolerance_change=1e-9)` without line search from every weight at 0.5, replicated step for step in float64
    (the two-loop recursion, the first step scaled by `min(1, 1 / |g|_1)`, torch's stopping tests). 50 fixed
    steps of 0.1 stop short of the maximum-likelihood point by a little; that is upstream's number.
    """
    x, y = np.asarray(features, dtype=float), np.asarray(outcomes, dtype=float)
    w = np.full(x.shape[1], _LBFGS_INIT)
    loss, grad = _bt_loss(x, y, w)
    if np.abs(grad).max() <= _LBFGS_TOL:
        return w
    dirs: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    rhos: list[float] = []
    h_diag = 1.0
    direction, step, prev_grad = -grad, 0.0, grad
    for n_iter in range(1, _LBFGS_MAX_ITER + 1):
        if n_iter > 1:
            y_k, s_k = grad - prev_grad, direction * step
            ys = float(y_k @ s_k)
            if ys > 1e-10:
                dirs.append(y_k)
                steps.append(s_k)
                rhos.append(1.0 / ys)
                h_diag = ys / float(y_k @ y_k)
            q = -grad
            alphas = [0.0] * len(dirs)
            for i in range(len(dirs) - 1, -1, -1):
                alphas[i] = float(steps[i] @ q) * rhos[i]
                q = q - alphas[i] * dirs[i]
            direction = q * h_diag
            for i in range(len(dirs)):
                beta = float(dirs[i] @ direction) * rhos[i]
                direction = direction + (alphas[i] - beta) * steps[i]
        prev_grad, prev_loss = grad, loss
        step = min(1.0, 1.0 / float(np.abs(grad).sum())) * _LBFGS_LR if n_iter == 1 else _LBFGS_LR
        if float(grad @ direction) > -_LBFGS_TOL:
            break
        w = w + step * direction
        if n_iter == _LBFGS_MAX_ITER:
            break
        loss, grad = _bt_loss(x, y, w)
        if np.abs(grad).max() <= _LBFGS_TOL:
            break
        if np.abs(direction * step).max() <= _LBFGS_TOL or abs(loss - prev_loss) < _LBFGS_TOL:
            break
    return w


@dataclass(frozen=True, slots=True)
class CategoryScore:
    """The Arena-Hard score of one category against its baseline, with the counts behind it."""

    category: str
    """Question category."""
    baseline: str
    """The baseline model of the category (`BASELINES`)."""
    score: float | None
    """Bootstrap mean win rate (style control: median fitted win probability); None without any battle."""
    lower: float | None
    """5% bootstrap quantile; None without any battle."""
    upper: float | None
    """95% bootstrap quantile; None without any battle."""
    win_rate: float | None
    """Plain mean outcome over the battle rows (what the bootstrap resamples); None without any battle."""
    n_questions: int
    """Distinct questions with at least one kept (judge, question) record."""
    n_games: int
    """Kept games (two per kept record)."""
    n_battles: int
    """Battle rows, strong labels counted `STRONG_WEIGHT` times."""
    n_ties: int
    """Kept games judged a tie (`A=B` or `B=A`)."""
    n_unparsed: int
    """Games without a verdict (unparsable answer or failed call), kept or not."""
    n_dropped: int
    """(judge, question) records dropped because a game had no verdict."""
    style_coefs: tuple[float, ...]
    """Style control: the median fitted coefficients of length, headers, lists, bold (upstream's "Feature
    Coefs"); empty without style control."""

    @property
    def tie_rate(self) -> float | None:
        """Share of kept games judged a tie; None without a kept game."""
        return self.n_ties / self.n_games if self.n_games else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"style_coefs": list(self.style_coefs), "tie_rate": self.tie_rate}


@dataclass(frozen=True, slots=True)
class ArenaResult:
    """Arena-Hard scores per category (upstream reports no score across categories)."""

    categories: tuple[CategoryScore, ...]
    """One score per category present in the games, sorted by name."""
    style_control: bool
    """Whether the scores are style-controlled (length and markdown) Bradley-Terry win rates."""
    bootstrap_rounds: int
    """Bootstrap resamples behind every score and interval."""
    seed: int
    """The seed the resamples were drawn from (per category: derived from it and the category)."""

    def category(self, name: str) -> CategoryScore:
        """The score of one category.

        Raises:
            ConfigError: for a category without games; the message lists those with games.
        """
        for c in self.categories:
            if c.category == name:
                return c
        scored = ", ".join(c.category for c in self.categories)
        raise ConfigError(f"arena-hard: no games in category {name!r}; scored: {scored}")

    def to_json(self) -> dict[str, Any]:
        return {
            "categories": [c.to_json() for c in self.categories],
            "style_control": self.style_control,
            "bootstrap_rounds": self.bootstrap_rounds,
            "seed": self.seed,
        }


def _style_matrix(
    rows: Sequence[Battle], model_style: Mapping[str, AnswerStyle], baseline_style: Mapping[str, AnswerStyle]
) -> np.ndarray:
    """Upstream's feature matrix: model indicator (+1) and baseline indicator (-1), then the standardised
    style features (mean and sample standard deviation over the battle rows, as torch computes them)."""
    raw = []
    for r in rows:
        for side, styles in (("model", model_style), ("baseline", baseline_style)):
            if r.uid not in styles:
                raise ConfigError(f"arena-hard: style control: no {side} answer style for question {r.uid!r}")
        raw.append(style_features(model_style[r.uid], baseline_style[r.uid]))
    feats = np.array(raw)
    spread = feats.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(4)
    if not (spread > 0).all():
        names = [n for n, s in zip(("length", "headers", "lists", "bold"), spread, strict=True) if not s > 0]
        raise ConfigError(
            f"arena-hard: style control cannot standardise {', '.join(names)}: constant over the "
            f"{len(rows)} battles of category {rows[0].category!r}"
        )
    indicator = np.tile([1.0, -1.0], (len(rows), 1))
    return np.hstack([indicator, (feats - feats.mean(axis=0)) / spread])


def _score_category(
    category: str,
    questions: Sequence[_Question],
    *,
    baseline: str,
    rounds: int,
    seed: int,
    style: tuple[Mapping[str, AnswerStyle], Mapping[str, AnswerStyle]] | None,
) -> CategoryScore:
    kept = [q for q in questions if q.kept]
    rows = _rows(kept)
    counts = {
        "n_questions": len({q.uid for q in kept}),
        "n_games": 2 * len(kept),
        "n_battles": len(rows),
        "n_ties": sum(g.verdict in ("A=B", "B=A") for q in kept for g in (q.baseline_as_a, q.model_as_a)),
        "n_unparsed": sum(g.verdict is None for q in questions for g in (q.baseline_as_a, q.model_as_a)),
        "n_dropped": len(questions) - len(kept),
    }
    if not rows:
        return CategoryScore(category, baseline, None, None, None, None, style_coefs=(), **counts)
    y = np.array([r.outcome for r in rows])
    rng = np.random.default_rng(derive_seed(seed, "arena-hard", category))
    draws = rng.integers(0, len(rows), size=(rounds, len(rows)))
    if style is None:
        values = y[draws].mean(axis=1)
        centre, coefs = float(values.mean()), ()
    else:
        x = _style_matrix(rows, *style)
        fits = np.array([fit_bradley_terry(x[idx], y[idx]) for idx in draws])
        # `math_utils.to_winrate_probabilities`: exp(c_m) / (exp(c_m) + exp(c_b)).
        values = 1.0 / (1.0 + np.exp(fits[:, 1] - fits[:, 0]))
        centre, coefs = float(np.median(values)), tuple(float(c) for c in np.median(fits[:, 2:], axis=0))
    lower, upper = (float(v) for v in np.quantile(values, _QUANTILES))
    win_rate = float(y.mean())
    return CategoryScore(category, baseline, centre, lower, upper, win_rate, style_coefs=coefs, **counts)


def arena_hard_score(
    games: Iterable[ArenaGame],
    *,
    baselines: Mapping[str, str] = BASELINES,
    bootstrap_rounds: int = 100,
    seed: int = 0,
    style_control: bool = False,
    model_style: Mapping[str, AnswerStyle] | None = None,
    baseline_style: Mapping[str, AnswerStyle] | None = None,
) -> ArenaResult:
    """Score one model's Arena-Hard games against the baselines, each category on its own.

    Args:
        games: Both games of every judged question (an unparsed or failed game with verdict None).
        baselines: The baseline model per category; every game's category must be a key.
        bootstrap_rounds: Resamples per category (upstream: 100).
        seed: Seeds the resamples (with the category).
        style_control: Fit the style-controlled Bradley-Terry model (`show_result.py -f markdown length`)
            instead of bootstrapping the win rate.
        model_style: Style control: the model's answer style per question uid.
        baseline_style: Style control: the baseline's answer style per question uid.

    Raises:
        ConfigError: for no games, a category without a baseline, fewer than 1 round, malformed game pairs
            (see `battles`), answer styles missing under style control or given without it, or a style
            feature that is constant over a category's battles.
    """
    if bootstrap_rounds < 1:
        raise ConfigError(f"arena-hard: bootstrap_rounds must be >= 1, got {bootstrap_rounds}")
    if style_control and (model_style is None or baseline_style is None):
        raise ConfigError("arena-hard: style control needs model_style and baseline_style")
    if not style_control and (model_style is not None or baseline_style is not None):
        raise ConfigError("arena-hard: answer styles were given but style_control is off")
    questions = _questions(games)
    if not questions:
        raise ConfigError("arena-hard: no games to score")
    by_category: dict[str, list[_Question]] = {}
    for q in questions:
        if q.category not in baselines:
            raise ConfigError(
                f"arena-hard: question {q.uid!r} has category {q.category!r}, which has no baseline; "
                f"known: {', '.join(baselines)}"
            )
        by_category.setdefault(q.category, []).append(q)
    style = (model_style, baseline_style) if style_control else None
    scores = tuple(
        _score_category(
            name,
            by_category[name],
            baseline=baselines[name],
            rounds=bootstrap_rounds,
            seed=seed,
            style=style,  # type: ignore[arg-type]
        )
        for name in sorted(by_category)
    )
    return ArenaResult(scores, style_control, bootstrap_rounds, seed)


def answer_styles(
    pairs: Sequence[tuple[PolicyItem, str]], token_lens: Sequence[int]
) -> tuple[dict[str, AnswerStyle], dict[str, AnswerStyle]]:
    """(model style, baseline style) per question uid, for style control: the policy's output counted by
    `AnswerStyle.from_text` with the caller's token count (upstream: tiktoken's `gpt-4o` encoding), the
    baseline's read from its answer record (`AnswerStyle.from_metadata`).

    Raises:
        ConfigError: when `token_lens` is not aligned with `pairs`, or a baseline answer has no metadata.
    """
    if len(token_lens) != len(pairs):
        raise ConfigError(f"arena-hard: {len(token_lens)} token counts for {len(pairs)} answers")
    model, baseline = {}, {}
    for (item, output), n in zip(pairs, token_lens):
        uid, metadata = item.meta["uid"], item.meta.get("baseline_metadata")
        if metadata is None:
            raise ConfigError(f"arena-hard: style control: the baseline answer of {uid!r} has no metadata")
        model[uid] = AnswerStyle.from_text(output, token_len=n)
        baseline[uid] = AnswerStyle.from_metadata(metadata)
    return model, baseline
