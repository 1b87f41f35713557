"""`pairwise-judge`: an LLM compares responses two at a time, in both orders (JudgeBench-style LLM-as-judge).

Spec: `pairwise-judge:model=SPEC[,temperature=0][,max_tokens=512][,structured=true]`, e.g.
`pairwise-judge:model=openai:gpt-4.1`. `model` is a backend spec or alias, served through the run's backend
pool (so through the call cache).

Protocol:
- A *game* shows the judge one pair: response a as "A", response b as "B", with the prompt in
  `judges/prompts/pairwise_judge.txt` (our own wording) as a single user turn. Every unordered pair is played
  in both orders, (a, b) and (b, a), to cancel position bias. For K=2 that is 2 calls; for K > 2 it is a round
  robin of all pairs, K(K-1) calls (42 for a listwise set of 7). All games of a set go out in one `generate`
  batch.
- The judge ends with `[[A]]`, `[[B]]` or `[[C]]` (C: neither is better; a tie is allowed, as in JudgeBench's
  rule, where it counts 0). Parsing is strict: only these exact markers count, after removing any
  `<think>...</think>` reasoning block (and an unterminated one); the *last* marker in the text is the
  verdict, so a judge that quotes the format while reasoning is still read by its final word. A text without a
  marker is re-asked once, all such games in one batch, as a continuation of the same chat (its answer, then
  our complaint; an empty answer is shown as `(empty reply)`). A second unparsable answer fails the game with
  category PARSE (attempts=2). A backend error fails the game with the backend's category, without a re-ask
  (backends already retry).
- `structured=true` (default) asks the backend to decode under `VERDICT_CONSTRAINT` (free reasoning, ending in
  a marker) where it supports structured output; `false` sends free text. The parser is the same either way.
- Scores. Each scored game gives its two responses points: win 1, tie 0.5, loss 0. A response's score is its
  mean points over its scored games (a win rate in [0, 1]); a response none of whose games could be scored
  gets None. For K=2 with both games scored, score(a) - score(b) = s / 2, where s is JudgeBench's per-pair sum
  (+1 for each order that prefers a, -1 for each that prefers b, 0 for a tie), so "a is preferred iff s > 0"
  is exactly JudgeBench's both-orders rule: both orders agree -> 1 vs 0; one prefers a and the other ties ->
  0.75 vs 0.25; the orders disagree -> 0.5 vs 0.5, a tie (counted wrong under strict accuracy). For K > 2 the
  mean points rank like total wins (every response plays 2(K-1) games) and stay comparable when some games
  fail.
- Deviation, stated: when one game of a pair fails, the pair is decided by the other game alone (the failure
  is recorded); JudgeBench has no failed games. When both fail (K=2), both scores are None.
- `trace.raw["games"]` lists every game: who was shown as A and B, the raw texts (first answer and re-ask
  answer), the parsed verdict, the winner, the number of requests (`asks`) and any failure.
  `trace.raw["pairs"]` gives each pair's JudgeBench sum, from the lower index's point of view, and the
  preferred response (None for a tie or no scored game). `trace.calls` counts requests the backend actually
  ran (cache misses).
- The set's `seed` seeds sampling when `temperature > 0` (a different seed per game); with the default greedy
  decoding the seed does not change the output, and repeats are served from the call cache.
- K=1 cannot be compared: its score is None with an UNSUPPORTED failure.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks.metrics import both_orders_sum
from harness.backends.base import Constraint, GenerateRequest, Message, SamplingParams
from harness.errors import ConfigError, Failure, FailureCategory
from harness.seeds import derive_seed
from judges.base import SetScores, StageFailure, Trace, format_evaluator_spec, resolve_settings
from judges.templates import load_template, render_template

if TYPE_CHECKING:
    from harness.backends.base import BaseBackend
    from harness.pool import BackendPool

__all__ = [
    "Game",
    "PairwiseJudge",
    "Verdict",
    "VerdictParseError",
    "build",
    "judge_prompt",
    "parse_verdict",
    "score_games",
]

KIND = "pairwise-judge"
SUBJECT = "model"
"""The setting under test when two runs of a row are compared (`judges.held_fixed`)."""
DEFAULTS: dict[str, Any] = {"temperature": 0.0, "max_tokens": 512, "structured": True}
"""Settings and their defaults; `model` is required."""
VERDICT_CONSTRAINT = Constraint.regex(r"(?s:.*)\[\[[ABC]\]\]")
"""`structured=true`: any reasoning, then the answer ends with a verdict marker (the parser reads the last one)."""
TEMPLATE = "pairwise_judge"
"""The judge prompt, `judges/prompts/pairwise_judge.txt`."""
COMPLAINT = (
    "Your reply did not end with a verdict in the required format ({reason}). Reply with the verdict only, "
    "exactly one of: [[A]] if response A is better, [[B]] if response B is better, [[C]] if neither is "
    "better."
)
"""The re-ask message; `{reason}` is the parser's complaint."""

