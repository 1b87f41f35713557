"""AlpacaEval 2's judge: the policy's output against the reference (the metrics: `benchmarks.alpaca_eval2_score`).

Upstream: `tatsu-lab/alpaca_eval` (Apache-2.0 code; the 805 instructions and reference outputs are CC BY-NC 4.0 data
on the Hugging Face dataset `tatsu-lab/alpaca_eval`). One annotation per instruction: the reference output
(`output_1`, `gpt4_1106_preview`), the policy's output (`output_2`) and the judge's `preference` in [1, 2]
(1: the reference is better, 2: the policy is; continuous when read from the judge's logprobs, 1.5 a draw).

The judge (`AlpacaJudge`) follows `weighted_alpaca_eval_gpt4_turbo`: one request per instruction showing the two
outputs as `m` and `M` in an order drawn from (seed, item id) (alpaca_eval randomises it too,
`is_randomize_output_order`), answered with one token; the preference is read from the next-token logprobs of `m`
and `M` (`logprob_parser`, not binarised: 1 + P(the policy's label) after mapping the order back) where the backend
has them, and from the label itself (1 or 2) otherwise. Identical outputs get 1.5 without a call, as in
alpaca_eval. Our prompt by default; alpaca_eval's own is read from the installed package with `template=alpaca_eval`.
Deviation, stated: alpaca_eval samples its judge at temperature 1 with `max_tokens=1`; the logprob path here reads
the distribution at the first position without sampling (the same numbers), and the discrete path is greedy.

`alpaca-eval` imports `pkg_resources`, which `setuptools>=81` removed: the `policy` extra pins `setuptools<81`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.alpaca_eval2_score import metrics_module
from harness.backends.base import Constraint, LogprobRequest, Message, SamplingParams
from harness.errors import ConfigError, Failure, FailureCategory
from harness.seeds import derive_seed
from judges.templates import render_template
from judges.ask import Ask, ask_all

if TYPE_CHECKING:
    from benchmarks.base import PolicyItem
    from harness.backends.base import BaseBackend

__all__ = [
    "JUDGE_MODES",
    "LABELS",
    "AlpacaJudge",
    "AlpacaJudgment",
    "parse_label",
    "read_upstream_template",
    "upstream_messages",
]

# --- the judge: one comparison per instruction, the policy's output against the reference ---

LABELS = ("m", "M")
"""The judge's two answers: `m` for the output shown first, `M` for the second (alpaca_eval's tokens)."""
JUDGE_MODES = ("auto", "logprob", "discrete")
UPSTREAM_TEMPLATE = "alpaca_eval"
"""`template=alpaca_eval`: the installed package's `weighted_alpaca_eval_gpt4_turbo` prompt (read, not copied)."""
_PLACEHOLDER = re.compile(r"\{(instruction|output_1|output_2)\}")
_CHATML_ROLES = {"system", "user", "assistant"}


@dataclass(frozen=True, slots=True)
class AlpacaJudgment:
    """The judge's verdict on one instruction, in the annotation frame (output_1 = the reference)."""

    item: str
    """The `PolicyItem` id."""
    preference: float | None
    """1: the reference is better, 2: the policy's output is; in between from the judge's logprobs (1 + P(the
    policy's label)); 1.5 for identical outputs (not judged, as alpaca_eval); None when the judgment failed."""
    policy_first: bool
    """Whether the policy's output was shown first (`m`); drawn from the seed, mapped back in `preference`."""
    mode: str
    """`logprob`, `discrete` or `identical`."""
    failure: Failure | None = None
    """Why there is no preference."""
    raw: dict[str, Any] = field(default_factory=dict)
    """`logprobs` of the two labels, or the judge's `answers` (first and, if re-asked, second)."""

    def annotation(self, item: PolicyItem, output: str, *, generator: str, annotator: str) -> dict[str, Any]:
        """The alpaca_eval annotation row (`alpaca_metrics`, `length_controlled` read these)."""
        return {
            "instruction": item.meta["instruction"],
            "output_1": item.meta["reference"],
            "generator_1": item.meta.get("reference_generator", "reference"),
            "output_2": output,
            "generator_2": generator,
            "annotator": annotator,
            "preference": self.preference,
        }


