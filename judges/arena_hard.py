"""Arena-Hard v2.0's judge: two games per question against the category's baseline, each label read by
`parse_verdict`, scored by `benchmarks.arena_hard_score`.

The judge (`ArenaHardJudge`) plays `gen_judgment.judgment`'s two games per question: game 1 shows the
category's baseline answer as A and the policy's as B, game 2 swaps them (`pairwise_judgment` called with the
two answers exchanged). Each game is one chat: a system turn (the category's prompt,
`judge_utils.JUDGE_SETTINGS`: the hard-prompt one has the judge write its own answer first, the
creative-writing one does not), then a user turn laid out as the config's `prompt_template`
(`<|User Prompt|>`, `<|The Start of Assistant A's Answer|>`, ...), sampled with the config's `temperature` 0
and `max_tokens` 16000 (both settings). The prompts' wording is ours (`judges/prompts/arena_hard_*.txt`);
`upstream_prompts=DIR` reads the user's copy of upstream's instead (the two system prompt files and
`arena-hard-v2.0.yaml`'s `prompt_template`). `structured=True` (default) decodes under `VERDICT_CONSTRAINT`
(free text ending in one of the ten scored labels) where the backend can; `parse_verdict` reads the answer
either way. Deviations, stated:
- The re-ask is ours: upstream retries a call only on an API error (`utils/completion.py`, `API_MAX_RETRY`;
  here the backend does) and records an answer without a label as score None. Here such an answer is asked
  once more, continuing the chat with a short complaint (`judges/prompts/retry_arena_hard.txt`), and only then
  recorded as failed (verdict None; `arena_hard_score` drops the question and counts it).
- A `<think>...</think>` block (or an unterminated one) is removed before the label is read: upstream reads
  the API's answer, which holds no reasoning.
- Each game's sampling seed is derived from (seed, question, game); upstream sends none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.arena_hard_score import LABEL_POINTS, ArenaGame
from harness.backends.base import Constraint, Message, SamplingParams
from harness.errors import ConfigError, Failure
from harness.seeds import derive_seed
from judges.templates import load_template, render, render_template
from judges.ask import Ask, ask_all

if TYPE_CHECKING:
    from benchmarks.base import PolicyItem
    from harness.backends.base import BaseBackend

__all__ = [
    "VERDICT_PATTERNS",
    "parse_verdict",
    "JUDGE_MAX_TOKENS",
    "JUDGE_TEMPERATURE",
    "SYSTEM_TEMPLATES",
    "UPSTREAM_CONFIG",
    "UPSTREAM_SYSTEM_FILES",
    "VERDICT_CONSTRAINT",
    "ArenaHardJudge",
    "ArenaHardJudgment",
    "fill_upstream_template",
    "read_upstream_prompts",
]

VERDICT_PATTERNS = (r"\[\[([AB<>=]+)\]\]", r"\[([AB<>=]+)\]")
"""`regex_patterns` of `config/arena-hard-v2.0.yaml`, tried in this order."""
_PATTERNS = tuple(re.compile(p) for p in VERDICT_PATTERNS)


def parse_verdict(text: str) -> str | None:
    """The label of a judge's answer, e.g. `"A>>B"`, or None when it has no scored label.

    Follows `gen_judgment.get_score`: the text is upper-cased; the patterns of `VERDICT_PATTERNS` are tried in
    order and the first one that matches anywhere decides, with its *last* match (so `[[B>A]]` beats a later
    `[A>B]`, and a final `[[A=B]]` beats an earlier `[[A>>B]]`). A decided label that is not one of
    `LABEL_POINTS` gives None (upstream would return it and fail on it later; see the module docstring).
    """
    upper = text.upper()
    for pattern in _PATTERNS:
        found = pattern.findall(upper)
        if found:
            label = found[-1]
            return label if label in LABEL_POINTS else None
    return None


# --- the judge: two games per question against the category's baseline (gen_judgment.judgment) ---

JUDGE_TEMPERATURE = 0.0
JUDGE_MAX_TOKENS = 16000
"""`temperature` and `max_tokens` of `config/arena-hard-v2.0.yaml` (its judge: `gpt-4.1`)."""
SYSTEM_TEMPLATES: Mapping[str, str] = {
    "hard_prompt": "arena_hard_system",
    "coding": "arena_hard_system",
    "math": "arena_hard_system",
    "creative_writing": "arena_hard_creative_system",
}
"""Our system prompt per category, as `judge_utils.JUDGE_SETTINGS` assigns upstream's (looked up by the
question's `category`, as `gen_judgment.pairwise_judgment` does)."""
UPSTREAM_SYSTEM_FILES: Mapping[str, str] = {
    "hard_prompt": "system_prompt_hard_prompt.txt",
    "coding": "system_prompt_hard_prompt.txt",
    "math": "system_prompt_hard_prompt.txt",
    "creative_writing": "system_prompt_creative_writing.txt",
}
"""`upstream_prompts=DIR`: the file in DIR holding each category's upstream system prompt as text."""
UPSTREAM_CONFIG = "arena-hard-v2.0.yaml"
"""`upstream_prompts=DIR`: upstream's config file in DIR; its `prompt_template` is the user turn."""
VERDICT_CONSTRAINT = Constraint.regex(r"(?s:.*)\[\[(?:" + "|".join(LABEL_POINTS) + r")\]\]")
"""`structured=True`: any text, then the answer ends with one of the ten scored labels."""
LABEL_ONLY_CONSTRAINT = Constraint.regex(r"\[\[(?:" + "|".join(LABEL_POINTS) + r")\]\]")
"""`label_only=True`: the answer is one of the ten scored labels and nothing else."""
USER_TEMPLATE = "arena_hard_user"
RETRY_TEMPLATE = "retry_arena_hard"
_UPSTREAM_FIELDS = ("QUESTION", "ANSWER_A", "ANSWER_B")
_FORMAT_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


