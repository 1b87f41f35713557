"""Run configuration: one pydantic model per runnable, loaded from YAML, CLI flags override, unknown keys are errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import TOO_DEEP, ConfigError


class GenerationConfig(BaseModel):
    """`generation:` of a policy table's config: how the policies answer (the preset's values where left out)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: list[str] | None = None
    strip_thinking: bool | None = None
    """Judge the answers without their `<think>` blocks (default true); the raw answers are kept either way."""


class JudgeConfig(BaseModel):
    """`judge:` of a policy table's config as a mapping: the model and backend options for it alone."""

    model_config = ConfigDict(extra="allow")

    model: str
    """The judge's model spec; every other key is a `BackendOptions` field (base_url, api_key_env, ...)."""


class DevicesConfig(BaseModel):
    """`devices:` of a run config: the accelerators the run's local models share (`harness.plan.Devices`)."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(ge=1)
    gpu_memory: float = Field(gt=0, description="GiB of one device.")
    kv_cache: float = Field(4.0, ge=0, description="GiB each engine takes on each of its devices besides weights.")
    usable: float = Field(0.92, gt=0, le=1, description="Share of a device the engines may take together.")


class ServeModelConfig(BaseModel):
    """One model's entry in `serve:` of a run config: how `harness serve` serves it (`harness.serve`)."""

    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(1, ge=1, description="Servers of this model (the run routes among them).")
    tensor_parallel_size: int | None = Field(None, ge=1, description="GPUs per replica (None: fewest).")
    devices: list[int] | None = Field(None, description="GPU indices, replicas x tensor_parallel_size.")
    runner: Literal["auto", "generate", "pooling"] = Field(
        "auto", description="auto: pooling for a *ForSequenceClassification checkpoint, else generate.")
    args: list[str] = Field(default_factory=list, description="Extra vLLM server arguments.")