def upstream_messages(template: str, instruction: str, first: str, second: str) -> tuple[Message, ...]:
    """An alpaca_eval prompt template (chat-ML text with `{instruction}`, `{output_1}`, `{output_2}`) filled
    in one pass (inserted texts are never re-read) and split into messages by alpaca_eval's `prompt_to_chatml`.

    Raises:
        ConfigError: for a template without the three placeholders or with a role other than
            system/user/assistant.
    """
    found = set(_PLACEHOLDER.findall(template))
    if found != {"instruction", "output_1", "output_2"}:
        raise ConfigError(f"an AlpacaEval template needs {{instruction}}, {{output_1}} and {{output_2}}; found "
                          f"{sorted(found)}")
    values = {"instruction": instruction, "output_1": first, "output_2": second}
    text = _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    metrics_module()
    from alpaca_eval.utils import prompt_to_chatml

    out = []
    for turn in prompt_to_chatml(text):
        if turn["role"] not in _CHATML_ROLES or "name" in turn:
            raise ConfigError(f"an AlpacaEval template turn with role {turn['role']!r} "
                              f"{'and a name ' if 'name' in turn else ''}cannot be sent as a chat message")
        out.append(Message(turn["role"], turn["content"]))
    return tuple(out)


def read_upstream_template(template: str) -> str:
    """The text of `template`: `alpaca_eval` (the installed package's weighted_alpaca_eval_gpt4_turbo prompt) or a
    path to a chat-ML template file.

    Raises:
        ConfigError: when the file (or the package's) cannot be read.
    """
    if template == UPSTREAM_TEMPLATE:
        metrics = metrics_module()
        root = Path(metrics.__file__).resolve().parent.parent / "evaluators_configs"
        path = root / "alpaca_eval_clf_gpt4_turbo" / "alpaca_eval_clf.txt"
    else:
        path = Path(template)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the AlpacaEval template {path}: {exc.strerror}") from None


def parse_label(text: str) -> str:
    """The label of a discrete answer: `m` or `M`, alone after stripping whitespace, quotes, backticks and a final
    period (case matters: the two labels differ only by it).

    Raises:
        ValueError: saying what the answer was instead.
    """
    stripped = text.strip().strip("`'\"*").rstrip(".").strip()
    if stripped in LABELS:
        return stripped
    shown = repr(text[:80]) if text.strip() else "an empty answer"
    raise ValueError(f"expected exactly `m` or `M`, got {shown}")