_MARKER = re.compile(r"\[\[([ABC])\]\]")
_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)


class Verdict(str, enum.Enum):
    """A game's outcome as the judge wrote it."""

    A = "A"
    """Response A (the first shown) is better."""
    B = "B"
    """Response B is better."""
    TIE = "C"
    """Neither is better."""


class VerdictParseError(ValueError):
    """The judge's text holds no verdict marker; the message is the complaint sent back."""


def parse_verdict(text: str) -> Verdict:
    """The verdict of a judge's answer: the last `[[A]]`, `[[B]]` or `[[C]]` outside any `<think>` block.

    Raises:
        VerdictParseError: when there is no marker.
    """
    visible = _THINK.sub("", text)
    found = _MARKER.findall(visible)
    if not found:
        if not text.strip():
            raise VerdictParseError("the reply is empty")
        if not visible.strip():
            raise VerdictParseError("the reply holds reasoning but nothing after it")
        raise VerdictParseError("no [[A]], [[B]] or [[C]] marker found")
    return Verdict(found[-1])


def judge_prompt(prompt: str, response_a: str, response_b: str) -> str:
    """The judge prompt for one game (`judges/prompts/pairwise_judge.txt`; texts are inserted verbatim)."""
    return render_template(TEMPLATE, prompt=prompt, response_a=response_a, response_b=response_b)


@dataclass(frozen=True, slots=True)
class Game:
    """One judge call: response `a` shown as A, response `b` shown as B."""

    a: int
    """Index of the response shown as A."""
    b: int
    """Index of the response shown as B."""
    verdict: Verdict | None
    """The parsed verdict; None when the game failed."""
    texts: tuple[str, ...] = ()
    """The judge's raw answers: the first, and the re-asked one if there was a re-ask."""
    failure: Failure | None = None
    """Why the game has no verdict."""
    asks: int = 1
    """Requests sent for this game: 1, or 2 after a re-ask."""

    @property
    def winner(self) -> int | None:
        """Index of the winning response; None for a tie or a failed game."""
        return {Verdict.A: self.a, Verdict.B: self.b}.get(self.verdict)  # type: ignore[arg-type]

    def points(self) -> dict[int, float]:
        """Points per response: win 1, tie 0.5, loss 0; empty for a failed game."""
        if self.verdict is None:
            return {}
        if self.verdict is Verdict.TIE:
            return {self.a: 0.5, self.b: 0.5}
        win = self.winner
        return {self.a: float(self.a == win), self.b: float(self.b == win)}

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict.value if self.verdict else None,
            "winner": self.winner,
            "asks": self.asks,
            "texts": list(self.texts),
            "failure": self.failure.to_json() if self.failure else None,
        }


def score_games(k: int, games: Sequence[Game]) -> tuple[tuple[float | None, ...], list[dict[str, Any]]]:
    """Scores (mean points per scored game, None without one) and the per-pair JudgeBench sums.

    Returns:
        The scores aligned with the responses, and for each unordered pair `(i, j)`, `i < j`, a record
        `{responses: [i, j], sum, games, preferred}`: `sum` adds +1 per game i won, -1 per game j won, 0 per
        tie; `preferred` is i when sum > 0, j when sum < 0, else None.
    """
    total = [0.0] * k
    played = [0] * k
    decisions: dict[tuple[int, int], list[int | None]] = {}
    for g in games:
        i, j = sorted((g.a, g.b))
        for idx, pts in g.points().items():
            total[idx] += pts
            played[idx] += 1
        # From i's side: +1 i won, -1 j won, 0 tie, None no verdict (JudgeBench's decisions).
        decision = None if g.verdict is None else 0 if g.winner is None else 1 if g.winner == i else -1
        decisions.setdefault((i, j), []).append(decision)
    pairs: dict[tuple[int, int], dict[str, Any]] = {}
    for (i, j), ds in decisions.items():
        total_ij = both_orders_sum(ds)
        preferred = i if total_ij > 0 else j if total_ij < 0 else None
        games_ij = sum(d is not None for d in ds)
        pairs[(i, j)] = {"responses": [i, j], "sum": total_ij, "games": games_ij, "preferred": preferred}
    scores = tuple(total[r] / played[r] if played[r] else None for r in range(k))
    return scores, [pairs[p] for p in sorted(pairs)]


