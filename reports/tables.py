"""Table specs: which evaluators or policies (rows) run on which benchmarks (columns), and the paper's numbers
beside them.

A row is a label, an evaluator spec (policy tables: the policy's model spec) per preset and the label of the
paper's row to print alongside. A policy table also names its judge and how the policies answer, per preset
(`PolicySetup`). The `cpu` preset swaps every model for the embedded `smollm2-135m` (scalar reward models become
its next-token-logit head; in policy tables it is policy and judge), so a laptop runs the whole machinery in
minutes; its numbers say nothing about the paper's models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from benchmarks.scoring import Metric, metric_of
from harness.errors import ConfigError
from harness.registry import lookup
from reports.paper import TABLE1, TABLE2, TABLE6, TABLE8
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
class PolicySetup:
    """A policy table's judge and generation settings under one preset (each overridable in a run config)."""

    judge: str | None
    """The judge's model spec; None for verifiable tasks (deterministic checkers, no judge model)."""
    judge_options: Mapping[str, Any] = field(default_factory=dict)
    """`BackendOptions` fields for the judge alone (its server's `base_url`, `api_key_env`)."""
    judge_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Benchmark -> its judge's settings (`judges.policy.judge_options`)."""
    generation: Mapping[str, Any] = field(default_factory=dict)
    """`harness.commands.runner.Generation` fields."""


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A paper table to reproduce."""

    name: str
    title: str
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    paper: MappingProxyType
    """Paper row label -> column key -> value (accuracies in percent)."""
    setups: Mapping[str, PolicySetup] | None = None
    """Policy tables: preset -> judge and generation settings (None: an evaluator table)."""
    default_seeds: int = 5
    """Repeats per item when the run config gives none."""
    notes: tuple[str, ...] = ()
    """Printed under the table (how the paper's numbers are read)."""
    figure: bool = False
    """Also drawn as a bar chart with interval whiskers (`figure.png`, `figure.pdf`)."""

    @property
    def kind(self) -> Literal["evaluator", "policy"]:
        return "evaluator" if self.setups is None else "policy"

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


# --- policy tables: rows are policies, answers judged by one judge model ---

_POLICY_COLUMNS = tuple(
    Column(b, m)
    for b, m in (
        ("alpaca_eval2", "lc_win_rate"),
        ("alpaca_eval2", "win_rate"),
        ("arena_hard_v2", "hard_prompt"),
        ("arena_hard_v2", "creative_writing"),
        ("wildbench", "score"),
        ("wildbench", "task_macro"),
        ("writingbench", "overall"),
    )
)
_PAPER_GENERATION = MappingProxyType({"temperature": 0.0, "max_tokens": 4096})
_CPU_SETUP = PolicySetup(
    judge=CPU_MODEL,
    # Small budgets so a laptop finishes: the judges' upstream budgets (Arena-Hard 16000 tokens) are for models
    # that write a judgment; the 135M model's are read or fail, and either is recorded.
    judge_settings=MappingProxyType({
        "arena_hard_v2": {"label_only": True, "max_tokens": 16},
        "wildbench": {"max_tokens": 96},
        "writingbench": {"max_tokens": 64},
    }),
    generation=MappingProxyType({"temperature": 0.0, "max_tokens": 96}),
)
_DEEPSEEK = PolicySetup(
    judge="openai:deepseek-v4-flash",
    judge_options=MappingProxyType({"base_url": "https://api.deepseek.com/v1", "api_key_env": "DEEPSEEK_API_KEY"}),
    generation=_PAPER_GENERATION,
)
_GPT41 = PolicySetup(judge="openai:gpt-4.1", generation=_PAPER_GENERATION)
_POLICY_NOTES = (
    "The paper prints one number per benchmark; it is shown under AlpacaEval 2 LC, Arena-Hard v2.0 hard prompts, "
    "WildBench WB-Score and WritingBench (read as each benchmark's headline).",
)


def _policy_row(label: str, spec: str, *, dynamic: bool = False) -> Row:
    return _row(label, label, spec, CPU_MODEL, dynamic=dynamic)


# The trained policies are checkpoints you produce (`harness train policy`): point `rows` in a --config file at
# them; the specs below name where the paper's training configs write them.
_TABLE2_ROWS = (
    _policy_row("Native Qwen3-8B", "vllm:Qwen/Qwen3-8B"),
    _policy_row("Native Qwen3-32B", "vllm:Qwen/Qwen3-32B"),
    _policy_row("Skywork-27B", "vllm:checkpoints/policy-skywork-27b"),
    _policy_row("Skywork-27B w/ responses", "vllm:checkpoints/policy-skywork-27b-responses"),
    _policy_row("Nemotron-70B", "vllm:checkpoints/policy-nemotron-70b"),
    _policy_row("Nemotron-70B w/ responses", "vllm:checkpoints/policy-nemotron-70b-responses"),
    _policy_row("RaR (235B static rubric)", "vllm:checkpoints/policy-rar-235b"),
    _policy_row("DR-Generator-8B", "vllm:checkpoints/dr-policy-8b", dynamic=True),
)
TABLE2_SPEC = TableSpec(
    name="table2",
    title="Policy quality, Qwen3-8B trained with each reward (the paper's judge: DeepSeek-V4-Flash)",
    rows=_TABLE2_ROWS,
    columns=_POLICY_COLUMNS,
    paper=TABLE2,
    setups=MappingProxyType({"paper": _DEEPSEEK, "cpu": _CPU_SETUP}),
    default_seeds=1,
    notes=_POLICY_NOTES,
)
TABLE6_SPEC = TableSpec(
    name="table6",
    title="Policy quality, Table 2's policies (the paper's judge: GPT-4.1)",
    rows=_TABLE2_ROWS,
    columns=_POLICY_COLUMNS,
    paper=TABLE6,
    setups=MappingProxyType({"paper": _GPT41, "cpu": _CPU_SETUP}),
    default_seeds=1,
    notes=("The paper's Table 6 numbers are not recorded in this harness: its rows print dashes.",),
)
TABLE8_SPEC = TableSpec(
    name="table8",
    title="Policy quality across backbones, native and trained with DR-Generator-8B (the paper's judge: "
    "DeepSeek-V4-Flash)",
    rows=(
        _policy_row("Llama-3.1-8B native", "vllm:meta-llama/Llama-3.1-8B-Instruct"),
        _policy_row("Llama-3.1-8B DR", "vllm:checkpoints/dr-policy-llama-3.1-8b", dynamic=True),
        _policy_row("Qwen3-8B native", "vllm:Qwen/Qwen3-8B"),
        _policy_row("Qwen3-8B DR", "vllm:checkpoints/dr-policy-8b", dynamic=True),
    ),
    columns=_POLICY_COLUMNS,
    paper=TABLE8,
    setups=MappingProxyType({"paper": _DEEPSEEK, "cpu": _CPU_SETUP}),
    default_seeds=1,
    notes=_POLICY_NOTES,
)
# --- Figure 3: verifiable tasks, checked without a judge model, AVG@5 over sampled answers ---

_VERIFIABLE_GENERATION = MappingProxyType({"temperature": 0.6, "top_p": 0.95, "max_tokens": 4096})
FIG3_SPEC = TableSpec(
    name="fig3",
    title="Verifiable tasks (AVG@5): MATH-500 by math-verify, MMLU-Pro and CodeScope by exact match",
    rows=(
        _policy_row("Native Qwen3-8B", "vllm:Qwen/Qwen3-8B"),
        _policy_row("DR-Generator-8B", "vllm:checkpoints/dr-policy-8b", dynamic=True),
    ),
    columns=(Column("math500", "acc"), Column("mmlu_pro", "acc"), Column("codescope", "acc")),
    paper=MappingProxyType({}),
    setups=MappingProxyType({
        "paper": PolicySetup(judge=None, generation=_VERIFIABLE_GENERATION),
        "cpu": PolicySetup(judge=None, generation=MappingProxyType({"temperature": 0.6, "top_p": 0.95,
                                                                   "max_tokens": 128})),
    }),
    default_seeds=5,
    notes=("Answers are sampled (temperature 0.6, top-p 0.95) and checked without a judge model. The paper shows "
           "Figure 3 as bars; its values are not recorded here.",),
    figure=True,
)


def get_table(name: str) -> TableSpec:
    """The registered table `name` (lookup errors list the valid ones)."""
    spec = lookup("table", name)
    if not isinstance(spec, TableSpec):  # pragma: no cover - only TableSpecs are registered as tables
        raise ConfigError(f"table {name!r} is not a table spec")
    return spec
