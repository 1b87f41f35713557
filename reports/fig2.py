"""Figure 2, co-evolution: (a) evaluator accuracy of the generators G1, G2 and the stale G2~ on Table 1's
benchmarks, (b) policy scores of P1, P2 and the stale P2~ on Table 2's benchmarks.

`harness run fig2` runs its two panels, each an ordinary run of its own table (`fig2a`: evaluators, `fig2b`:
policies judged as Table 2) into OUT/fig2a and OUT/fig2b, then draws both panels as grouped bars with bootstrap
whiskers (OUT/figure.png, OUT/figure.pdf) and writes the numbers of both as OUT/table.md, table.tex, table.csv and
results.json (`reports.report.write_panel_reports`). OUT/panels.json marks the folder as a figure of panels
(`reports.panels`): `harness report OUT` re-renders it, `--explain ROW BENCHMARK` finds the panel of the row,
`harness compare` compares two figures panel by panel.

Rows are named after the stages of `harness train coevolve` (`--coevolve DIR`: its coevolve.json names every
checkpoint and the frozen verifier), or given by `rows:` in a config. The paper's values are not in our sources:
its paper rows print dashes.
"""

from __future__ import annotations

from types import MappingProxyType

from reports.evaluator_tables import ACC_COLUMNS
from reports.paper import FIG2
from reports.rows import coevolve_shape
from reports.tables import (
    CPU_DR,
    CPU_SETUP,
    DEEPSEEK_SETUP,
    POLICY_SCALES,
    QWEN3_VERIFIER,
    TABLE2_SPEC,
    TableSpec,
    make_row,
    policy_row,
)

_HEADLINES = ("alpaca_eval2.lc_win_rate", "alpaca_eval2.win_rate", "arena_hard_v2.hard_prompt", "wildbench.score",
              "writingbench.overall")
"""Table 2's headline of each benchmark, and AlpacaEval 2's plain win rate (its LC needs all 805 instructions)."""


def _generator(stage: str) -> str:
    return f"dynamic-rubric:generator=vllm:checkpoints/coevolve/{stage},verifier={QWEN3_VERIFIER}"


FIG2A_SPEC = TableSpec(
    name="fig2a",
    title="Figure 2 (a): evaluator accuracy of the co-evolved generators (AVG@k)",
    rows=tuple(make_row(s, s, _generator(s), CPU_DR, dynamic=True) for s in ("G1", "G2", "G2-stale")),
    columns=ACC_COLUMNS,
    paper=FIG2,
    panel_of="fig2",
    reads=("coevolve",),
    shape=coevolve_shape,
    notes=("G2-stale: G1 trained again on the sets of P0 (the policy it already saw), the control for G2.",),
    panel_title="(a) evaluators: G1, G2 and the stale G2~",
)
FIG2B_SPEC = TableSpec(
    name="fig2b",
    title="Figure 2 (b): policy quality of the co-evolved policies (the paper's judge: DeepSeek-V4-Flash)",
    rows=tuple(policy_row(s, f"vllm:checkpoints/coevolve/{s}") for s in ("P1", "P2", "P2-stale")),
    columns=tuple(c for c in TABLE2_SPEC.columns if c.key in _HEADLINES),
    paper=FIG2,
    setups=MappingProxyType({"paper": DEEPSEEK_SETUP, "cpu": CPU_SETUP}),
    default_seeds=1,
    panel_of="fig2",
    reads=("coevolve",),
    shape=coevolve_shape,
    notes=("P2-stale: P1 trained again with G1's rubrics (the generator that did not co-evolve), the control for "
           "P2.",),
    scale_note=POLICY_SCALES,
    panel_title="(b) policies: P1, P2 and the stale P2~",
)
FIG2_SPEC = TableSpec(
    name="fig2",
    title="Figure 2: co-evolution of the generator and the policy, against stale controls",
    rows=(),
    columns=(),
    paper=FIG2,
    panels=("fig2a", "fig2b"),
    figure=True,
)
