"""Linear layers that multiply a few rows fast on a CPU: the `hf` backend's decode steps.

A decode step puts one row per sequence (and per forced token) through every linear layer of the model. For so few
rows the float32 product `x @ W.T` (`torch.nn.functional.linear`: BLAS `sgemv` for one row, `sgemm` with the weight
transposed for more) runs far below the memory rate that bounds it. The same product taken the other way round,
`(W @ x.T).T` with at least two columns (one row is padded with a row of zeros), reads the weight as stored and runs
about 3x faster. Measured on 2 CPU cores (torch 2.13, MKL), microseconds per product of a 1,536 x 576 weight, cycling
through 30 such weights so that none stays in cache:

| rows | 1 | 2 | 4 | 8 | 10 |
| --- | --- | --- | --- | --- | --- |
| `F.linear` | 300 | 448 | 385 | 337 | 366 |
| `(W @ x.T).T` | 104 | 100 | 126 | 227 | 402 |

A decode pass of SmolLM2-135M (500-600 tokens in its cache) took 58 ms for one row and 91 ms for two before, 33 and
34 ms after. `harness bench structured` and `harness bench supervision` measure whole decodes.

`few_row_linears(model)` turns a float32 model's `torch.nn.Linear` layers on the CPU into `FewRowLinear` (the same
module with the same parameters, so weights, ties and state dicts are untouched), which takes that path for up to
`MAX_ROWS` rows and `torch.nn.functional.linear` otherwise: prefill batches compute exactly as before. The two
orders agree to float32 rounding (about 1e-5 of the logits), as batching rows together already does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

MAX_ROWS = 8
"""Rows up to which the transposed product is taken (from 10 rows on, the two orders cost the same; see above)."""


class FewRowLinear(torch.nn.Linear):
    """`nn.Linear` that multiplies up to `MAX_ROWS` rows as `(W @ x.T).T` (see the module's docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not 1 <= rows <= MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        if rows == 1:  # one column would take the slow matrix-vector product
            flat = torch.cat([flat, flat.new_zeros(1, flat.shape[1])])
        y = (self.weight @ flat.T).T[:rows].contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def few_row_linears(model: Any) -> int:
    """Give `model`'s float32 `nn.Linear` layers on the CPU the few-row path; returns how many it changed."""
    changed = 0
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.device.type == "cpu"
                and module.weight.dtype == torch.float32):
            module.__class__ = FewRowLinear
            changed += 1
    return changed