class PairwiseJudge:
    """An LLM judge comparing every pair of responses in both orders (see the module docstring).

    Args:
        backend: The judge model (the pool's cached backend).
        settings: Resolved settings: `model` plus every key of `DEFAULTS`.

    Raises:
        ConfigError: for a negative temperature or `max_tokens` below 1.
    """

    def __init__(self, backend: BaseBackend, settings: dict[str, Any]) -> None:
        if settings["temperature"] < 0:
            raise ConfigError(f"{KIND}: temperature must be >= 0, got {settings['temperature']}")
        if settings["max_tokens"] < 1:
            raise ConfigError(f"{KIND}: max_tokens must be >= 1, got {settings['max_tokens']}")
        self.backend = backend
        self.settings = dict(settings)
        self.spec = format_evaluator_spec(KIND, self.settings, defaults=DEFAULTS)
        self.temperature: float = settings["temperature"]
        self.max_tokens: int = settings["max_tokens"]
        self.structured: bool = settings["structured"]
        load_template(TEMPLATE)  # a missing prompt file fails here, not mid-run

    def _params(self, seed: int, *parts: object) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seed=derive_seed(seed, KIND, *parts),
            constraint=VERDICT_CONSTRAINT if self.structured else None,
        )

    async def score_set(self, prompt: str, responses: Sequence[str], *, seed: int,
                        reference: str | None = None) -> SetScores:
        """Play every ordered pair once (re-asking unparsable answers once) and score the responses.

        Args:
            prompt: The user prompt.
            responses: The candidate set; K >= 2 to compare anything.
            seed: Seeds sampling (only matters with `temperature > 0`).
            reference: Not read (a set's reference answer is for checks that need one: `judges.rule`).
        """
        del reference
        k = len(responses)
        if k == 0:
            return SetScores(())
        if k == 1:
            failure = Failure(FailureCategory.UNSUPPORTED, "a pairwise judge needs at least 2 responses")
            return SetScores((None,), Trace(failures=(StageFailure("judge", failure, response=0),)))
        order = [(a, b) for a in range(k) for b in range(k) if a != b]
        # Both orders of a pair side by side: (0, 1), (1, 0), (0, 2), (2, 0), ...
        order.sort(key=lambda ab: (min(ab), max(ab), ab[0] != min(ab)))
        chats = [(Message("user", judge_prompt(prompt, responses[a], responses[b])),) for a, b in order]
        first = await self.backend.generate(
            [
                GenerateRequest(chat, self._params(seed, a, b))
                for chat, (a, b) in zip(chats, order, strict=True)
            ]
        )
        calls = sum(not c.cached for c in first)
        games: list[Game | None] = [None] * len(order)
        reask: list[tuple[int, str, str]] = []  # (game, first text, complaint reason)
        for g, ((a, b), completion) in enumerate(zip(order, first, strict=True)):
            if completion.error is not None:
                games[g] = Game(a, b, None, (), _in_game(g, a, b, completion.error))
                continue
            text = completion.texts[0] if completion.texts else ""
            try:
                games[g] = Game(a, b, parse_verdict(text), (text,))
            except VerdictParseError as exc:
                reask.append((g, text, str(exc)))
        if reask:
            requests = []
            for g, text, reason in reask:
                a, b = order[g]
                chat = chats[g] + (
                    Message("assistant", text if text.strip() else "(empty reply)"),
                    Message("user", COMPLAINT.format(reason=reason)),
                )
                requests.append(GenerateRequest(chat, self._params(seed, a, b, "reask")))
            second = await self.backend.generate(requests)
            calls += sum(not c.cached for c in second)
            for (g, text, _), completion in zip(reask, second, strict=True):
                a, b = order[g]
                if completion.error is not None:
                    err = completion.error
                    failure = Failure(err.category, f"re-ask: {err.message}", err.attempts)
                    games[g] = Game(a, b, None, (text,), _in_game(g, a, b, failure), asks=2)
                    continue
                again = completion.texts[0] if completion.texts else ""
                try:
                    games[g] = Game(a, b, parse_verdict(again), (text, again), asks=2)
                except VerdictParseError as exc:
                    failure = Failure(FailureCategory.PARSE, f"no verdict after a re-ask: {exc}", attempts=2)
                    games[g] = Game(a, b, None, (text, again), _in_game(g, a, b, failure), asks=2)
        played = [g for g in games if g is not None]
        scores, pairs = score_games(k, played)
        failures = tuple(StageFailure("judge", g.failure) for g in played if g.failure is not None)
        raw = {"games": [g.to_json() for g in played], "pairs": pairs}
        return SetScores(scores, Trace(failures=failures, raw=raw, calls=calls))

    async def close(self) -> None:
        """Nothing to release: the backend belongs to the pool, which closes it at the end of the run."""


def _in_game(g: int, a: int, b: int, failure: Failure) -> Failure:
    """`failure` with the game it belongs to named in its message."""
    where = f"game {g} (response {a} as A, {b} as B)"
    return Failure(failure.category, f"{where}: {failure.message}", failure.attempts)


def build(settings: dict[str, str], pool: BackendPool) -> PairwiseJudge:
    """`pairwise-judge:model=SPEC[,temperature=0,max_tokens=512]`: an LLM compares pairs in both orders.

    The judge model comes from `pool.get(model)`.

    Raises:
        ConfigError: for unknown or malformed settings, or an unknown model spec.
    """
    resolved = resolve_settings(KIND, settings, DEFAULTS, required=("model",))
    return PairwiseJudge(pool.get(resolved["model"]), resolved)
