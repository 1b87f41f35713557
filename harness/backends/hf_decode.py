"""The `hf` backend's decode loop: a batch of rows (`harness.backends.hf_rows.Row`) generated over the model's own
KV cache (`past_key_values`), one forward pass per step, each row with its own budget, stop strings, `min_tokens`,
structured-output grammar and sampling seed.

Why not `model.generate`: when a row's grammar forces the next tokens (a rubric's JSON keys and punctuation), the
loop appends them all and feeds them in the same forward pass as the row's sampled token (jump-forward, as SGLang
decodes under a grammar). The forced tokens are llguidance's fast-forward tokens (`compute_ff_tokens`), each the
only token the grammar's mask allows at its step, so greedy outputs are token for token those of decoding them one
step at a time; a sampled row's generator is advanced past each forced token as if it had been drawn
(`RowSampler.skip`), so its samples are unchanged too. On an accelerator the next step's masks are computed in
llguidance's threads while the forward pass runs (`RowMasks.compute`, off the GIL); on the CPU in turn (see
`HFBackend._generate_batch`: they take about 0.2 ms, and a second thread's tensor work slows the pass).

A step's rows carry different numbers of new tokens: they are right-padded to the longest, the padding masked out
of attention (and kept masked in the cache), each row's positions counting its real tokens only. Raw logits (before
any mask or sampling) are those of the forward pass at each token's position, so logprobs stay the model's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harness.backends.hf_rows import Row, RowMasks, RowSampler


@dataclass(slots=True)
class Decoded:
    """What one batch produced: each row's generated ids (an end-of-sequence id included where it ended so), its
    raw logits per generated id (only with `keep_logits`), and the counts of forward passes and forced tokens."""

    tokens: list[list[int]]
    logits: list[list[Any]] | None
    forward_passes: int = 0
    forced_tokens: int = 0


def decode(
    lm: Any,
    torch: Any,
    rows: Sequence[Row],
    ids: Any,
    attention: Any,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    decode_tail: Callable[[list[int]], str],
    token_mask: Any = None,
    jump_forward: bool = True,
    keep_logits: bool = False,
    check: Callable[[], None] = lambda: None,
    masks_pool: ThreadPoolExecutor | None = None,
) -> Decoded:
    """Generate `rows` from their left-padded prompts `ids` / `attention` (rows x width).

    `decode_tail(ids)` renders a row's recent ids for its stop strings; `token_mask` builds matchers for rows with a
    constraint; `check()` raises to stop between steps (a cancelled call). `masks_pool` computes the next masks
    beside the forward pass (one worker; None computes them in turn).
    """
    from transformers import DynamicCache

    n = len(rows)
    device = lm.device
    eos = set(eos_ids)
    masks = RowMasks(rows, token_mask, eos_ids) if any(r.constraint is not None for r in rows) else None
    sampler = RowSampler(rows)
    out = Decoded([[] for _ in rows], [[] for _ in rows] if keep_logits else None)
    active = [r.max_new > 0 for r in rows]
    window = [max((len(s) for s in r.stops if s), default=0) + 8 for r in rows]
    last_pos = (attention.sum(dim=1) - 1).tolist()
    cache = DynamicCache()

    def start_masks(which: list[int]) -> Any:
        if masks is None or not which:
            return None
        if masks_pool is None:
            masks.compute(which)
            return None
        return masks_pool.submit(masks.compute, which)

    pending = start_masks([j for j in range(n) if active[j]])
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    step_ids, step_len = ids, [ids.shape[1]] * n
    cache_arg, per_row = forward_style(lm)
    prefill = True
    while True:
        check()
        if prefill:
            keep: Any = 1
        elif keep_logits or not per_row:
            keep = step_ids.shape[1]
        else:  # only each row's last real position goes through the (vocabulary-wide) head
            keep = torch.tensor([[k - 1] for k in step_len], device=device)
        result = lm(input_ids=step_ids.to(device), attention_mask=attention.to(device),
                    position_ids=positions.to(device), use_cache=True, logits_to_keep=keep, **{cache_arg: cache})
        out.forward_passes += 1
        logits = result.logits
        if pending is not None:
            pending.result()
        # Raw logits of the forced tokens fed this step: at the positions before each.
        if keep_logits and not prefill:
            for j in range(n):
                for i in range(step_len[j] - 1):
                    out.logits[j].append(logits[j, i])  # type: ignore[index]
        if not any(active):  # the last pass only read the forced tokens' logits
            return out
        if prefill or not isinstance(keep, int):
            nxt = logits[:, -1, :]
        else:
            nxt = logits[torch.arange(n, device=logits.device), torch.tensor(step_len, device=logits.device) - 1]
        prefill = False
        scores = nxt.float()
        if masks is not None:
            scores = masks.apply(scores)
        new: list[list[int]] = [[] for _ in rows]
        vocab = scores.shape[1]
        for j, r in enumerate(rows):
            if not active[j]:
                continue
            row_scores = scores[j]
            if len(out.tokens[j]) < r.min_new and eos_ids:
                row_scores = row_scores.clone()
                row_scores[list(eos_ids)] = float("-inf")
            if bool(torch.isinf(row_scores).all()):  # the controls together ban everything: end the row
                row_scores = row_scores.clone()
                row_scores[list(eos_ids)] = 0.0
            token = sampler.pick(j, row_scores)
            if keep_logits:
                out.logits[j].append(nxt[j])  # type: ignore[index]
            new[j].append(token)
            _add(out, j, [token], r, eos, window[j], decode_tail, active)
            if masks is not None:
                masks.consume(j, [token])
            if active[j] and masks is not None and jump_forward:
                forced = masks.forced(j)[: r.max_new - len(out.tokens[j])]
                if forced:
                    masks.consume(j, forced)
                    sampler.skip(j, len(forced), vocab, scores.device)
                    out.forced_tokens += len(forced)
                    new[j].extend(forced)
                    _add(out, j, forced, r, eos, window[j], decode_tail, active)
        if not any(active) and not (keep_logits and any(len(t) > 1 for t in new)):
            return out
        step_len = [len(t) for t in new]
        width = max(step_len)
        step_ids = torch.full((n, width), pad_id, dtype=torch.long)
        step_mask = torch.zeros((n, width), dtype=attention.dtype)
        positions = torch.zeros((n, width), dtype=torch.long)
        for j, tokens in enumerate(new):
            if tokens:
                step_ids[j, : len(tokens)] = torch.tensor(tokens)
                step_mask[j, : len(tokens)] = 1
            positions[j] = last_pos[j] + 1 + torch.arange(width)
            last_pos[j] += len(tokens)
        # Finished rows stay in the batch as padding (their logits are read at a pad and ignored).
        step_len = [max(1, k) for k in step_len]
        attention = torch.cat([attention, step_mask], dim=1)
        pending = start_masks([j for j in range(n) if active[j]])


def forward_style(lm: Any) -> tuple[str, bool]:
    """How this transformers takes the KV cache (`cache`, from 5.x; `past_key_values` before) and whether its
    `logits_to_keep` takes per-row positions (a 2-D tensor: `transformers.modeling_utils.slice_logits_to_keep`)."""
    import inspect

    import transformers.modeling_utils as utils

    parameters = inspect.signature(lm.forward).parameters
    return ("cache" if "cache" in parameters else "past_key_values"), hasattr(utils, "slice_logits_to_keep")


def _add(out: Decoded, j: int, tokens: list[int], row: Row, eos: set[int], window: int,
         decode_tail: Callable[[list[int]], str], active: list[bool]) -> None:
    """Append `tokens` to row `j` and end the row at an end-of-sequence id, its budget or a stop string."""
    gen = out.tokens[j]
    gen.extend(tokens)
    if any(t in eos for t in tokens) or len(gen) >= row.max_new:
        active[j] = False
        return
    stops = [s for s in row.stops if s]
    if stops:
        text = decode_tail(gen[-(window + len(tokens)) :])
        if any(s in text for s in stops):
            active[j] = False