class AlpacaJudge:
    """AlpacaEval 2's judge: the policy's output against the reference, in an order drawn from the seed.

    `mode`: `logprob` reads the judge's next-token distribution over `m`/`M` (`weighted_alpaca_eval_gpt4_turbo`:
    preference = 1 + P(the policy's label) among the two); `discrete` asks for the label and reads it strictly
    (re-asked once, then a PARSE failure); `auto` (default) reads logprobs and falls back to `discrete` for good
    when the backend has none (UNSUPPORTED). The prompt is ours (`judges/prompts/alpaca_pairwise.txt`) unless
    `template` names alpaca_eval's (`alpaca_eval`, read from the installed package) or a chat-ML file.
    """

    def __init__(self, backend: BaseBackend, *, mode: str = "auto", template: str | None = None,
                 structured: bool = True, max_tokens: int = 8) -> None:
        if mode not in JUDGE_MODES:
            raise ConfigError(f"AlpacaEval judge mode {mode!r}; valid: {', '.join(JUDGE_MODES)}")
        self.backend = backend
        self.mode = mode
        self.template = template
        self._upstream = read_upstream_template(template) if template else None
        self.structured = structured
        self.max_tokens = max_tokens
        self._discrete = mode == "discrete"
        self.requests = 0
        """Requests sent to the backend (re-asks included)."""

    @property
    def settings(self) -> dict[str, Any]:
        """What the judgment depends on besides the judge model (recorded with every judgment)."""
        return {"mode": self.mode, "template": self.template or "ours", "structured": self.structured,
                "max_tokens": self.max_tokens}

    def messages(self, instruction: str, first: str, second: str) -> tuple[Message, ...]:
        """The judge's chat: `first` shown as `m`, `second` as `M`."""
        if self._upstream is not None:
            return upstream_messages(self._upstream, instruction, first, second)
        text = render_template("alpaca_pairwise", instruction=instruction, first=first, second=second)
        return (Message("user", text),)

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        trace = {
            "judgment": {"preference": j.preference, "policy_first": j.policy_first, "mode": j.mode, "raw": j.raw},
            # What alpaca_eval's length-controlled GLM reads (`judges.alpaca.length_controlled`).
            "annotation": {"instruction": item.meta["instruction"], "output_1": item.meta["reference"],
                           "generator_1": item.meta.get("reference_generator", "reference"), "output_2": text},
        }
        failures = (("judge", j.failure),) if j.failure is not None else ()
        return (j.preference,), trace, failures

    async def judge_all(self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int) -> list[AlpacaJudgment]:
        """Judge every (item, policy output) pair: the logprob requests in one batch, the discrete ones in another
        (with one re-ask batch); aligned with `pairs`."""
        order = [random.Random(derive_seed(seed, item.id, "order")).random() < 0.5 for item, _ in pairs]
        out: list[AlpacaJudgment | None] = [None] * len(pairs)
        chats = {}
        for i, ((item, output), policy_first) in enumerate(zip(pairs, order)):
            reference = item.meta["reference"]
            if output == reference:  # alpaca_eval does not judge identical outputs
                out[i] = AlpacaJudgment(item.id, 1.5, policy_first, "identical")
                continue
            first, second = (output, reference) if policy_first else (reference, output)
            chats[i] = self.messages(item.meta["instruction"], first, second)
        todo = list(chats)
        if todo and not self._discrete:
            found = await self.backend.next_token_logprobs([LogprobRequest(chats[i]) for i in todo], LABELS)
            self.requests += len(todo)
            left = []
            for i, result in zip(todo, found):
                item = pairs[i][0]
                if result.error is not None and result.error.category is FailureCategory.UNSUPPORTED \
                        and self.mode == "auto":
                    self._discrete = True
                    left.append(i)
                elif result.error is not None:
                    out[i] = AlpacaJudgment(item.id, None, order[i], "logprob", result.error)
                else:
                    out[i] = _from_logprobs(item.id, order[i], result.logprobs)
            todo = left
        if todo:
            params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens,
                                    constraint=Constraint.choice(list(LABELS)) if self.structured else None)
            asks = [Ask(chats[i], params, parse_label, lambda problem: render_template("retry_alpaca",
                                                                                        problem=problem))
                    for i in todo]
            requests, _ = await ask_all(self.backend, asks)
            self.requests += requests
            for i, ask in zip(todo, asks):
                item = pairs[i][0]
                raw = {"answers": list(ask.texts)}
                if ask.failure is not None:
                    out[i] = AlpacaJudgment(item.id, None, order[i], "discrete", ask.failure, raw)
                    continue
                policy_won = (ask.result == "m") == order[i]
                out[i] = AlpacaJudgment(item.id, 2.0 if policy_won else 1.0, order[i], "discrete", None, raw)
        return out  # type: ignore[return-value]


def _from_logprobs(item: str, policy_first: bool, logprobs: Mapping[str, float]) -> AlpacaJudgment:
    """The weighted preference from the two labels' logprobs (alpaca_eval's `logprob_parser`, not binarised)."""
    lp_first, lp_second = logprobs.get("m", -math.inf), logprobs.get("M", -math.inf)
    # A label outside the judge's top tokens has logprob -inf, which JSON cannot hold: it is listed as unranked.
    listed = {label: lp for label, lp in (("m", lp_first), ("M", lp_second)) if lp > -math.inf}
    raw: dict[str, Any] = {"logprobs": listed, "unranked": [label for label in LABELS if label not in listed]}
    if lp_first == -math.inf and lp_second == -math.inf:
        failure = Failure(FailureCategory.PARSE, "neither `m` nor `M` is among the judge's top next tokens")
        return AlpacaJudgment(item, None, policy_first, "logprob", failure, raw)
    top = max(lp_first, lp_second)
    p_first = math.exp(lp_first - top) / (math.exp(lp_first - top) + math.exp(lp_second - top))
    p_policy = p_first if policy_first else 1.0 - p_first
    return AlpacaJudgment(item, 1.0 + p_policy, policy_first, "logprob", None, raw)
