"""Per-row controls of the `hf` backend's batched generation: each row of a batch keeps its own budget, stop
strings, `min_tokens`, structured-output constraint and sampling seed (transformers' `generate` takes one setting
per batch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.backends.base import Constraint, TokenLogprob


@dataclass(frozen=True, slots=True)
class Row:
    """One sequence to generate: sample `sample` of request `req`."""

    req: int
    sample: int
    ids: list[int]
    max_new: int
    temperature: float
    top_p: float
    seed: int | None
    stops: tuple[str, ...]
    logprobs: int = 0
    min_new: int = 0
    constraint: Constraint | None = None


@dataclass(frozen=True, slots=True)
class Output:
    """What one row produced."""

    text: str
    n_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None


class RowStopper:
    """Per-row stopping: each row's own `max_new` and stop strings (a `transformers.StoppingCriteria`)."""

    def __init__(self, width: int, rows: Sequence[Row], tokenizer: Any) -> None:
        self.width = width
        self.max_new = [r.max_new for r in rows]
        self.stops = [tuple(s for s in r.stops if s) for r in rows]
        # Enough recent tokens to contain any stop string that ends at the newest token.
        self.window = [max((len(s) for s in stops), default=0) + 8 for stops in self.stops]
        self.stopped_at: list[int | None] = [None] * len(rows)
        self.tokenizer = tokenizer

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        n = input_ids.shape[1] - self.width
        done = []
        for j in range(input_ids.shape[0]):
            hit = self.stopped_at[j] is not None or n >= self.max_new[j]
            if not hit and self.stops[j]:
                tail = input_ids[j, self.width + max(0, n - self.window[j]) :].tolist()
                text = self.tokenizer.decode(tail, skip_special_tokens=True)
                hit = any(s in text for s in self.stops[j])
            if hit and self.stopped_at[j] is None:
                self.stopped_at[j] = n
            done.append(hit)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class RowMinTokens:
    """Per-row `min_tokens`: end-of-sequence ids are banned until a row has that many new tokens."""

    def __init__(self, width: int, rows: Sequence[Row], eos_ids: Sequence[int]) -> None:
        self.width = width
        self.min_new = [r.min_new for r in rows]
        self.eos_ids = list(eos_ids)

    def __call__(self, input_ids, scores):
        n = input_ids.shape[1] - self.width
        rows = [j for j, m in enumerate(self.min_new) if n < m]
        if rows:
            scores = scores.clone()  # generate keeps the tensor it passed in as the step's raw logits
            for j in rows:
                scores[j, self.eos_ids] = float("-inf")
        return scores


class RowConstraint:
    """Per-row structured output (a `transformers.LogitsProcessor`): each constrained row has its own llguidance
    matcher (`harness.backends.grammar.TokenMask`); at every step it takes the row's last token, and only the
    tokens the grammar allows next stay finite. Once the grammar is complete only end-of-sequence is allowed.
    Unconstrained rows pass through. Runs before `RowSampler`, so sampled rows sample from the allowed tokens.

    The matchers write their masks into one int32 bitmask, expanded for all rows at once (no per-token Python).
    """

    def __init__(self, width: int, rows: Sequence[Row], mask: Any, eos_ids: Sequence[int]) -> None:
        import torch

        self.width = width
        self.mask = mask
        self.matchers = [mask.matcher(r.constraint) if r.constraint is not None else None for r in rows]
        self.eos_ids = list(eos_ids)
        self.done = [m is None for m in self.matchers]
        self.bitmask = torch.zeros((len(rows), mask.words), dtype=torch.int32)
        self.shifts = torch.arange(32, dtype=torch.int32)

    def __call__(self, input_ids, scores):
        import torch

        n = input_ids.shape[1] - self.width
        if all(self.done):
            return scores
        masked, ended = [], []
        for j, matcher in enumerate(self.matchers):
            if self.done[j]:
                continue
            if n > 0:
                last = int(input_ids[j, -1])
                if last in self.eos_ids or not matcher.consume_token(last):
                    self.done[j] = True  # ended (or, defensively, left the grammar): the parser judges the text
                    continue
            if matcher.is_stopped():
                ended.append(j)
            else:
                self.mask.fill(matcher, self.bitmask[j])
                masked.append(j)
        if not masked and not ended:
            return scores
        scores = scores.clone()  # generate keeps the tensor it passed in as the step's raw logits
        vocab = scores.shape[1]
        if masked:
            rows = torch.tensor(masked)
            bits = ((self.bitmask[rows].unsqueeze(-1) >> self.shifts) & 1).reshape(len(masked), -1).bool()
            allowed = torch.zeros((len(masked), vocab), dtype=torch.bool)
            width = min(bits.shape[1], vocab)
            allowed[:, :width] = bits[:, :width]
            stuck = ~allowed.any(dim=1)  # no way forward: end the row rather than emit an arbitrary token
            if bool(stuck.any()):
                allowed[stuck.nonzero().flatten()[:, None], torch.tensor(self.eos_ids)] = True
            sub = scores[rows.to(scores.device)].masked_fill(~allowed.to(scores.device), float("-inf"))
            scores[rows.to(scores.device)] = sub
        for j in ended:
            keep = scores[j, self.eos_ids].clone()
            scores[j] = float("-inf")
            scores[j, self.eos_ids] = keep
        for j in masked + ended:  # another control (min_tokens) banned all the grammar allows
            if bool(torch.isinf(scores[j]).all()):
                scores[j, self.eos_ids] = 0.0
        return scores


class RowSampler:
    """Per-row temperature / top-p sampling with per-row generators (a `transformers.LogitsProcessor`).

    Runs last, under greedy decoding: for each sampled row it draws a token from its own generator and leaves
    only that token finite, so the argmax picks it. Greedy rows pass through untouched.
    """

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = list(rows)
        self.generators: list[Any] = []

    def __call__(self, input_ids, scores):
        import torch

        if not self.generators:
            for r in self.rows:
                gen = torch.Generator(device=scores.device)
                if r.seed is None:
                    gen.seed()
                else:
                    gen.manual_seed(r.seed)
                self.generators.append(gen)
        scores = scores.clone()  # generate keeps the tensor it passed in as the step's raw logits
        for j, r in enumerate(self.rows):
            if r.temperature <= 0:
                continue
            probs = torch.softmax(scores[j].float() / r.temperature, dim=-1)
            if r.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
                drop = (sorted_probs.cumsum(-1) - sorted_probs) >= r.top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            token = torch.multinomial(probs, 1, generator=self.generators[j])
            scores[j] = float("-inf")
            scores[j, token] = 0.0
        return scores
