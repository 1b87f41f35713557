"""The paper's other evaluator tables: the objective ablation (Table 3), generators x verifiers (Table 5), two
backbones (Table 7) and the case study (Table 9). Each runs through `harness run NAME` like Table 1: the same
runner, call cache, run store, resume, `report`, `--explain` and `compare`.

- **table3**: DR-Generator checkpoints trained with objective `disc` (w/o anchor), `anchor` (w/o disc) and `both`
  (full), on Table 1's six benchmarks by accuracy, plus their macro Average.
- **table5**: every (generator, verifier) pair, grouped by verifier. A generator's rubric for a set depends on the
  generator alone, so the rows of one generator share it: the call cache answers the second verifier's rubric
  request, and identical requests in flight at once are sent once (`harness.cache`). The verifiers beside
  Llama-3.1-8B-Instruct are our choice of Qwen3 sizes (the paper's are not in our sources).
- **table7**: native (zero-shot rubric generator) and DR-Generator rows per backbone, printed with the benchmarks
  as lines and (backbone, variant) as columns.
- **table9**: one item (`--item BENCH:ID`), the G0 and G2 generators: five independently generated rubrics each
  (one per repeat, each with its items in a seeded shuffled order, as the paper's protocol), their verdicts and raw
  weighted sums, and nDCG and Acc. as means and spread over the five (`reports.case_study`).

Rows name checkpoints you train (`harness train generator`, `harness train coevolve`): point `rows:` in a run
config at them (table9 and fig2 also read a coevolve dir: `--coevolve DIR`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from reports.case_study import RUBRICS
from reports.paper import TABLE3, TABLE5, TABLE7, TABLE9
from reports.rows import coevolve_shape, grid_rows, grid_shape
from reports.tables import CPU_DR, CPU_MODEL, QWEN3_VERIFIER, TABLE1_SPEC, Column, TableSpec, make_row

_ACC = ("judgebench", "personalized_rb", "rm_bench", "ultrafeedback", "aeollm", "nectar_lmsys")
ACC_COLUMNS = tuple(Column(b, "acc") for b in _ACC)
"""Table 1's six benchmarks by accuracy (pairwise Acc., listwise top-1 Acc.), as Tables 3 and 7 print them."""


def _dr(generator: str) -> str:
    return f"dynamic-rubric:generator={generator},verifier={QWEN3_VERIFIER}"


TABLE3_SPEC = TableSpec(
    name="table3",
    title="Ablation of the generator's objective (AVG@k Acc.), with the macro Average of the six benchmarks",
    rows=(
        # Checkpoints of `harness train generator` with objective disc, anchor and both: point `rows` at yours.
        make_row("w/o anchor", "w/o anchor", _dr("vllm:checkpoints/dr-generator-8b-disc"), CPU_DR),
        make_row("w/o disc", "w/o disc", _dr("vllm:checkpoints/dr-generator-8b-anchor"), CPU_DR),
        make_row("full", "full", _dr("vllm:checkpoints/dr-generator-8b"), CPU_DR),
    ),
    columns=ACC_COLUMNS,
    paper=TABLE3,
    average=True,
    notes=("Rows: the generator trained on R_disc alone (w/o anchor: objective disc), on R_anchor alone (w/o disc: "
           "objective anchor), on both combined at the advantage level (full: objective both).",),
)


_GENERATORS = {
    "Qwen3-8B zero-shot": "vllm:Qwen/Qwen3-8B",
    "Qwen3-32B zero-shot": "vllm:Qwen/Qwen3-32B",
    "DR-Generator-8B": "vllm:checkpoints/dr-generator-8b",
}
_VERIFIERS = {
    "Llama-3.1-8B-Instruct": "vllm:meta-llama/Llama-3.1-8B-Instruct",
    "Qwen3-4B": "vllm:Qwen/Qwen3-4B",
    "Qwen3-8B": "vllm:Qwen/Qwen3-8B",
    "Qwen3-14B": "vllm:Qwen/Qwen3-14B",
    "Qwen3-30B-A3B": QWEN3_VERIFIER,
}
_GRID_TEMPLATES = MappingProxyType({"paper": _dr("G"), "cpu": CPU_DR})


def _both(models: dict[str, str]) -> dict[str, dict[str, str]]:
    """Model label -> its spec per preset: the paper's model, and the embedded one on the cpu preset."""
    return {label: {"paper": spec, "cpu": CPU_MODEL} for label, spec in models.items()}


_TRAINED = frozenset({"DR-Generator-8B"})
TABLE5_SPEC = TableSpec(
    name="table5",
    title="Generators x verifiers (AVG@k): each generator's rubrics verified by each verifier",
    rows=grid_rows(_GRID_TEMPLATES, _both(_GENERATORS), _both(_VERIFIERS), dynamic=_TRAINED),
    columns=TABLE1_SPEC.columns,
    paper=TABLE5,
    reads=("generators", "verifiers"),
    shape=grid_shape(_GRID_TEMPLATES, _both(_GENERATORS), _both(_VERIFIERS), dynamic=_TRAINED),
    notes=("Rows: verifier / generator, grouped by verifier. A generator's rubric for a set is generated once and "
           "verified by every verifier (the call cache answers the repeated request). The Qwen3 verifier sizes are "
           "ours; the paper's Table 5 numbers are not recorded here: its paper rows print dashes.",),
)


TABLE7_SPEC = TableSpec(
    name="table7",
    title="Evaluator Acc. across backbones (AVG@k): zero-shot rubric generator (native) vs DR-Generator",
    rows=(
        make_row("Llama-3.1-8B native", "Llama-3.1-8B native", _dr("vllm:meta-llama/Llama-3.1-8B-Instruct"), CPU_DR),
        make_row("Llama-3.1-8B DR", "Llama-3.1-8B DR", _dr("vllm:checkpoints/dr-generator-llama-3.1-8b"), CPU_DR,
                 dynamic=True),
        make_row("Qwen3-8B native", "Qwen3-8B native", _dr("vllm:Qwen/Qwen3-8B"), CPU_DR),
        make_row("Qwen3-8B DR", "Qwen3-8B DR", _dr("vllm:checkpoints/dr-generator-8b"), CPU_DR, dynamic=True),
    ),
    columns=ACC_COLUMNS,
    paper=TABLE7,
    layout="benchmarks_as_rows",
)


def _case_shape(spec: TableSpec, cfg: Any) -> TableSpec:
    """table9 runs one item: `--item BENCH:ID` (or `items:` naming one); its rows may come from a coevolve dir."""
    ids = [(b, i) for b, found in (cfg.items or {}).items() for i in found]
    if len(ids) != 1:
        raise ConfigError("table9 is the case study of one item: harness run table9 --item BENCH:ID")
    return coevolve_shape(spec, cfg)


TABLE9_SPEC = TableSpec(
    name="table9",
    title="Case study: one item's rubrics, verdicts and scores, G0 against G2",
    rows=(
        make_row("G0", "G0", _dr("vllm:Qwen/Qwen3-8B"), CPU_DR),
        make_row("G2", "G2", _dr("vllm:checkpoints/coevolve/G2"), CPU_DR, dynamic=True),
    ),
    columns=(),
    paper=TABLE9,
    default_seeds=RUBRICS,  # five rubrics per generator, one per repeat, each its own seed (reports.case_study)
    layout="case_study",
    reads=("coevolve",),
    shape=_case_shape,
    notes=("G0 is the base generator, G2 the generator after two co-evolution rounds (`--coevolve DIR` reads "
           "both from a `harness train coevolve` dir).",),
)
