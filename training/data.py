"""Training data from Nectar: the generator's anchor sets (Appendix B.1) and the policy's prompts (B.2).

Every rule is a named predicate over one Nectar row (`NectarRow`) that says why the row is dropped, or None to keep
it; its thresholds are fields of the rule set (`GeneratorRules`, `PolicyRules`) so a config can change or switch
off each one, and `filter_rows` counts the drops per rule (the first rule that drops a row gets it) for the log,
the manifest and `harness train ... --dry-run`. Rows from LMSYS-Chat-1M are never training data: they are the
held-out listwise benchmark (`nectar_lmsys`); that rule (`lmsys_heldout`) cannot be switched off. What a response
*is* (broken, a plain refusal, a refusal with a helpful alternative, greeting-only, clarification-only,
boilerplate, repetitive) is decided in `training.responses`, whose tests are ours.

**The paper's numbers** (the defaults):

B.1, generator sets (a prompt with its 7 GPT-4-ranked responses, the anchor of `anchor_reward`):
- `min_responses`: at least 7 responses.
- `min_prompt_chars` / `min_top_chars`: the prompt, and the rank-1 response, over 50 characters.
- `repetitive`: any repetitive response discards the set (`max_repetitive: 0`).
- `degenerate`: 4 or more degenerate responses discard it (`max_degenerate: 3`); degenerate is broken text, a
  plain refusal, a greeting-only or a clarification-only reply.
- `boilerplate`: 4 or more boilerplate responses discard it (`max_boilerplate: 3`). A refusal with a helpful
  alternative is useful, not boilerplate.

B.2, policy prompts:
- `min_responses`: at least 7 associated responses.
- `min_top_chars`: the rank-1 response over 50 characters; `top_response`: it is not broken, repetitive, a
  plain refusal, or a greeting or clarification only.
- `min_prompt_chars`: the prompt over 50 characters, except for sources whose prompts are filtered upstream
  (`short_prompt_sources`).

**Ours**, each stated with its rule:
- `ranked` (both): the responses carry GPT-4's ranks; the anchor reward and B.2's top-ranked rules need them.
- `useful` (B.1): at least `min_useful` (4) responses are useful: at least `min_useful_chars` (50) characters,
  neither degenerate, boilerplate nor repetitive (a refusal with a helpful alternative is useful).
- The response tests' own thresholds (`min_unique_trigrams` 0.5, `min_alnum_share` 0.3,
  `min_alternative_chars` 40, `max_clarification_chars` 400: `training.responses`).
- `short_prompt_sources` (B.2): which sources the paper's exemption names is not stated in our sources; ours are
  the sources Nectar took from UltraFeedback's curated pools (`UPSTREAM_FILTERED`), not the raw chat logs
  (`anthropic-hh`, `sharegpt`, `lmsys-chat-1m`). A row without a `source` gets no exemption.
- `max_turns` (B.2, off), `duplicate` (B.2, on): each rendered prompt once (the first row wins).
- `max_prompt_chars` (both, off) and `max_response_chars` (B.1, off): length caps for small CPU runs (every anchor
  is verified against every rubric item).

Response sets for the generator are sampled from the current policy (`sample_sets`) with the harness's own
generation (`harness.generation`, any backend, cached and resumable) and stored with the policy's identity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import ConfigError
from training.responses import DEGENERATE, Kind

LMSYS_SOURCE = "lmsys-chat-1m"
UPSTREAM_FILTERED = ("evol_instruct", "false_qa", "flan_v2_cot", "flan_v2_flan2021", "flan_v2_niv2", "flan_v2_p3",
                     "truthful_qa", "ultrachat")
"""Nectar sources whose prompts were filtered upstream (UltraFeedback's curated pools): B.2's short-prompt
exemption (our reading of the paper's rule; see the module docstring)."""


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


# --- rule sets ---

Rule = Callable[[NectarRow], "str | None"]


class ResponseTests(BaseModel):
    """The thresholds of `training.responses`' tests (ours; see its docstring)."""

    model_config = ConfigDict(extra="forbid")

    min_unique_trigrams: float = Field(0.5, gt=0, le=1)
    """Repetitive: fewer distinct word 3-grams than this share."""
    min_alnum_share: float = Field(0.3, ge=0, le=1)
    """Broken: fewer letters and digits than this share of the visible characters."""
    min_alternative_chars: int = Field(40, ge=0)
    """A refusal's (or a disclaimer's) helpful alternative: at least this many characters."""
    max_clarification_chars: int = Field(400, ge=1)
    """Clarification-only: at most this many characters."""

    def kind(self, text: str) -> Kind:
        from training.responses import classify

        return classify(text, min_alnum_share=self.min_alnum_share, min_alternative_chars=self.min_alternative_chars,
                        max_clarification_chars=self.max_clarification_chars)

    def repetitive(self, text: str) -> bool:
        from training.responses import is_repetitive

        return is_repetitive(text, self.min_unique_trigrams)


class GeneratorRules(ResponseTests):
    """Appendix B.1's rules for generator sets; None switches a rule off (see the module docstring)."""

    min_responses: int | None = Field(7, ge=2)
    """The paper: at least 7 responses."""
    min_prompt_chars: int | None = Field(50, ge=0)
    """The paper: a prompt over 50 characters."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """Ours, off by default: drop longer prompts (small CPU runs)."""
    max_response_chars: int | None = Field(None, ge=1)
    """Ours, off by default: drop rows with a longer response (small CPU runs)."""
    min_top_chars: int | None = Field(50, ge=0)
    """The paper: a rank-1 response over 50 characters."""
    max_repetitive: int | None = Field(0, ge=0)
    """The paper: any repetitive response discards the set."""
    max_degenerate: int | None = Field(3, ge=0)
    """The paper: 4 or more degenerate responses discard the set."""
    max_boilerplate: int | None = Field(3, ge=0)
    """The paper: 4 or more boilerplate responses discard the set."""
    min_useful: int | None = Field(4, ge=0)
    """Ours: at least this many useful responses."""
    min_useful_chars: int = Field(50, ge=0)
    """Ours: a useful response's least length."""

    def rules(self) -> dict[str, Rule]:
        """Rule name -> predicate, in the order they are applied (LMSYS first, always on)."""
        out: dict[str, Rule] = {"lmsys_heldout": _lmsys, "ranked": _ranked}
        if self.min_responses is not None:
            out["min_responses"] = partial(_at_least_responses, most=self.min_responses)
        if self.min_prompt_chars is not None:
            out["min_prompt_chars"] = partial(_long_prompt, chars=self.min_prompt_chars, exempt=())
        if self.max_prompt_chars is not None:
            out["max_prompt_chars"] = partial(_short_prompt, chars=self.max_prompt_chars)
        if self.max_response_chars is not None:
            out["max_response_chars"] = partial(_short_responses, chars=self.max_response_chars)
        if self.min_top_chars is not None:
            out["min_top_chars"] = partial(_long_top, chars=self.min_top_chars)
        if self.max_repetitive is not None:
            out["repetitive"] = _count_rule("repetitive", self.max_repetitive, self.repetitive)
        if self.max_degenerate is not None:
            out["degenerate"] = _count_rule("degenerate", self.max_degenerate, lambda t: self.kind(t) in DEGENERATE)
        if self.max_boilerplate is not None:
            out["boilerplate"] = _count_rule("boilerplate", self.max_boilerplate,
                                             lambda t: self.kind(t) is Kind.BOILERPLATE)
        if self.min_useful is not None:
            need = self.min_useful

            def useful(r: NectarRow) -> str | None:
                n = sum(self.useful(t) for t in r.responses)
                return f"{n} useful responses < {need}" if n < need else None

            out["useful"] = useful
        return out

    def useful(self, text: str) -> bool:
        """At least `min_useful_chars` characters, neither degenerate, boilerplate nor repetitive."""
        return (len(text.strip()) >= self.min_useful_chars and self.kind(text) is Kind.OK
                and not self.repetitive(text))


class PolicyRules(ResponseTests):
    """Appendix B.2's rules for policy prompts; None switches a rule off (see the module docstring)."""

    min_responses: int | None = Field(7, ge=2)
    """The paper: at least 7 associated responses."""
    min_prompt_chars: int | None = Field(50, ge=0)
    """The paper: a prompt over 50 characters, unless its source is in `short_prompt_sources`."""
    short_prompt_sources: tuple[str, ...] = UPSTREAM_FILTERED
    """The paper's exemption: sources whose prompts are filtered upstream (which ones is ours; () for none)."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """Ours, off by default: drop longer prompts (small CPU runs)."""
    max_turns: int | None = Field(None, ge=1)
    """Ours, off by default: at most this many human turns."""
    min_top_chars: int | None = Field(50, ge=0)
    """The paper: a rank-1 response over 50 characters."""
    top_response: bool = True
    """The paper: the rank-1 response is not broken, repetitive, a plain refusal, or a greeting or clarification
    only."""
    duplicate: bool = True
    """Ours: each rendered prompt once."""

    def rules(self) -> dict[str, Rule]:
        """Rule name -> predicate, in the order they are applied (LMSYS first, always on)."""
        out: dict[str, Rule] = {"lmsys_heldout": _lmsys}
        if self.min_responses is not None:
            out["min_responses"] = partial(_at_least_responses, most=self.min_responses)
        if self.min_prompt_chars is not None:
            out["min_prompt_chars"] = partial(_long_prompt, chars=self.min_prompt_chars,
                                              exempt=tuple(self.short_prompt_sources))
        if self.max_prompt_chars is not None:
            out["max_prompt_chars"] = partial(_short_prompt, chars=self.max_prompt_chars)
        if self.max_turns is not None:
            out["max_turns"] = partial(_few_turns, most=self.max_turns)
        if self.min_top_chars is not None or self.top_response:
            out["ranked"] = _ranked
        if self.min_top_chars is not None:
            out["min_top_chars"] = partial(_long_top, chars=self.min_top_chars)
        if self.top_response:
            out["top_response"] = self._top_response
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

    def _top_response(self, r: NectarRow) -> str | None:
        top = r.responses[0] if r.responses else ""
        if self.repetitive(top):
            return "the top response is repetitive"
        kind = self.kind(top)
        return f"the top response is {_SAID[kind]}" if kind in DEGENERATE else None


_SAID = {Kind.BROKEN: "broken", Kind.GREETING_ONLY: "a greeting only", Kind.CLARIFICATION_ONLY:
         "a clarification request only", Kind.PLAIN_REFUSAL: "a plain refusal"}


def _at_least_responses(r: NectarRow, *, most: int) -> str | None:
    return f"{len(r.responses)} responses < {most}" if len(r.responses) < most else None


def _long_prompt(r: NectarRow, *, chars: int, exempt: tuple[str, ...]) -> str | None:
    """Over `chars` characters, or (the short-prompt exemption) from a source in `exempt`."""
    if len(r.prompt) > chars or any(s in exempt for s in r.sources):
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
    return None if r.ranked else "the responses carry no rank (the anchor and the top-ranked rules need GPT-4's)"


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
