"""Rubric evaluators: `dynamic-rubric` (DR-Generator: rubric from the prompt and the candidates) and `static-rubric`
(the Rubrics-as-Rewards baseline: rubric from the prompt alone). Both verify with the DR-Verifier (`judges.verify`).

One `score_set` call: (1) the generator writes a weighted yes/no rubric as JSON (`[{"criterion": ..., "weight":
1..5}]`); the dynamic generator sees the K candidates labelled Response A, B, ... in an order shuffled by
`derive_seed(seed, "order")`; (2) the verifier answers every item for every response; (3) each response's score is
`sum_m w_m v_m / sum_m w_m` (`judges.rubric.aggregate`). A rubric the parser rejects is asked for again once, with
the parser's complaint; if it fails again every score is None and the failure is recorded (stage
`generate_rubric`). A response with any unanswered item is left unscored (None), never scored on a partial rubric.

Settings (`dynamic-rubric:generator=SPEC,...`): `generator` (model spec, required), `verifier` (default: the
generator), `mode` (`per_item` | `batched` | `logprob`, default `per_item`, the paper's scheme), `gen_temperature`
(0.7: AVG@5 needs a different rubric sample per seed), `gen_max_tokens` (1024), `verify_max_tokens` (16 per verdict;
an answer sheet gets 16 x M; `logprob` generates nothing), `structured` (true: the generator decodes under the rubric's
grammar, `rubric_constraint`, and the verifier under its answer's shape (`judges.verify`), where the backend supports
structured output; false: free text, read by the parsers alone). The grammar's bounds follow `gen_max_tokens`: up to
gen_max_tokens // 64 items (1..20), each criterion bounded in tokens, so that on `hf` and `vllm` a constrained rubric
always closes within its budget (remote servers get the JSON schema, `judges.rubric.rubric_schema`, of the same item
count); a budget below 43 tokens is refused when the evaluator is built.

Deviations from the paper: the prompts are ours (the paper's are not reproduced); `batched`/`logprob` verification
and the single re-ask on unparsable output are additions; the static baseline uses our static prompt with whatever
generator is named, not the paper's 235B model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.backends.base import BaseBackend, Constraint, Message, SamplingParams
from harness.errors import ConfigError
from harness.seeds import derive_seed
from judges.base import SetScores, StageFailure, Trace, format_evaluator_spec, resolve_settings
from judges.rubric import (
    MAX_ITEMS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    Rubric,
    aggregate,
    item_pass_rates,
    parse_rubric,
    rubric_schema,
    saturated_share,
)
from judges.templates import render_template, response_label
from judges.ask import Ask, ask_all
from judges.verify import VERIFY_MODES, VerifyMode, verify

if TYPE_CHECKING:
    from harness.pool import BackendPool

__all__ = [
    "RubricEvaluator",
    "build_dynamic",
    "build_static",
    "dynamic_generator_prompt",
    "presentation_order",
    "static_generator_prompt",
]

TOKENS_PER_ITEM = 64
"""Budget of one constrained rubric item: its JSON around the criterion (`ITEM_JSON_TOKENS`) and a criterion of up
to about 30 tokens."""
ITEM_JSON_TOKENS = 33
"""An upper bound, for every tokenizer, of an item's tokens outside its criterion: the 32 bytes of
`{"criterion": "`, `", "weight": `, the digit, `}` and `, ` (no token is shorter than a byte), and one token that may
straddle the criterion's end."""
MIN_CRITERION_TOKENS = 8
MAX_CRITERION_TOKENS = 36
"""A criterion's cap in tokens where the budget leaves more: about the 160 characters a criterion had when it was
bounded in characters (a sentence of English)."""
CRITERION_CHARS = 160
"""The criterion's length in the JSON schema that remote servers get (local backends bound it in tokens)."""
# A JSON string's characters without escapes, the first neither whitespace nor end punctuation (so a criterion is
# never empty once normalised), at most judges.rubric.MAX_CRITERION_CHARS in all.
_CRITERION = r'/[^"\\\x00-\x1f\s.,;:!?][^"\\\x00-\x1f]{0,399}/'