def fill_upstream_template(template: str, **values: str) -> str:
    """Upstream's `prompt_template.format(QUESTION=..., ANSWER_A=..., ANSWER_B=...)` in one pass (`{{`/`}}`
    become braces, inserted texts are never re-read).

    Raises:
        ConfigError: for a template whose fields are not exactly the three (e.g. `{REFERENCE}`: reference
            answers are not supported), or values for other names.
    """
    found = {m.group(1) for m in _FORMAT_FIELD.finditer(template) if m.group(1) is not None}
    if found != set(_UPSTREAM_FIELDS) or set(values) != set(_UPSTREAM_FIELDS):
        raise ConfigError(
            "arena-hard: the user template needs exactly the fields {QUESTION}, {ANSWER_A} and {ANSWER_B}; "
            f"found {sorted(found)}"
        )
    return _FORMAT_FIELD.sub(lambda m: m.group(0)[0] if m.group(1) is None else values[m.group(1)], template)


def read_upstream_prompts(folder: Path | str) -> tuple[dict[str, str], str]:
    """The user's copy of upstream's prompts in `folder`: the system prompt per category
    (`UPSTREAM_SYSTEM_FILES`, read as they are) and the user template (`UPSTREAM_CONFIG`'s `prompt_template`).

    Raises:
        ConfigError: naming a file that is missing or unreadable, or a template without the three fields.
    """
    import yaml

    folder = Path(folder)

    def read(name: str) -> str:
        try:
            return (folder / name).read_text(encoding="utf-8")
        except OSError as exc:
            problem = f"cannot read upstream's {name} in {folder}: {exc.strerror}"
            raise ConfigError(f"arena-hard: {problem}") from None

    system = {category: read(name) for category, name in UPSTREAM_SYSTEM_FILES.items()}
    try:
        config = yaml.safe_load(read(UPSTREAM_CONFIG))
    except yaml.YAMLError as exc:
        raise ConfigError(f"arena-hard: {folder / UPSTREAM_CONFIG} is not YAML: {exc}") from None
    template = config.get("prompt_template") if isinstance(config, Mapping) else None
    if not isinstance(template, str):
        raise ConfigError(f"arena-hard: {folder / UPSTREAM_CONFIG} has no prompt_template string")
    fill_upstream_template(template, QUESTION="", ANSWER_A="", ANSWER_B="")  # checks the fields now
    return system, template


