"""Table specs: which evaluators or policies (rows) run on which benchmarks (columns), and the paper's numbers
beside them.

A row is a label, an evaluator spec (policy tables: the policy's model spec) per preset and the label of the
paper's row to print alongside. A policy table also names its judge and how the policies answer, per preset
(`PolicySetup`). The `cpu` preset swaps every model for the embedded `smollm2-135m` (scalar reward models become
its next-token-logit head; in policy tables it is policy and judge), so a laptop runs the whole machinery in
minutes; its numbers say nothing about the paper's models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from benchmarks.scoring import PAIRWISE_GAP, Metric, metric_of
from harness.errors import ConfigError
from harness.registry import lookup
from reports.paper import TABLE1, TABLE2, TABLE6, TABLE8
from reports.results import benchmark

Preset = Literal["paper", "cpu"]
Layout = Literal["rows", "benchmarks_as_rows", "case_study"]

GAP = PAIRWISE_GAP.name
"""The score gap's metric name (`benchmarks.scoring.PAIRWISE_GAP`, `LISTWISE_GAP`): what `TableSpec.gap` adds."""

TABLE_KEYS = ("generators", "verifiers", "coevolve")
"""Run config keys only some tables read (`TableSpec.reads`)."""

CPU_MODEL = "smollm2-135m"
QWEN3_VERIFIER = "vllm:Qwen/Qwen3-30B-A3B"
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
    scale_note: str = ""
    """How the table's values print, after its kind's conventions paragraph (`reports.render.conventions`):
    Table 2's "WildBench and WritingBench x10"; a table without one prints its kind's conventions alone."""
    panel_title: str = ""
    """A panel's title in its figure (`panel_of`; empty: its name)."""
    figure: bool = False
    """Also drawn as a bar chart with interval whiskers (`figure.png`, `figure.pdf`)."""
    layout: Layout = "rows"
    """How it is printed: a line per row (`rows`), a line per benchmark with the rows as columns
    (`benchmarks_as_rows`, Table 7), or one item's rubrics, verdicts and scores (`case_study`, Table 9)."""
    average: bool = False
    """Also an Average column: the macro mean of the columns (Table 3, `reports.results.macro_average`)."""
    panels: tuple[str, ...] = ()
    """A figure drawn from the runs of other tables, each run into OUT/NAME (fig2: fig2a and fig2b)."""
    panel_of: str | None = None
    """The figure this table is a panel of: the figure's config also names its other panels' rows and benchmarks,
    which this table leaves to them."""
    reads: tuple[str, ...] = ()
    """The table-specific run config keys it reads (`generators`, `verifiers`, `coevolve`); any other is an
    error."""
    shape: Callable[[TableSpec, Any], TableSpec] | None = field(default=None, compare=False)
    """Its rows as a run config makes them from the keys it `reads` (`reports.rows`); None: `rows` as given."""
    gap: bool = False
    """Also print the score gap Δ_gap (`benchmarks.scoring.PAIRWISE_GAP`) after each benchmark's columns where
    the benchmark declares one (`shown`); off by default, as the paper prints none (`harness run|report
    --gap`). An Average still averages `columns` alone."""

    @property
    def kind(self) -> Literal["evaluator", "policy"]:
        return "evaluator" if self.setups is None else "policy"

    def resolve(self, cfg: Any) -> tuple[TableSpec, Any]:
        """The table and the run config (`harness.config.RunConfig`) as a run of this table reads them: a panel
        leaves the rows, benchmarks and judge settings of its sibling panels out of the config; the rows come
        from the keys it `reads`; `items` narrows the columns to the benchmarks it names.

        Raises:
            ConfigError: for a figure of panels (each panel is run on its own), a table-specific key this table
                does not read, or items of benchmarks it does not have.
        """
        if self.panels:
            raise ConfigError(f"{self.name} is drawn from the runs of its panels ({', '.join(self.panels)}): "
                              f"`harness run {self.name}` runs them; plan or serve them one at a time")
        if self.panel_of is not None:
            cfg = _panel_config(self, cfg)
        unread = [k for k in TABLE_KEYS if given(cfg, k) and k not in self.reads]
        if unread:
            readers = {k: sorted(n for n in _table_names() if k in get_table(n).reads) for k in unread}
            raise ConfigError("; ".join(f"{k}: read by {', '.join(v)}, not by {self.name}" for k, v in readers.items()))
        spec = self.shape(self, cfg) if self.shape is not None else self
        if not cfg.items:
            return spec, cfg
        names = list(cfg.items)
        if spec.columns:
            stray = [b for b in names if b not in spec.benchmarks]
            if stray:
                raise ConfigError(f"items: {self.name} has no benchmark {stray[0]!r}; its benchmarks: "
                                  f"{', '.join(spec.benchmarks)}")
            columns = tuple(c for c in spec.columns if c.benchmark in names)
        else:
            columns = tuple(Column(b, m.name) for b in names for m in benchmark(b).metrics)
        return dataclasses.replace(spec, columns=columns), cfg.model_copy(update={"benchmarks": names})

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.benchmark for c in self.columns))

    @property
    def shown(self) -> tuple[Column, ...]:
        """The columns as printed: `columns`, and with `gap` a `gap` column after each benchmark's last one where
        the benchmark declares a `gap` metric and the table does not show it already."""
        if not self.gap:
            return self.columns
        out: list[Column] = []
        for i, col in enumerate(self.columns):
            out.append(col)
            last = all(c.benchmark != col.benchmark for c in self.columns[i + 1:])
            extra = Column(col.benchmark, GAP)
            if last and extra not in self.columns and any(m.name == GAP for m in benchmark(col.benchmark).metrics):
                out.append(extra)
        return tuple(out)

    def header(self, col: Column) -> str:
        """The paper's name for a column: the benchmark's display name, followed by the metric's where the
        table shows several metrics of that benchmark (`AEOLLM Acc.`, `AEOLLM nDCG`; `RM-Bench`)."""
        name = benchmark(col.benchmark).display
        if sum(c.benchmark == col.benchmark for c in self.shown) > 1:
            name += " " + col.declared().display
        return name