class RunConfig(BaseModel):
    """Settings of `harness run TABLE` (written, resolved, into the run's manifest).

    A field's docstring is its description, and the help of its command-line option where a verb takes one
    (`harness.commands.options.run_option`: `--limit`, `--seeds`, `--seed`, `--data-dir`, `--out`, `--parallel`,
    `--preset`, `--coevolve`); a verb states its own default there. Left None, `seeds` takes the table's (5 for
    table1, 1 for the policy tables), `parallel` 8 (32 for policy tables) and `out` runs/TABLE-PRESET.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    table: str | None = None
    preset: Literal["paper", "cpu"] = "paper"
    """The rows' models: paper (the paper's) | cpu (smollm2-135m everywhere)."""
    limit: int | None = Field(default=None, ge=1)
    """Only the first N items of each benchmark (prompts of a prompt file, documents of an lm-eval task)."""
    seeds: int | None = Field(default=None, ge=1)
    """Repeats per item (AVG@k)."""
    seed: int = 0
    """Run seed; the seeds of items, repeats and samples derive from it."""
    data_dir: Path | None = None
    """Upstream benchmark files (else the Hub)."""
    out: Path | None = None
    """Run directory (rerun into it to resume)."""
    parallel: int | None = Field(default=None, ge=1)
    """Sets scored (policy tables: answers generated) concurrently."""
    rows: dict[str, str] = Field(default_factory=dict)
    """Row label -> evaluator spec (policy tables: the policy's model spec, e.g. `vllm:DIR` of your checkpoint),
    replacing the preset's spec of that row."""
    judge: str | JudgeConfig | None = None
    """Policy tables: the judge, a model spec or {model, base_url, api_key_env, ...}; default the table's."""
    judge_settings: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Policy tables: benchmark -> its judge's settings, on top of the preset's (e.g. alpaca_eval2: {mode:
    discrete}, arena_hard_v2: {upstream_prompts: DIR})."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """Policy tables: how the policies answer."""
    bench_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Benchmark -> options of its loader (writingbench: {subset: length}, arena_hard_v2: {missing_baseline:
    skip})."""
    only_rows: list[str] | None = None
    """Run just these rows (labels)."""
    benchmarks: list[str] | None = None
    """Run just these benchmarks."""
    items: dict[str, list[str]] | None = None
    """Run just these items: benchmark -> item ids (`--item BENCH:ID`); the run's benchmarks are those named."""
    generators: dict[str, str] = Field(default_factory=dict)
    """table5: generator label -> model spec, the grid's generators (default: the table's)."""
    verifiers: dict[str, str] = Field(default_factory=dict)
    """table5: verifier label -> model spec, the grid's verifiers (default: the table's)."""
    coevolve: Path | None = None
    """fig2, table9: a `harness train coevolve` output dir; its checkpoints (named in its coevolve.json) are the rows
    (G0, G1, G2, G2-stale; P1, P2, P2-stale)."""
    backend: dict[str, Any] = Field(default_factory=dict)
    """BackendOptions fields (base_url, concurrency, timeout, max_attempts, batch_size, ...), checked by
    `backend_options` when the config is loaded."""
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Model spec -> where it is served: {base_url: URL or [replica URLs], served, identity, and any backend
    option for it alone: api_key_env, concurrency, ...} (`harness.endpoints`)."""
    devices: DevicesConfig | None = None
    """The accelerators the local models share; None: `--gpus`/`--gpu-memory`, else what nvidia-smi lists, else
    unbounded (one phase)."""
    serve: dict[str, ServeModelConfig] = Field(default_factory=dict)
    """Model spec -> how `harness serve` serves it (replicas, tensor_parallel_size, devices, runner, args)."""


def backend_options(values: dict[str, Any], *, where: str):
    """`BackendOptions` from a mapping, every key and type checked.

    Raises:
        ConfigError: naming `where`, the offending `backend.KEY` and the valid keys or the expected type.
    """
    import dataclasses

    from pydantic import TypeAdapter

    from harness.backends.base import BackendOptions

    valid = [f.name for f in dataclasses.fields(BackendOptions)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: backend.{unknown[0]}: unknown setting; valid: {', '.join(valid)}")
    try:
        return TypeAdapter(BackendOptions).validate_python(dict(values))
    except ValidationError as exc:
        raise ConfigError(f"{where}: {validation_problems(exc, prefix='backend.')}") from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser's error on one line: what and where (line and column, 1-based), without the source
    excerpt PyYAML prints over several lines."""
    mark = getattr(exc, "problem_mark", None)
    what = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = getattr(exc, "context", None)
    if context:
        what = f"{what} ({' '.join(str(context).split())})"
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else what


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping (YAML 1.2 forbids it; PyYAML silently
    keeps the last, so a second `G:` under `generators:` would drop the first row without a word). Keys a merge
    (`<<: *base`) brings in may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base constructor refuses it with its own message
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is written twice (first at line {first.line + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """YAML text as Python values, with `UniqueKeyLoader` (no key written twice in one mapping)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml_mapping(path: Path, *, what: str) -> dict[str, Any]:
    """A YAML file holding a mapping of settings (an empty file is an empty mapping).

    Raises:
        ConfigError: one line naming the file and what is wrong with it (unreadable, not UTF-8, not YAML, not a
            mapping).
    """
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: the {what} is not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: the {what} is {TOO_DEEP}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {what} is a mapping of settings, got {type(data).__name__}")
    return data


def validation_problems(exc: ValidationError, *, prefix: str = "") -> str:
    """Pydantic's errors on one line: `KEY.PATH: message` for each, `prefix` before every key."""
    found = []
    for e in exc.errors():
        message = str(e["msg"]).removeprefix("Value error, ")
        found.append(f"{prefix}{'.'.join(map(str, e['loc']))}: {' '.join(message.split())}")
    return "; ".join(found)


def load_config_file(path: Path, model: type[BaseModel], *, what: str,
                     overrides: dict[str, Any] | None = None) -> Any:
    """A YAML file's settings as `model`, with the non-None `overrides` on top (`what`: how errors name it).

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    data = read_yaml_mapping(path, what=what)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return model(**data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_problems(exc)}") from None


def load_run_config(path: Path | None, overrides: dict[str, Any]) -> RunConfig:
    """The YAML file's settings (if any) with the CLI's non-None `overrides` on top.

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    data = read_yaml_mapping(path, what="config") if path is not None else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        config = RunConfig(**data)
    except ValidationError as exc:
        raise ConfigError(f"{path or 'command line'}: {validation_problems(exc)}") from None
    backend_options(config.backend, where=str(path or "command line"))
    return config


def items_option(values: list[str] | None) -> dict[str, list[str]] | None:
    """`--item BENCH:ID` values (repeatable) as a run config's `items` (benchmark -> ids); None for none.

    Raises:
        ConfigError: for a value without `BENCH:` before the id.
    """
    if not values:
        return None
    items: dict[str, list[str]] = {}
    for value in values:
        bench, sep, item = value.partition(":")
        if not sep or not bench or not item:
            raise ConfigError(f"--item {value!r}: expected BENCH:ID, e.g. judgebench:<item id>")
        items.setdefault(bench, []).append(item)
    return items
