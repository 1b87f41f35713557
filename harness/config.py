"""Run configuration: one pydantic model per runnable, loaded from YAML, CLI flags override, unknown keys are errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import ConfigError


class RunConfig(BaseModel):
    """Settings of `harness run TABLE` (written, resolved, into the run's manifest)."""

    model_config = ConfigDict(extra="forbid")

    table: str | None = None
    preset: Literal["paper", "cpu"] = "paper"
    limit: int | None = Field(default=None, ge=1)
    seeds: int = Field(default=5, ge=1)
    seed: int = 0
    data_dir: Path | None = None
    out: Path | None = None
    parallel: int = Field(default=8, ge=1)
    rows: dict[str, str] = Field(default_factory=dict)
    """Row label -> evaluator spec, replacing the preset's spec of that row (e.g. your DR-Generator checkpoint)."""
    only_rows: list[str] | None = None
    """Run just these rows (labels)."""
    benchmarks: list[str] | None = None
    """Run just these benchmarks."""
    backend: dict[str, Any] = Field(default_factory=dict)
    """BackendOptions fields (base_url, concurrency, timeout, max_attempts, batch_size, ...), checked by
    `backend_options` when the config is loaded."""


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
        problems = "; ".join(f"backend.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None


def load_run_config(path: Path | None, overrides: dict[str, Any]) -> RunConfig:
    """The YAML file's settings (if any) with the CLI's non-None `overrides` on top.

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read config ({exc})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the config must be a mapping of settings")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        config = RunConfig(**data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path or 'command line'}: {problems}") from None
    backend_options(config.backend, where=str(path or "command line"))
    return config