def given(cfg: Any, key: str) -> bool:
    """Whether the run config gives `key`: a value, or an empty mapping written out (refused where it is read,
    never taken for the default)."""
    value = getattr(cfg, key)
    return bool(value) or (value is not None and key in getattr(cfg, "model_fields_set", ()))


def make_row(label: str, paper: str | None, spec: str, cpu: str, *, dynamic: bool = False) -> Row:
    return Row(label, paper, MappingProxyType({"paper": spec, "cpu": cpu}), dynamic)


CPU_DR = f"dynamic-rubric:generator={CPU_MODEL},gen_max_tokens=160"
CPU_RM = f"scalar-rm:model={CPU_MODEL},head=lm-token0"

TABLE1_SPEC = TableSpec(
    name="table1",
    title="Evaluator accuracy (AVG@k): pairwise Acc., listwise Acc. and nDCG",
    rows=(
        make_row("Skywork-27B", "Skywork-27B", f"scalar-rm:model={_SKYWORK}", CPU_RM),
        make_row(
            "Skywork-27B w/ responses",
            "Skywork-27B w/ responses",
            f"scalar-rm:model={_SKYWORK},with_responses=true",
            CPU_RM + ",with_responses=true",
        ),
        make_row("Nemotron-70B", "Nemotron-70B", f"scalar-rm:model={_NEMOTRON},head=lm-token0", CPU_RM),
        make_row(
            "Nemotron-70B w/ responses",
            "Nemotron-70B w/ responses",
            f"scalar-rm:model={_NEMOTRON},head=lm-token0,with_responses=true",
            CPU_RM + ",with_responses=true",
        ),
        make_row(
            "Qwen3-8B zero-shot",
            "Qwen3-8B zero-shot",
            f"dynamic-rubric:generator=vllm:Qwen/Qwen3-8B,verifier={QWEN3_VERIFIER}",
            CPU_DR,
            dynamic=True,
        ),
        make_row(
            "Qwen3-32B zero-shot",
            "Qwen3-32B zero-shot",
            f"dynamic-rubric:generator=vllm:Qwen/Qwen3-32B,verifier={QWEN3_VERIFIER}",
            CPU_DR,
            dynamic=True,
        ),
        make_row(
            "DR-Generator-8B",
            "DR-Generator-8B",
            # A trained checkpoint: point `rows` in a --config file at yours (harness train generator).
            f"dynamic-rubric:generator=vllm:checkpoints/dr-generator-8b,verifier={QWEN3_VERIFIER}",
            CPU_DR,
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
CPU_SETUP = PolicySetup(
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
DEEPSEEK_SETUP = PolicySetup(
    judge="openai:deepseek-v4-flash",
    judge_options=MappingProxyType({"base_url": "https://api.deepseek.com/v1", "api_key_env": "DEEPSEEK_API_KEY"}),
    generation=_PAPER_GENERATION,
)
_GPT41 = PolicySetup(judge="openai:gpt-4.1", generation=_PAPER_GENERATION)
_POLICY_NOTES = (
    "The paper prints one number per benchmark; it is shown under AlpacaEval 2 LC, Arena-Hard v2.0 hard prompts, "
    "WildBench WB-Score and WritingBench (read as each benchmark's headline).",
)
POLICY_SCALES = "Win rates and scores in percent; WildBench and WritingBench x10 as their leaderboards print them."
"""The `scale_note` of the tables of AlpacaEval 2, Arena-Hard v2.0, WildBench and WritingBench."""


def policy_row(label: str, spec: str, *, dynamic: bool = False) -> Row:
    return make_row(label, label, spec, CPU_MODEL, dynamic=dynamic)


# The trained policies are checkpoints you produce (`harness train policy`): point `rows` in a --config file at
# them; the specs below name where the paper's training configs write them.
_TABLE2_ROWS = (
    policy_row("Native Qwen3-8B", "vllm:Qwen/Qwen3-8B"),
    policy_row("Native Qwen3-32B", "vllm:Qwen/Qwen3-32B"),
    policy_row("Skywork-27B", "vllm:checkpoints/policy-skywork-27b"),
    policy_row("Skywork-27B w/ responses", "vllm:checkpoints/policy-skywork-27b-responses"),
    policy_row("Nemotron-70B", "vllm:checkpoints/policy-nemotron-70b"),
    policy_row("Nemotron-70B w/ responses", "vllm:checkpoints/policy-nemotron-70b-responses"),
    policy_row("RaR (235B static rubric)", "vllm:checkpoints/policy-rar-235b"),
    policy_row("DR-Generator-8B", "vllm:checkpoints/dr-policy-8b", dynamic=True),
)
TABLE2_SPEC = TableSpec(
    name="table2",
    title="Policy quality, Qwen3-8B trained with each reward (the paper's judge: DeepSeek-V4-Flash)",
    rows=_TABLE2_ROWS,
    columns=_POLICY_COLUMNS,
    paper=TABLE2,
    setups=MappingProxyType({"paper": DEEPSEEK_SETUP, "cpu": CPU_SETUP}),
    default_seeds=1,
    notes=_POLICY_NOTES,
    scale_note=POLICY_SCALES,
)
TABLE6_SPEC = TableSpec(
    name="table6",
    title="Policy quality, Table 2's policies (the paper's judge: GPT-4.1)",
    rows=_TABLE2_ROWS,
    columns=_POLICY_COLUMNS,
    paper=TABLE6,
    setups=MappingProxyType({"paper": _GPT41, "cpu": CPU_SETUP}),
    default_seeds=1,
    notes=("The paper's Table 6 numbers are not recorded in this harness: its rows print dashes.",),
    scale_note=POLICY_SCALES,
)
TABLE8_SPEC = TableSpec(
    name="table8",
    title="Policy quality across backbones, native and trained with DR-Generator-8B (the paper's judge: "
    "DeepSeek-V4-Flash)",
    rows=(
        policy_row("Llama-3.1-8B native", "vllm:meta-llama/Llama-3.1-8B-Instruct"),
        policy_row("Llama-3.1-8B DR", "vllm:checkpoints/dr-policy-llama-3.1-8b", dynamic=True),
        policy_row("Qwen3-8B native", "vllm:Qwen/Qwen3-8B"),
        policy_row("Qwen3-8B DR", "vllm:checkpoints/dr-policy-8b", dynamic=True),
    ),
    columns=_POLICY_COLUMNS,
    paper=TABLE8,
    setups=MappingProxyType({"paper": DEEPSEEK_SETUP, "cpu": CPU_SETUP}),
    default_seeds=1,
    notes=_POLICY_NOTES,
    scale_note=POLICY_SCALES,
)
# --- Figure 3: verifiable tasks, checked without a judge model, AVG@5 over sampled answers ---

_VERIFIABLE_GENERATION = MappingProxyType({"temperature": 0.6, "top_p": 0.95, "max_tokens": 4096})
FIG3_SPEC = TableSpec(
    name="fig3",
    title="Verifiable tasks (AVG@5): MATH-500 by math-verify, MMLU-Pro and CodeScope by exact match",
    rows=(
        policy_row("Native Qwen3-8B", "vllm:Qwen/Qwen3-8B"),
        policy_row("DR-Generator-8B", "vllm:checkpoints/dr-policy-8b", dynamic=True),
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


def _table_names() -> list[str]:
    from harness.registry import names

    return names("table")


def _panel_config(spec: TableSpec, cfg: Any) -> Any:
    """A figure's run config as one of its panels reads it: the rows, benchmarks, loader options and items of
    its sibling panels left out, and, for an evaluator panel, the policy panels' judge and generation settings.

    Raises:
        ConfigError: when `only_rows` or `benchmarks` were given but name none of this panel's.
    """
    from harness.config import GenerationConfig

    siblings = [get_table(n) for n in get_table(spec.panel_of).panels if n != spec.name]  # type: ignore[arg-type]
    theirs = {r.label for s in siblings for r in s.rows} - {r.label for r in spec.rows}
    benches = {b for s in siblings for b in s.benchmarks} - set(spec.benchmarks)
    update: dict[str, Any] = {
        "rows": {k: v for k, v in cfg.rows.items() if k not in theirs},
        "bench_options": {k: v for k, v in cfg.bench_options.items() if k not in benches},
    }
    for key, drop in (("only_rows", theirs), ("benchmarks", benches)):
        given = getattr(cfg, key)
        if given:
            mine = [x for x in given if x not in drop]
            if not mine:
                raise ConfigError(f"{key} names none of {spec.name}'s ({', '.join(given)}); run the other panel "
                                  "alone with `harness run PANEL`")
            update[key] = mine
    if cfg.items:
        update["items"] = {k: v for k, v in cfg.items.items() if k not in benches} or None
    if spec.kind == "evaluator" and any(s.kind == "policy" for s in siblings):
        update.update(judge=None, judge_settings={}, generation=GenerationConfig())
    return cfg.model_copy(update=update)
