"""A seeded stand-in for AlpacaEval's `df_gamed.csv` (the LC GLM's Hub file, not reachable offline)."""

from __future__ import annotations

import csv
import random
from pathlib import Path


def gamed_frame(path: Path, n: int, seed: int = 0) -> Path:
    """A stand-in for `df_gamed.csv` with its columns: two gamed baselines x n instructions, seeded."""
    rng = random.Random(seed)
    difficulty = [rng.gauss(0, 1) for _ in range(n)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "index", "instruction_difficulty", "not_gamed_baseline", "preference", "std_delta_len"])
        for model, sign in (("gamed_verbose", 1), ("gamed_concise", -1)):
            for i in range(n):
                delta = sign * abs(rng.gauss(1, 0.5))
                w.writerow([model, i, difficulty[i], False, min(1.0, max(0.0, 0.5 - 0.2 * delta + rng.gauss(0, .1))),
                            delta])
    return path
