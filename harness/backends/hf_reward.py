"""Reward-model scoring for the `hf` backend (`BaseBackend.score`): batching and the forward pass of each head.

- Conversations are rendered and cut by `harness.backends.local.score_ids` (shared with `vllm`), sorted by
  length and run in batches of `options.batch_size`. In float32 what shares a batch moves a score by rounding
  only (seen: under 1e-6 relative), which can decide nothing but exact ties.
- `classifier`: a `*ForSequenceClassification` checkpoint, right-padded, its logit read by the model's own head
  (at the last token that is not the pad token). A config without `pad_token_id` runs one sequence at a time:
  its head cannot find the last token of a padded row.
- `lm-token0`: the backend's causal LM, left-padded with explicit position ids; the score is the next-token
  logit of id 0 after the whole conversation.
- A batch whose forward pass fails (out of memory, say) fails its requests and keeps the rest.

torch is passed in by the caller: importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.backends.base import ScoreRequest, ScoreResult
from harness.backends.local import backend_failure, score_ids, score_result
from harness.errors import Failure


def score_batches(
    requests: Sequence[ScoreRequest],
    model: Any,
    tokenizer: Any,
    torch: Any,
    *,
    classifier: bool,
    pad_id: int | None,
    context_length: int | None,
    batch_size: int,
) -> list[ScoreResult]:
    """Scores of `requests` (aligned) by a loaded sequence classifier (`classifier`) or causal LM (`lm-token0`),
    in batches of `batch_size` (1 for a classifier without a pad id), longest first."""
    if classifier and pad_id is None:
        batch_size = 1
    results: list[ScoreResult | None] = [None] * len(requests)
    inputs: list[tuple[int, list[int], int]] = []
    for i, request in enumerate(requests):
        got = score_ids(tokenizer, request, context_length)
        if isinstance(got, Failure):
            results[i] = ScoreResult(None, error=got)
            continue
        ids, tokens = got
        inputs.append((i, ids, tokens))
    inputs.sort(key=lambda x: -len(x[1]))
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        rows = [ids for _, ids, _ in batch]
        try:
            if classifier:
                values = classifier_logits(torch, model, rows, pad_id)
            else:
                values = token0_logits(torch, model, rows, pad_id if pad_id is not None else 0)
        except Exception as exc:  # e.g. out of memory: fail this batch, keep the rest
            failure = backend_failure(f"forward pass failed: {type(exc).__name__}: {exc}")
            for i, ids, tokens in batch:
                results[i] = ScoreResult(None, tokens, len(ids), error=failure)
            continue
        for (i, ids, tokens), value in zip(batch, values, strict=True):
            results[i] = score_result(value, tokens, len(ids))
    return results  # type: ignore[return-value]


def pad_rows(torch: Any, rows: list[list[int]], pad_id: int, *, left: bool, device: Any) -> tuple[Any, Any]:
    """(input ids, attention mask) of `rows`, padded with `pad_id` on the left or the right, on `device`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[j, span] = torch.tensor(r, dtype=torch.long)
        mask[j, span] = 1
    return ids.to(device), mask.to(device)


def classifier_logits(torch: Any, model: Any, rows: list[list[int]], pad_id: int | None) -> list[float]:
    """The `num_labels=1` logit of each row (one right-padded forward pass)."""
    ids, mask = pad_rows(torch, rows, pad_id if pad_id is not None else 0, left=False, device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
    return [float(v) for v in logits.float().cpu()]


def token0_logits(torch: Any, model: Any, rows: list[list[int]], pad_id: int) -> list[float]:
    """The next-token logit of id 0 after each row (one left-padded forward pass of a causal LM)."""
    ids, mask = pad_rows(torch, rows, pad_id, left=True, device=model.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
    return [float(v) for v in out.logits[:, -1, 0].float().cpu()]