def rubric_budget(max_tokens: int) -> tuple[int, int]:
    """(items, criterion tokens) of the rubric grammar for a budget of `max_tokens`: max_tokens // TOKENS_PER_ITEM
    items (1..20), each criterion the tokens the budget leaves it, so that `2 + items x (ITEM_JSON_TOKENS +
    criterion tokens) <= max_tokens`.

    Raises:
        ConfigError: a budget below `2 + ITEM_JSON_TOKENS + MIN_CRITERION_TOKENS` (43), too small for one item.
    """
    smallest = 2 + ITEM_JSON_TOKENS + MIN_CRITERION_TOKENS
    if max_tokens < smallest:
        raise ConfigError(
            f"a constrained rubric needs a budget of at least {smallest} tokens (one item: {ITEM_JSON_TOKENS} for "
            f"its JSON, {MIN_CRITERION_TOKENS} for a criterion, 2 for the brackets), got max_tokens={max_tokens}; "
            "raise gen_max_tokens (or max_completion_length), or set structured=false"
        )
    items = max(1, min(MAX_ITEMS, max_tokens // TOKENS_PER_ITEM))
    criterion = min(MAX_CRITERION_TOKENS, (max_tokens - 2) // items - ITEM_JSON_TOKENS)
    return items, criterion


def rubric_constraint(max_tokens: int) -> Constraint:
    """The generator's structured output (`structured=true`): a rubric list that always closes within
    `max_tokens` (`rubric_budget`).

    Local backends decode under a Lark grammar whose criterion is a lexeme of at most `criterion` tokens
    (llguidance's `max_tokens`), in at most `items` items; its fixed parts then force the list closed, so the
    output parses at every budget the grammar accepts. It starts with the rubric: no reasoning block, which no
    budget could bound. Remote servers get the JSON schema of the same bounds (criteria of at most
    CRITERION_CHARS characters).

    Raises:
        ConfigError: a budget too small for one item.
    """
    items, criterion = rubric_budget(max_tokens)
    more = f' (", " item){{0,{items - 1}}}' if items > 1 else ""
    lark = (
        f'body: "[" item{more} "]"\n'
        'item: "{\\"criterion\\": \\"" criterion "\\", \\"weight\\": " WEIGHT "}"\n'
        f"criterion[max_tokens={criterion}]: {_CRITERION}\n"
        f"WEIGHT: /[{MIN_WEIGHT}-{MAX_WEIGHT}]/\n"
    )
    schema = rubric_schema(max_items=items, max_chars=CRITERION_CHARS)
    return Constraint.json_schema(schema, name="rubric", lark=lark)

SUBJECT = "generator"
"""The setting under test when two runs of a row are compared (`judges.held_fixed`)."""


def explicit_settings(settings: dict[str, str]) -> dict[str, str]:
    """The settings with the implicit verifier (the generator) written out."""
    out = dict(settings)
    if "generator" in out:
        out.setdefault("verifier", out["generator"])
    return out


_DEFAULTS: dict[str, Any] = {
    "verifier": None,
    "mode": "per_item",
    "gen_temperature": 0.7,
    "gen_max_tokens": 1024,
    "verify_max_tokens": 16,
    "structured": True,
}


def presentation_order(k: int, seed: int) -> list[int]:
    """The order the generator sees the K responses in: a shuffle seeded by `derive_seed(seed, "order")`."""
    order = list(range(k))
    random.Random(derive_seed(seed, "order")).shuffle(order)
    return order


def dynamic_generator_prompt(prompt: str, responses: Sequence[str], order: Sequence[int]) -> str:
    """The DR-Generator's request: the prompt, then the responses in `order`, labelled A, B, ... by position."""
    blocks = []
    for position, index in enumerate(order):
        label = response_label(position)
        blocks.append(f"[Response {label}]\n{responses[index]}\n[End of Response {label}]")
    return render_template("dynamic_generator", prompt=prompt, responses="\n\n".join(blocks))


def static_generator_prompt(prompt: str) -> str:
    """The static (Rubrics-as-Rewards) generator's request: the prompt alone."""
    return render_template("static_generator", prompt=prompt)


class RubricEvaluator:
    """Generate one rubric per set, verify it on every response, aggregate. See the module docstring."""

    def __init__(
        self,
        spec: str,
        *,
        generator: BaseBackend,
        verifier: BaseBackend,
        dynamic: bool,
        mode: VerifyMode = "per_item",
        gen_temperature: float = 0.7,
        gen_max_tokens: int = 1024,
        verify_max_tokens: int = 16,
        structured: bool = True,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self.settings = dict(settings or {})
        """Every setting as resolved from the spec, defaults included."""
        self.generator = generator
        self.verifier = verifier
        self.dynamic = dynamic
        self.mode = mode
        self.gen_temperature = gen_temperature
        self.gen_max_tokens = gen_max_tokens
        self.verify_max_tokens = verify_max_tokens
        self.structured = structured

    async def score_set(self, prompt: str, responses: Sequence[str], *, seed: int,
                        reference: str | None = None) -> SetScores:
        """Score every response of the set against one generated rubric (`reference` is not read).

        Raises:
            ValueError: when `responses` is empty.
        """
        del reference
        responses = list(responses)
        if not responses:
            raise ValueError("score_set needs at least one response")
        k = len(responses)
        order = presentation_order(k, seed) if self.dynamic else None
        if order is None:
            text = static_generator_prompt(prompt)
        else:
            text = dynamic_generator_prompt(prompt, responses, order)
        params = SamplingParams(
            temperature=self.gen_temperature,
            max_tokens=self.gen_max_tokens,
            seed=derive_seed(seed, "rubric"),
            constraint=rubric_constraint(self.gen_max_tokens) if self.structured else None,
        )
        ask = Ask(
            (Message("user", text),),
            params,
            parse_rubric,
            lambda problem: render_template("retry_rubric", problem=problem),
        )
        _, calls = await ask_all(self.generator, [ask])
        raw: dict[str, Any] = {"generator": ask.texts[0] if ask.texts else None}
        if ask.problem is not None:
            raw["generator_problem"] = ask.problem
            raw["generator_retry"] = ask.texts[1] if len(ask.texts) > 1 else None
        if ask.failure is not None:
            trace = Trace(
                failures=(StageFailure("generate_rubric", ask.failure),), order=order, raw=raw, calls=calls
            )
            return SetScores((None,) * k, trace)

        rubric: Rubric = ask.result
        if rubric.merged:
            raw["rubric_merged"] = rubric.merged  # repeated criteria kept once (judges.rubric_parser)
        found = await verify(
            self.verifier,
            prompt,
            responses,
            rubric,
            mode=self.mode,
            max_tokens=self.verify_max_tokens,
            structured=self.structured,
        )
        raw["verifier"] = found.raw
        scores, pass_rates, disc, saturated = summarise_verdicts(rubric, found.verdicts)
        trace = Trace(
            failures=found.failures,
            rubric=[{"criterion": i.criterion, "weight": i.weight} for i in rubric.items],
            verdicts=found.verdicts,
            pass_rates=pass_rates,
            discriminability=disc,
            saturated_share=saturated,
            order=order,
            raw=raw,
            calls=calls + found.calls,
        )
        return SetScores(tuple(scores), trace)

    async def close(self) -> None:
        """Nothing to release: the backends belong to the pool, which closes them."""


def summarise_verdicts(
    rubric: Rubric, verdicts: list[list[float | None]]
) -> tuple[list[float | None], list[float | None], list[float | None], float | None]:
    """Scores, per-item pass rates and p(1-p), and the saturated share, over the fully verified responses (a
    response with a missing verdict is unscored); also the held-out fixed rubrics' scores (`training.heldout`)."""
    m, k = len(verdicts), len(verdicts[0])
    scored = [j for j in range(k) if all(row[j] is not None for row in verdicts)]
    scores: list[float | None] = [None] * k
    if not scored:
        return scores, [None] * m, [None] * m, None
    sub = np.array([[row[j] for j in scored] for row in verdicts], dtype=np.float64)
    for j, s in zip(scored, aggregate(rubric.weights, sub)):
        scores[j] = float(s)
    p = item_pass_rates(sub)
    return scores, [float(x) for x in p], [float(x * (1.0 - x)) for x in p], saturated_share(sub)


def _build(kind: str, settings: dict[str, str], pool: BackendPool, *, dynamic: bool) -> RubricEvaluator:
    resolved = resolve_settings(kind, settings, _DEFAULTS, required=("generator",))
    if resolved["verifier"] is None:
        resolved["verifier"] = resolved["generator"]
    if resolved["mode"] not in VERIFY_MODES:
        raise ConfigError(f"evaluator {kind!r}: mode={resolved['mode']!r}; valid: {', '.join(VERIFY_MODES)}")
    temperature = resolved["gen_temperature"]
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"evaluator {kind!r}: gen_temperature must be a finite number >= 0, got {temperature}")
    for key in ("gen_max_tokens", "verify_max_tokens"):
        if resolved[key] < 1:
            raise ConfigError(f"evaluator {kind!r}: {key} must be >= 1, got {resolved[key]}")
    if resolved["structured"]:
        try:
            rubric_budget(resolved["gen_max_tokens"])
        except ConfigError as exc:
            raise ConfigError(f"evaluator {kind!r}: {exc}") from None
    return RubricEvaluator(
        format_evaluator_spec(kind, resolved, defaults={**_DEFAULTS, "verifier": resolved["generator"]}),
        generator=pool.get(resolved["generator"]),
        verifier=pool.get(resolved["verifier"]),
        dynamic=dynamic,
        mode=resolved["mode"],
        gen_temperature=temperature,
        gen_max_tokens=resolved["gen_max_tokens"],
        verify_max_tokens=resolved["verify_max_tokens"],
        structured=resolved["structured"],
        settings=resolved,
    )


def build_dynamic(settings: dict[str, str], pool: BackendPool) -> RubricEvaluator:
    """`dynamic-rubric:generator=SPEC[,verifier=SPEC,mode=...]`: the DR-Generator sees the candidates."""
    return _build("dynamic-rubric", settings, pool, dynamic=True)


def build_static(settings: dict[str, str], pool: BackendPool) -> RubricEvaluator:
    """`static-rubric:generator=SPEC[,...]`: the Rubrics-as-Rewards baseline, rubric from the prompt alone."""
    return _build("static-rubric", settings, pool, dynamic=False)
