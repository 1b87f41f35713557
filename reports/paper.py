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


_POLICY_COLUMNS = ("alpaca_eval2.lc_win_rate", "arena_hard_v2.hard_prompt", "wildbench.score", "writingbench.overall")
"""Where the paper's four policy numbers go. The paper prints one number per benchmark; we read them as the
headline of each: AlpacaEval 2's length-controlled win rate, Arena-Hard v2.0's hard-prompt score, WildBench's
WB-Score (x10) and WritingBench's overall score (x10)."""


def _policy_table(rows: dict[str, tuple[float, ...]]) -> MappingProxyType:
    return MappingProxyType(
        {row: MappingProxyType(dict(zip(_POLICY_COLUMNS, values, strict=True))) for row, values in rows.items()}
    )


TABLE2 = _policy_table({
    "Native Qwen3-8B": (38.5, 9.0, 16.4, 57.8),
    "Native Qwen3-32B": (50.2, 20.8, 29.7, 62.0),
    "Skywork-27B": (50.6, 15.3, 22.3, 60.2),
    "Skywork-27B w/ responses": (48.2, 12.3, 20.5, 58.6),
    "Nemotron-70B": (35.2, 10.3, 17.5, 56.2),
    "Nemotron-70B w/ responses": (41.9, 9.2, 18.9, 58.2),
    "RaR (235B static rubric)": (58.5, 15.7, 25.2, 61.6),
    "DR-Generator-8B": (67.1, 21.0, 30.7, 64.3),
})
"""Table 2: policy quality judged by DeepSeek-V4-Flash; the policy is Qwen3-8B trained with each row's reward
(the two native rows: untrained Qwen3-8B and Qwen3-32B)."""

TABLE6 = MappingProxyType({})
"""Table 6 (Table 2's policies judged by GPT-4.1): its numbers are not recorded here, so its paper rows print
dashes; our rows are computed as for any table."""

TABLE8 = _policy_table({
    "Llama-3.1-8B native": (15.3, 0.4, -17.1, 39.1),
    "Llama-3.1-8B DR": (28.7, 1.4, -7.7, 47.5),
    "Qwen3-8B native": (38.5, 9.0, 16.4, 57.8),
    "Qwen3-8B DR": (67.1, 21.0, 30.7, 64.3),
})
"""Table 8: two backbones, native and trained with DR-Generator-8B's rubrics, judged as Table 2."""


_ACC_COLUMNS = ("judgebench.acc", "personalized_rb.acc", "rm_bench.acc", "ultrafeedback.acc", "aeollm.acc",
                "nectar_lmsys.acc")
"""Tables 3 and 7 print Table 1's six benchmarks by their accuracy alone."""


def _acc_table(rows: dict[str, tuple[float, ...]], columns: tuple[str, ...] = _ACC_COLUMNS) -> MappingProxyType:
    return MappingProxyType(
        {row: MappingProxyType(dict(zip(columns, values, strict=True))) for row, values in rows.items()}
    )


TABLE3 = _acc_table({
    "w/o anchor": (56.1, 72.4, 69.8, 67.9, 47.3, 27.7, 56.9),
    "w/o disc": (50.0, 73.8, 66.3, 66.8, 38.8, 20.7, 52.7),
    "full": (57.4, 73.3, 69.8, 68.7, 51.2, 28.0, 58.1),
}, (*_ACC_COLUMNS, "average"))
"""Table 3: the generator's objective ablated (AVG@5 Acc.): trained on the discriminability reward alone (w/o
anchor), on the anchor reward alone (w/o disc), on both (full: DR-Generator-8B); `average` is the macro mean."""

TABLE5 = MappingProxyType({})
"""Table 5 (Appendix F.1, generators x verifiers): its numbers are not in our sources, so its paper rows print
dashes."""

TABLE7 = _acc_table({
    "Llama-3.1-8B native": (34.8, 54.4, 45.9, 56.2, 19.2, 13.3),
    "Llama-3.1-8B DR": (46.8, 71.1, 50.2, 64.2, 44.8, 24.7),
    "Qwen3-8B native": (36.4, 53.7, 52.2, 54.7, 17.8, 12.0),
    "Qwen3-8B DR": (57.4, 73.3, 69.8, 68.7, 51.2, 28.0),
})
"""Table 7: evaluator Acc. of two backbones as zero-shot rubric generators (native) and trained as DR-Generator."""

TABLE9 = MappingProxyType({
    "G0": MappingProxyType({"sums": (15.0, 15.0), "ndcg": 0.8155, "acc": 0.0}),
    "G2": MappingProxyType({"sums": (53.0, 24.0), "ndcg": 1.0, "acc": 1.0}),
})
"""Table 9 (case study, one pair): G0's and G2's raw weighted sums (preferred, other) under their seed-0 rubric,
and nDCG and Acc. over 5 independently generated rubrics, their items in shuffled orders."""

FIG2 = MappingProxyType({})
"""Figure 2 (co-evolution): its values are not in our sources; its paper rows print dashes."""