def _read_verdict(text: str) -> str:
    """The scored label of an answer (`parse_verdict` after removing reasoning); ValueError saying why."""
    visible = _THINK.sub("", text)
    label = parse_verdict(visible)
    if label is not None:
        return label
    if not text.strip():
        raise ValueError("the answer is empty")
    if not visible.strip():
        raise ValueError("the answer holds reasoning but nothing after it")
    raise ValueError("it ends without a label such as [[A>B]]")


@dataclass(frozen=True, slots=True)
class ArenaHardJudgment:
    """Both games of one question: the policy's answer against the category baseline's."""

    item: str
    """The `PolicyItem` id."""
    baseline_as_a: ArenaGame
    """Game 1: the baseline's answer shown as A, the policy's as B."""
    model_as_a: ArenaGame
    """Game 2: the policy's answer shown as A, the baseline's as B."""
    failures: tuple[Failure | None, Failure | None]
    """Why game 1, game 2 has no verdict (the backend's failure, or PARSE after the re-ask), else None."""
    raw: dict[str, Any] = field(default_factory=dict)
    """`answers`: per game, the judge's answers (first and, if re-asked, second); `problems`: per game, the
    complaint sent on the re-ask (None where there was none)."""

    @property
    def games(self) -> tuple[ArenaGame, ArenaGame]:
        """Game 1 and game 2 (what `arena_hard_score` takes)."""
        return self.baseline_as_a, self.model_as_a

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "games": [asdict(g) for g in self.games],
            "failures": [f.to_json() if f is not None else None for f in self.failures],
            "raw": self.raw,
        }


