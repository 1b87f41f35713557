"""Per-row state of the `hf` backend's batched generation (`harness.backends.hf_decode`): each row of a batch keeps
its own budget, stop strings, `min_tokens`, structured-output grammar (`RowMasks`) and sampling seed (`RowSampler`).
`RowConstraint` puts the same grammar masks in a `transformers.LogitsProcessor`, for TRL's `generate`."""

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


class RowMasks:
    """The structured-output state of a batch's rows: one llguidance matcher per constrained row
    (`harness.backends.grammar.TokenMask`) and the rows' next-token masks, written together into one int32 bitmask
    by llguidance's thread pool (`fill_next_token_bitmask_par`, which releases the GIL, so a caller can compute the
    masks while a forward pass runs) and expanded for all masked rows at once (no per-token Python).

    A row ends its grammar when it emits an end-of-sequence id or (defensively) a token the matcher refuses; the
    parser then judges its text. A row whose grammar is complete may only end (end-of-sequence). A row the grammar
    allows every token is not masked.
    """

    def __init__(self, rows: Sequence[Row], mask: Any, eos_ids: Sequence[int]) -> None:
        import torch

        self.mask = mask
        self.matchers = [mask.matcher(r.constraint) if r.constraint is not None else None for r in rows]
        self.eos_ids = list(eos_ids)
        self.done = [m is None for m in self.matchers]
        self.bitmask = torch.full((len(rows), mask.words), -1, dtype=torch.int32)
        self.shifts = torch.arange(32, dtype=torch.int32)
        # A mask that allows every token of the tokenizer (the last word's bits past its vocabulary are 0).
        self.everything = torch.full((mask.words,), -1, dtype=torch.int32)
        spare = 32 * mask.words - mask.vocab_size
        if spare:
            self.everything[-1] = torch.tensor((1 << (32 - spare)) - 1, dtype=torch.int64).to(torch.int32)
        self._masked: list[int] = []
        self._ended: list[int] = []

    def consume(self, j: int, tokens: Sequence[int]) -> None:
        """Advance row `j`'s matcher over the tokens it emitted."""
        matcher = self.matchers[j]
        for token in tokens:
            if self.done[j]:
                return
            if token in self.eos_ids or not matcher.consume_token(token):
                self.done[j] = True

    def forced(self, j: int) -> list[int]:
        """The tokens row `j`'s grammar forces next (llguidance's fast-forward tokens: each the only token the
        mask would allow at its step), not yet consumed; [] for a row without a grammar."""
        if self.done[j] or self.matchers[j].is_stopped():
            return []
        return list(self.matchers[j].compute_ff_tokens())

    def compute(self, rows: Sequence[int] | None = None) -> None:
        """Compute the masks of `rows` (default: all) for their next token, as their matchers stand."""
        self._masked, self._ended = [], []
        wanted = range(len(self.matchers)) if rows is None else rows
        for j in wanted:
            if self.done[j]:
                continue
            (self._ended if self.matchers[j].is_stopped() else self._masked).append(j)
        if self._masked:
            self.mask.fill_rows([(self.matchers[j], j) for j in self._masked], self.bitmask)
            full = (self.bitmask[self._masked] == self.everything).all(dim=1).tolist()
            self._masked = [j for j, everything in zip(self._masked, full) if not everything]

    def apply(self, scores: Any) -> Any:
        """`scores` (rows x vocabulary) with the masks of the last `compute` applied (a copy when any applies)."""
        import torch

        masked, ended = self._masked, self._ended
        if not masked and not ended:
            return scores
        scores = scores.clone()
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
            index = rows.to(scores.device)
            scores[index] = scores[index].masked_fill(~allowed.to(scores.device), float("-inf"))
        for j in ended:
            keep = scores[j, self.eos_ids].clone()
            scores[j] = float("-inf")
            scores[j, self.eos_ids] = keep
        return scores


class RowConstraint:
    """Per-row structured output as a `transformers.LogitsProcessor` (for `generate`, as TRL's rollouts call it):
    at every step each constrained row's matcher takes the row's last token, and `RowMasks` masks the scores.
    Unconstrained rows pass through."""

    def __init__(self, width: int, rows: Sequence[Row], mask: Any, eos_ids: Sequence[int]) -> None:
        self.width = width
        self.rows = RowMasks(rows, mask, eos_ids)

    def __call__(self, input_ids, scores):
        n = input_ids.shape[1] - self.width
        if all(self.rows.done):
            return scores
        if n > 0:
            last = input_ids[:, -1].tolist()
            for j, token in enumerate(last):
                self.rows.consume(j, [token])
        self.rows.compute()
        scores = self.rows.apply(scores)
        for j in range(scores.shape[0]):  # another control banned all the grammar allows
            if not self.rows.done[j] and bool(scores[j].isinf().all()):
                scores = scores.clone()
                scores[j, self.rows.eos_ids] = 0.0
        return scores


class RowSampler:
    """Per-row temperature / top-p sampling, each sampled row from its own `torch.Generator` (seeded with the row's
    seed, or a fresh random one). Greedy rows take the argmax."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = list(rows)
        self.generators: list[Any] = []

    def _generator(self, j: int, device: Any) -> Any:
        import torch

        if not self.generators:
            for r in self.rows:
                gen = torch.Generator(device=device)
                if r.seed is None:
                    gen.seed()
                else:
                    gen.manual_seed(r.seed)
                self.generators.append(gen)
        return self.generators[j]

    def pick(self, j: int, scores: Any) -> int:
        """Row `j`'s next token from its processed `scores` (one row of the vocabulary)."""
        import torch

        r = self.rows[j]
        if r.temperature <= 0:
            return int(scores.argmax())
        probs = torch.softmax(scores.float() / r.temperature, dim=-1)
        if r.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
            drop = (sorted_probs.cumsum(-1) - sorted_probs) >= r.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._generator(j, scores.device)))

    def skip(self, j: int, tokens: int, vocab: int, device: Any) -> None:
        """Advance a sampled row's generator past `tokens` forced tokens, as if each had been drawn (a draw from
        one vocabulary-wide row takes `vocab` exponentials in torch's `multinomial`): its later samples are those
        it would draw had every forced token been sampled."""
        import torch

        if self.rows[j].temperature <= 0 or not tokens:
            return
        gen = self._generator(j, device)
        for _ in range(tokens):
            torch.empty(vocab, dtype=torch.float32, device=device).exponential_(generator=gen)
