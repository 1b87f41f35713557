"""Table specs: which evaluators (rows) run on which benchmarks (columns), and the paper's numbers beside them.

A row is a label, an evaluator spec (the paper preset) and the label of the paper's row to print alongside. The
`cpu` preset swaps every model for the embedded `smollm2-135m` (scalar reward models become its next-token-logit
head), so a laptop runs the whole machinery in minutes; its numbers say nothing about the paper's models.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from benchmarks.scoring import Metric, metric_of
from harness.errors import ConfigError
from harness.registry import lookup, register
from reports.paper import TABLE1
from reports.results import benchmark

Preset = Literal["paper", "cpu"]

CPU_MODEL = "smollm2-135m"
_QWEN3_VERIFIER = "vllm:Qwen/Qwen3-30B-A3B"
_SKYWORK = "Skywork/Skywork-Reward-Gemma-2-27B-v0.2"
_NEMOTRON = "nvidia/Llama-3.1-Nemotron-70B-Reward-HF"


@dataclass(frozen=True, slots=True)
class Row:
    """One evaluator row."""

    label: str
    """How the row is printed."""
    paper: str | None
    """The paper row printed beside it (a key of the paper's table), or None."""
    specs: MappingProxyType
    """Evaluator spec per preset (`paper`, `cpu`)."""
    dynamic: bool = False
    """A dynamic-rubric generator row (the best of these is underlined, as in the paper)."""

    def spec(self, preset: Preset) -> str:
        return self.specs[preset]


@dataclass(frozen=True, slots=True)
class Column:
    """One printed column: a benchmark and one of the metrics it declares (`Benchmark.metrics`)."""

    benchmark: str
    """Registry name of the benchmark."""
    metric: str
    """Name of one of its metrics (`acc`, `ndcg`, ...)."""

    @property
    def key(self) -> str:
        return f"{self.benchmark}.{self.metric}"

    def declared(self) -> Metric:
        """The benchmark's declaration of this metric (how it scales, prints and compares)."""
        return metric_of(benchmark(self.benchmark), self.metric)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A paper table to reproduce."""

    name: str
    title: str
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    paper: MappingProxyType
    """Paper row label -> column key -> value (accuracies in percent)."""

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.benchmark for c in self.columns))

    def header(self, col: Column) -> str:
        """The paper's name for a column: the benchmark's display name, followed by the metric's where the
        table shows several metrics of that benchmark (`AEOLLM Acc.`, `AEOLLM nDCG`; `RM-Bench`)."""
        name = benchmark(col.benchmark).display
        if sum(c.benchmark == col.benchmark for c in self.columns) > 1:
            name += " " + col.declared().display
        return name


def _row(label: str, paper: str | None, spec: str, cpu: str, *, dynamic: bool = False) -> Row:
    return Row(label, paper, MappingProxyType({"paper": spec, "cpu": cpu}), dynamic)


_CPU_DR = f"dynamic-rubric:generator={CPU_MODEL},gen_max_tokens=160"
_CPU_RM = f"scalar-rm:model={CPU_MODEL},head=lm-token0"

TABLE1_SPEC = TableSpec(
    name="table1",
    title="Evaluator accuracy (AVG@k): pairwise Acc., listwise Acc. and nDCG",
    rows=(
        _row("Skywork-27B", "Skywork-27B", f"scalar-rm:model={_SKYWORK}", _CPU_RM),
        _row(
            "Skywork-27B w/ responses",
            "Skywork-27B w/ responses",
            f"scalar-rm:model={_SKYWORK},with_responses=true",
            _CPU_RM + ",with_responses=true",
        ),
        _row("Nemotron-70B", "Nemotron-70B", f"scalar-rm:model={_NEMOTRON},head=lm-token0", _CPU_RM),
        _row(
            "Nemotron-70B w/ responses",
            "Nemotron-70B w/ responses",
            f"scalar-rm:model={_NEMOTRON},head=lm-token0,with_responses=true",
            _CPU_RM + ",with_responses=true",
        ),
        _row(
            "Qwen3-8B zero-shot",
            "Qwen3-8B zero-shot",
            f"dynamic-rubric:generator=vllm:Qwen/Qwen3-8B,verifier={_QWEN3_VERIFIER}",
            _CPU_DR,
            dynamic=True,
        ),
        _row(
            "Qwen3-32B zero-shot",
            "Qwen3-32B zero-shot",
            f"dynamic-rubric:generator=vllm:Qwen/Qwen3-32B,verifier={_QWEN3_VERIFIER}",
            _CPU_DR,
            dynamic=True,
        ),
        _row(
            "DR-Generator-8B",
            "DR-Generator-8B",
            # A trained checkpoint: point `rows` in a --config file at yours (harness train generator).
            f"dynamic-rubric:generator=vllm:checkpoints/dr-generator-8b,verifier={_QWEN3_VERIFIER}",
            _CPU_DR,
            dynamic=True,
        ),
    ),
    columns=tuple(
        Column(b, m)  # type: ignore[arg-type]
        for b, m in (c.split(".") for c in next(iter(TABLE1.values())))
    ),
    paper=TABLE1,
)
register("table", "table1")(TABLE1_SPEC)


def get_table(name: str) -> TableSpec:
    """The registered table `name` (lookup errors list the valid ones)."""
    spec = lookup("table", name)
    if not isinstance(spec, TableSpec):  # pragma: no cover - only TableSpecs are registered as tables
        raise ConfigError(f"table {name!r} is not a table spec")
    return spec