class ArenaHardJudge:
    """Arena-Hard v2.0's judge: two games per question against the category's baseline (see the module
    docstring), an answer without a label re-asked once (our addition), then recorded as failed.

    Args:
        backend: The judge model.
        upstream_prompts: A folder with the user's copy of upstream's prompts (`read_upstream_prompts`); None
            uses ours.
        structured: Decode under `VERDICT_CONSTRAINT` where the backend can.
        label_only: Decode under `LABEL_ONLY_CONSTRAINT` instead: the judge writes the label alone, without
            the reasoning upstream's prompt asks for first. Not upstream's protocol: for small judges that do
            not reach a label within their budget (the `cpu` preset's).
        temperature: Judge sampling temperature (upstream: 0).
        max_tokens: Judge token budget per answer (upstream: 16000; the hard-prompt judge answers first).
        judge: The judge's name in the games (`ArenaGame.judge`); default the backend's model.

    Raises:
        ConfigError: for a negative temperature, `max_tokens` < 1, or unreadable upstream prompts.
    """

    def __init__(
        self,
        backend: BaseBackend,
        *,
        upstream_prompts: Path | str | None = None,
        structured: bool = True,
        label_only: bool = False,
        temperature: float = JUDGE_TEMPERATURE,
        max_tokens: int = JUDGE_MAX_TOKENS,
        judge: str | None = None,
    ) -> None:
        if not temperature >= 0:
            raise ConfigError(f"arena-hard judge: temperature must be >= 0, got {temperature}")
        if max_tokens < 1:
            raise ConfigError(f"arena-hard judge: max_tokens must be >= 1, got {max_tokens}")
        self.backend = backend
        self.judge = judge or backend.model
        self.upstream_prompts = Path(upstream_prompts) if upstream_prompts is not None else None
        self.structured = structured
        self.label_only = label_only
        self.temperature = temperature
        self.max_tokens = max_tokens
        if self.upstream_prompts is not None:
            self._system, self._user = read_upstream_prompts(self.upstream_prompts)
        else:
            self._system = {category: load_template(name) for category, name in SYSTEM_TEMPLATES.items()}
            self._user = load_template(USER_TEMPLATE)
        load_template(RETRY_TEMPLATE)  # a missing prompt file fails here, not mid-run
        self.requests = 0
        """Requests sent to the backend (re-asks included)."""

    @property
    def _constraint(self) -> Constraint | None:
        if self.label_only:
            return LABEL_ONLY_CONSTRAINT
        return VERDICT_CONSTRAINT if self.structured else None

    @property
    def settings(self) -> dict[str, Any]:
        """What the judgment depends on besides the judge model (recorded with every judgment)."""
        return {"prompts": str(self.upstream_prompts) if self.upstream_prompts else "ours",
                "structured": self.structured, "label_only": self.label_only, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

    def messages(self, category: str, question: str, answer_a: str, answer_b: str) -> tuple[Message, ...]:
        """The judge's chat for one game: the category's system prompt, then the question and the two answers.

        Raises:
            ConfigError: for a category without a system prompt (the message lists those with one).
        """
        if category not in self._system:
            raise ConfigError(f"arena-hard judge: no system prompt for category {category!r}; known: "
                              f"{', '.join(self._system)}")
        if self.upstream_prompts is not None:
            user = fill_upstream_template(self._user, QUESTION=question, ANSWER_A=answer_a, ANSWER_B=answer_b)
        else:
            user = render(self._user, question=question, answer_a=answer_a, answer_b=answer_b)
        return Message("system", self._system[category]), Message("user", user)

    def _chats(self, item: PolicyItem, output: str) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
        missing = [k for k in ("uid", "category", "baseline_answer") if k not in item.meta]
        if missing or not item.messages or item.messages[-1].role != "user":
            problem = f"lacks meta {', '.join(missing)}" if missing else "does not end with a user turn"
            raise ConfigError(f"arena-hard judge: item {item.id!r} {problem} (see benchmarks.arena_hard)")
        question, baseline = item.messages[-1].content, item.meta["baseline_answer"]
        category = item.meta["category"]
        return (self.messages(category, question, baseline, output),
                self.messages(category, question, output, baseline))

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        del item, text
        scores = []
        for game in j.games:
            scores.append(None if game.verdict is None else sum(game.model_outcomes()) / len(game.model_outcomes()))
        failures = tuple((f"judge game {n}", f) for n, f in enumerate(j.failures, start=1) if f is not None)
        return tuple(scores), {"judgment": j.to_json()}, failures

    async def judge_all(
        self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int
    ) -> list[ArenaHardJudgment]:
        """Play both games of every (item, policy output) pair, all in one batch (and one re-ask batch);
        aligned with `pairs`.

        Raises:
            ConfigError: before any request, for an item without Arena-Hard's meta or of an unknown category.
        """
        chats = [self._chats(item, output) for item, output in pairs]
        asks = [
            Ask(chat, SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens,
                                     seed=derive_seed(seed, "arena-hard", item.id, game),
                                     constraint=self._constraint),
                _read_verdict, lambda problem: render_template(RETRY_TEMPLATE, problem=problem))
            for (item, _), both in zip(pairs, chats)
            for game, chat in enumerate(both, start=1)
        ]
        requests, _ = await ask_all(self.backend, asks)
        self.requests += requests
        out = []
        for i, (item, _) in enumerate(pairs):
            first, second = asks[2 * i], asks[2 * i + 1]
            uid, category = item.meta["uid"], item.meta["category"]
            games = [ArenaGame(uid, category, a.result if a.failure is None else None, model_as_a=shown,
                               judge=self.judge) for a, shown in ((first, False), (second, True))]
            raw = {"answers": [list(first.texts), list(second.texts)],
                   "problems": [first.problem, second.problem]}
            out.append(ArenaHardJudgment(item.id, games[0], games[1], (first.failure, second.failure), raw))
        return out
