"""The paper's reported numbers (arXiv 2607.20083), for side-by-side columns.

Accuracies are percentages, nDCG in [0, 1], as the paper prints them. Keys: row label -> column key -> value.
Column keys of Table 1 name a benchmark and a metric: `judgebench.acc`, `aeollm.ndcg`, ...
"""

from __future__ import annotations

from types import MappingProxyType

TABLE1_COLUMNS = (
    "judgebench.acc",
    "personalized_rb.acc",
    "rm_bench.acc",
    "ultrafeedback.acc",
    "aeollm.acc",
    "aeollm.ndcg",
    "nectar_lmsys.acc",
    "nectar_lmsys.ndcg",
)

_TABLE1_ROWS = {
    "Skywork-27B": (52.1, 64.7, 67.7, 63.4, 43.8, 0.826, 21.0, 0.720),
    "Skywork-27B w/ responses": (56.1, 60.6, 65.8, 65.2, 37.5, 0.805, 21.6, 0.717),
    "Nemotron-70B": (66.0, 68.6, 85.2, 72.8, 57.5, 0.868, 20.4, 0.718),
    "Nemotron-70B w/ responses": (64.8, 61.9, 83.2, 77.4, 57.5, 0.867, 17.2, 0.706),
    "Qwen3-8B zero-shot": (36.4, 53.7, 52.2, 54.7, 17.8, 0.894, 12.0, 0.762),
    "Qwen3-32B zero-shot": (46.4, 67.6, 64.7, 64.6, 29.7, 0.902, 15.1, 0.763),
    "DR-Generator-8B": (57.4, 73.3, 69.8, 68.7, 51.2, 0.898, 28.0, 0.779),
}

TABLE1 = MappingProxyType(
    {row: MappingProxyType(dict(zip(TABLE1_COLUMNS, values, strict=True))) for row, values in _TABLE1_ROWS.items()}
)
"""Table 1: evaluator accuracy (AVG@5), pairwise Acc., listwise Acc. and nDCG."""
