"""Training data from Nectar: the generator's anchor sets (Appendix B.1) and the policy's prompts (B.2).

Every rule is a named predicate over one Nectar row (`NectarRow`) that says why the row is dropped, or None to keep
it; its thresholds are fields of the rule set (`GeneratorRules`, `PolicyRules`) so a config can change or switch
off each one, and `filter_rows` counts the drops per rule (the first rule that drops a row gets it) for the log.
Rows from LMSYS-Chat-1M are never training data: they are the held-out listwise benchmark (`nectar_lmsys`); that
rule (`lmsys_heldout`) cannot be switched off.

The paper names the rules; the thresholds below are ours where it gives none, each stated with its rule:

B.1, generator sets (a prompt with its 7 GPT-4-ranked responses, the anchor of `anchor_reward`):
- `ranked`: the responses carry GPT-4's ranks (always on: the anchor reward needs them).
- `min_responses`: at least 7 responses.
- `min_prompt_chars`: the prompt is over 50 characters; `min_top_chars`: the rank-1 response is too.
- `repetitive`: at most `max_repetitive` (1) responses are repetitive: of a response's word 3-grams (responses of
  at least 30 words), fewer than `min_unique_trigrams` (0.5) distinct.
- `degenerate`: no response is degenerate: under `min_response_chars` (5) characters once stripped, or under
  `min_alnum_share` (0.5) letters and digits among its non-space characters.
- `useful`: at least `min_useful` (4) responses are useful: at least `min_useful_chars` (50) characters, neither
  degenerate nor boilerplate.
- `boilerplate`: at most `max_boilerplate` (2) responses are boilerplate: they open with a refusal or an
  AI-disclaimer phrase (`BOILERPLATE_OPENINGS`) within their first 100 characters.

B.2, policy prompts:
- `min_prompt_chars`: over 50 characters, except the short-prompt exemption: a shorter prompt is kept when its
  rank-1 response has at least `short_prompt_top_chars` (200) characters (a short question that asks for
  substance, e.g. "What causes inflation?").
- `max_turns`: at most `max_turns` (None: any) human turns.
- `max_prompt_chars` (both rule sets; ours, off by default): drop prompts longer than this (the CPU smoke configs).
- `max_response_chars` (generator sets; ours, off by default): drop rows with a response longer than this (the CPU
  configs: every anchor is verified against every rubric item).
- `duplicate`: each rendered prompt once (the first row wins).

Response sets for the generator are sampled from the current policy (`sample_sets`) with the harness's own
generation (`harness.generation`, any backend, cached and resumable) and stored with the policy's identity.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import ConfigError

LMSYS_SOURCE = "lmsys-chat-1m"
BOILERPLATE_OPENINGS = (
    "as an ai", "as a language model", "as an artificial intelligence", "i'm sorry, but i can", "i am sorry, but i can",
    "i'm sorry, i can", "i cannot fulfill", "i can't fulfill", "i cannot help with", "i can't help with",
    "i'm not able to", "i am not able to", "i cannot assist", "i can't assist", "i apologize, but",
)
"""Openings of refusals and AI disclaimers (matched case-insensitively in a response's first 100 characters)."""
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class NectarRow:
    """One Nectar row as the rules read it."""

    index: int
    """Row index in the train split (the id is `nectar:<index>`)."""
    prompt: str
    """The rendered user prompt (`benchmarks.nectar.extract_prompt`)."""
    turns: int
    """Human turns in the conversation."""
    sources: tuple[str, ...]
    responses: tuple[str, ...]
    """The responses, best (rank 1) first (upstream order when not `ranked`)."""
    ranked: bool = True
    """Whether the responses carry GPT-4's ranks (the anchor reward needs them)."""

    @property
    def id(self) -> str:
        return f"nectar:{self.index}"


def row_from_nectar(row: Mapping[str, Any], index: int, where: str) -> NectarRow:
    """A Nectar row (Hub or file format) as a `NectarRow`. A row without `source` has no sources (the authors'
    ranked sample lacks the column); a row whose answers carry no `rank` keeps upstream order, `ranked` False.

    Raises:
        ConfigError: for a malformed row (`benchmarks.nectar` checks it), naming `where`.
    """
    from benchmarks.nectar import extract_prompt, ranked_answers, sources_of, split_turns

    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    answers = row.get("answers")
    ranked = isinstance(answers, list) and bool(answers) and all(
        isinstance(a, Mapping) and "rank" in a for a in answers)
    if ranked:
        texts, ranks, _ = ranked_answers(row, where)
        responses = tuple(texts[i] for i in sorted(range(len(texts)), key=ranks.__getitem__))
    else:
        if not isinstance(answers, list) or not all(isinstance(a, Mapping) and isinstance(a.get("answer"), str)
                                                    for a in answers):
            raise ConfigError(f"{where}: field 'answers' must be a list of {{answer, model[, rank]}} objects")
        responses = tuple(a["answer"] for a in answers)
    prompt_text = row.get("prompt")
    turns = row.get("turns")
    if not isinstance(turns, int):
        turns = sum(role == "User" for role, _ in split_turns(prompt_text)) if isinstance(prompt_text, str) else 0
    sources = sources_of(row, where) if "source" in row else ()
    return NectarRow(index, extract_prompt(prompt_text, where), turns, sources, responses, ranked)


def source_fingerprint(nectar: Path | None) -> str:
    """What the rows are read from, as a checkpoint is bound to it: the file's content fingerprint (its size and
    first and last MiB), or the Hub split."""
    from benchmarks.nectar import HUB_ID, HUB_SPLIT
    from harness.backends.models import weights_fingerprint

    return f"hub:{HUB_ID}[{HUB_SPLIT}]" if nectar is None else weights_fingerprint(nectar)[:16]


def read_nectar(path: Path) -> Iterator[NectarRow]:
    """The rows of a Nectar JSON-lines or parquet file (`benchmarks.nectar.read_rows`).

    Raises:
        ConfigError: naming the file (and row) when it is unreadable, not what its name says, or malformed.
    """
    from benchmarks.nectar import read_rows

    for index, where, row in read_rows(Path(path)):
        yield row_from_nectar(row, index, where)


# --- response properties ---


def is_repetitive(text: str, min_unique: float, min_words: int = 30) -> bool:
    """Fewer than `min_unique` of the response's word 3-grams are distinct (responses of >= `min_words` words)."""
    words = _WORD.findall(text.lower())
    if len(words) < min_words:
        return False
    grams = list(zip(words, words[1:], words[2:]))
    return len(set(grams)) / len(grams) < min_unique


def is_degenerate(text: str, min_chars: int, min_alnum_share: float) -> bool:
    """Too short once stripped, or mostly punctuation and symbols."""
    stripped = text.strip()
    if len(stripped) < min_chars:
        return True
    visible = [c for c in stripped if not c.isspace()]
    return sum(c.isalnum() for c in visible) / len(visible) < min_alnum_share


def is_boilerplate(text: str) -> bool:
    """Opens with a refusal or an AI disclaimer (`BOILERPLATE_OPENINGS`) within its first 100 characters."""
    head = text.strip()[:100].lower().replace("\u2019", "'")
    return any(phrase in head for phrase in BOILERPLATE_OPENINGS)


# --- rule sets ---

Rule = Callable[[NectarRow], "str | None"]


class GeneratorRules(BaseModel):
    """Appendix B.1's rules for generator sets; None switches a rule off (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    min_responses: int | None = Field(7, ge=2)
    min_prompt_chars: int | None = Field(50, ge=0)
    max_prompt_chars: int | None = Field(None, ge=1)
    """Ours, off by default: drop longer prompts (small CPU runs)."""
    max_response_chars: int | None = Field(None, ge=1)
    """Ours, off by default: drop rows with a longer response (small CPU runs)."""
    min_top_chars: int | None = Field(50, ge=0)
    max_repetitive: int | None = Field(1, ge=0)
    min_unique_trigrams: float = Field(0.5, gt=0, le=1)
    max_degenerate: int | None = Field(0, ge=0)
    min_response_chars: int = Field(5, ge=0)
    min_alnum_share: float = Field(0.5, ge=0, le=1)
    min_useful: int | None = Field(4, ge=0)
    min_useful_chars: int = Field(50, ge=0)
    max_boilerplate: int | None = Field(2, ge=0)

    def rules(self) -> dict[str, Rule]:
        """Rule name -> predicate, in the order they are applied (LMSYS first, always on)."""
        out: dict[str, Rule] = {"lmsys_heldout": _lmsys, "ranked": _ranked}
        if self.min_responses is not None:
            out["min_responses"] = partial(_at_least_responses, most=self.min_responses)
        if self.min_prompt_chars is not None:
            out["min_prompt_chars"] = partial(_long_prompt, chars=self.min_prompt_chars, exempt=None)
        if self.max_prompt_chars is not None:
            out["max_prompt_chars"] = partial(_short_prompt, chars=self.max_prompt_chars)
        if self.max_response_chars is not None:
            out["max_response_chars"] = partial(_short_responses, chars=self.max_response_chars)
        if self.min_top_chars is not None:
            out["min_top_chars"] = partial(_long_top, chars=self.min_top_chars)
        if self.max_repetitive is not None:
            out["repetitive"] = _count_rule("repetitive", self.max_repetitive,
                                            lambda t: is_repetitive(t, self.min_unique_trigrams))
        if self.max_degenerate is not None:
            out["degenerate"] = _count_rule("degenerate", self.max_degenerate, self._degenerate)
        if self.min_useful is not None:
            need = self.min_useful

            def useful(r: NectarRow) -> str | None:
                n = sum(self._useful(t) for t in r.responses)
                return f"{n} useful responses < {need}" if n < need else None

            out["useful"] = useful
        if self.max_boilerplate is not None:
            out["boilerplate"] = _count_rule("boilerplate", self.max_boilerplate, is_boilerplate)
        return out

    def _degenerate(self, text: str) -> bool:
        return is_degenerate(text, self.min_response_chars, self.min_alnum_share)

    def _useful(self, text: str) -> bool:
        return len(text.strip()) >= self.min_useful_chars and not self._degenerate(text) and not is_boilerplate(text)


class PolicyRules(BaseModel):
    """Appendix B.2's rules for policy prompts; None switches a rule off (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    min_prompt_chars: int | None = Field(50, ge=0)
    short_prompt_top_chars: int | None = Field(200, ge=0)
    """The short-prompt exemption (None: no exemption)."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """Ours, off by default: drop longer prompts (small CPU runs)."""
    max_turns: int | None = Field(None, ge=1)
    duplicate: bool = True

    def rules(self) -> dict[str, Rule]:
        out: dict[str, Rule] = {"lmsys_heldout": _lmsys}
        if self.min_prompt_chars is not None:
            out["min_prompt_chars"] = partial(_long_prompt, chars=self.min_prompt_chars,
                                              exempt=self.short_prompt_top_chars)
        if self.max_prompt_chars is not None:
            out["max_prompt_chars"] = partial(_short_prompt, chars=self.max_prompt_chars)
        if self.max_turns is not None:
            out["max_turns"] = partial(_few_turns, most=self.max_turns)
        if self.duplicate:
            seen: set[str] = set()

            def duplicate(r: NectarRow) -> str | None:
                key = r.prompt.strip()
                if key in seen:
                    return "duplicate prompt"
                seen.add(key)
                return None

            out["duplicate"] = duplicate
        return out


def _at_least_responses(r: NectarRow, *, most: int) -> str | None:
    return f"{len(r.responses)} responses < {most}" if len(r.responses) < most else None


def _long_prompt(r: NectarRow, *, chars: int, exempt: int | None) -> str | None:
    """Over `chars` characters, or (the short-prompt exemption, when `exempt` is set) a rank-1 response of at
    least `exempt` characters."""
    if len(r.prompt) > chars:
        return None
    if exempt is not None and r.responses and len(r.responses[0].strip()) >= exempt:
        return None
    return f"prompt of {len(r.prompt)} chars <= {chars}"


def _short_prompt(r: NectarRow, *, chars: int) -> str | None:
    return f"prompt of {len(r.prompt)} chars > {chars}" if len(r.prompt) > chars else None


def _short_responses(r: NectarRow, *, chars: int) -> str | None:
    longest = max((len(t) for t in r.responses), default=0)
    return f"a response of {longest} chars > {chars}" if longest > chars else None


def _long_top(r: NectarRow, *, chars: int) -> str | None:
    top = len(r.responses[0].strip()) if r.responses else 0
    return f"top response of {top} chars <= {chars}" if top <= chars else None


def _few_turns(r: NectarRow, *, most: int) -> str | None:
    return f"{r.turns} turns > {most}" if r.turns > most else None


def _ranked(r: NectarRow) -> str | None:
    return None if r.ranked else "the responses carry no rank (an anchor needs GPT-4's ranking)"


def _lmsys(r: NectarRow) -> str | None:
    return "LMSYS-Chat-1M is the held-out listwise benchmark" if LMSYS_SOURCE in r.sources else None


def _count_rule(name: str, most: int, test: Callable[[str], bool]) -> Rule:
    def rule(r: NectarRow) -> str | None:
        n = sum(test(t) for t in r.responses)
        return f"{n} {name} responses > {most}" if n > most else None

    return rule


@dataclass(slots=True)
class FilterReport:
    """What `filter_rows` kept and dropped."""

    seen: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """Rule name -> rows it dropped (each row counted under the first rule that dropped it)."""
    examples: dict[str, str] = field(default_factory=dict)
    """Rule name -> the first dropped row's id and reason."""

    def lines(self) -> list[str]:
        out = [f"{self.seen} rows, {self.kept} kept"]
        out += [f"  dropped by {rule}: {n} (first: {self.examples[rule]})" for rule, n in self.dropped.items()]
        return out


def filter_rows(rows: Iterable[NectarRow], rules: Mapping[str, Rule], report: FilterReport) -> Iterator[NectarRow]:
    """The rows every rule keeps, lazily; `report` counts them and each rule's drops as they are read."""
    for row in rows:
        report.seen += 1
        for name, rule in rules.items():
            why = rule(row)
            if why is not None:
                report.dropped[name] = report.dropped.get(name, 0) + 1
                report.examples.setdefault(name, f"{row.id}: {why}")
                break
        else:
            report.kept += 1
            yield row


def fingerprint(rows: Sequence[NectarRow]) -> str:
    """A short hash of the rows (ids, prompts, responses), in order: the data fingerprint of a checkpoint."""
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps([r.id, r.prompt, list(r.responses)], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()[:16]
