"""Rows a run config makes: table5's grid of generators x verifiers, and the checkpoints a `harness train coevolve`
dir names (fig2's panels, table9).

Each function is a `TableSpec.shape`: it takes the table and the run config (`harness.config.RunConfig`) and
returns the table with its rows; the config's `rows:` still replace single rows' specs afterwards, as for every
table. Nothing here loads a model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from reports.tables import Row, TableSpec, given


def with_models(spec: str, **models: str) -> str:
    """An evaluator spec with some of its model settings replaced (`generator=`, `verifier=`), the rest kept."""
    from judges.base import parse_evaluator_spec

    kind, settings = parse_evaluator_spec(spec)
    settings.update(models)
    return kind + ":" + ",".join(f"{k}={v}" for k, v in settings.items())


# --- table5: generators x verifiers ---


def grid_label(generator: str, verifier: str) -> str:
    """A grid row's label: its verifier, then its generator (rows are grouped by verifier)."""
    return f"{verifier} / {generator}"


def grid_rows(templates: Mapping[str, str], generators: Mapping[str, str], verifiers: Mapping[str, str], *,
              dynamic: frozenset[str] = frozenset()) -> tuple[Row, ...]:
    """One row per (verifier, generator), grouped by verifier: the preset's evaluator template (`templates`:
    preset -> spec) with the pair's models. `generators` and `verifiers`: label -> model spec; a model spec per
    preset where it is a mapping.

    Raises:
        ConfigError: when two pairs make the same row label (a label holding ` / ` can).
    """
    rows = []
    pairs: dict[str, tuple[str, str]] = {}
    for v_label, verifier in verifiers.items():
        for g_label, generator in generators.items():
            specs = {}
            for preset, template in templates.items():
                g = generator[preset] if isinstance(generator, Mapping) else generator
                v = verifier[preset] if isinstance(verifier, Mapping) else verifier
                specs[preset] = with_models(template, generator=g, verifier=v)
            label = grid_label(g_label, v_label)
            if label in pairs:
                first = pairs[label]
                raise ConfigError(f"generators x verifiers: generator {first[0]!r} with verifier {first[1]!r} and "
                                  f"generator {g_label!r} with verifier {v_label!r} both make the row {label!r} "
                                  "(VERIFIER / GENERATOR); rename a label")
            pairs[label] = (g_label, v_label)
            rows.append(Row(label, label, MappingProxyType(specs), g_label in dynamic))
    return tuple(rows)


def grid_shape(templates: Mapping[str, str], generators: Mapping[str, Any], verifiers: Mapping[str, Any], *,
               dynamic: frozenset[str] = frozenset()):
    """The `shape` of a grid table: the config's `generators` and `verifiers` (each replacing the table's list
    where given) crossed.

    Raises:
        ConfigError: for a `generators` or `verifiers` mapping given empty, or labels that make one row twice.
    """

    def shape(spec: TableSpec, cfg: Any) -> TableSpec:
        for key in ("generators", "verifiers"):
            if given(cfg, key) and not getattr(cfg, key):
                raise ConfigError(f"{key}: empty; name at least one (label: model spec), or leave {key} out for "
                                  f"{spec.name}'s own")
        if not cfg.generators and not cfg.verifiers:
            return spec
        rows = grid_rows(templates, cfg.generators or generators, cfg.verifiers or verifiers,
                         dynamic=dynamic if not cfg.generators else frozenset())
        return dataclasses.replace(spec, rows=rows)

    return shape


# --- a coevolve dir's checkpoints ---


def read_coevolve(path: Path) -> dict[str, Any]:
    """The stages of a `harness train coevolve` output dir: {"specs": name -> model spec (G0 and P0 the base
    models), "verifier": the frozen verifier's spec}.

    Raises:
        ConfigError: for a dir without a readable coevolve.json.
    """
    file = Path(path) / "coevolve.json"
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
        specs = {**manifest["base"], **{s["name"]: s["spec"] for s in manifest["stages"]}}
        verifier = manifest["config"]["verifier"]
    except FileNotFoundError:
        raise ConfigError(f"coevolve: {file} not found (the output dir of `harness train coevolve`)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"coevolve: {file} cannot be read as a coevolve manifest ({exc!r})") from None
    return {"specs": specs, "verifier": verifier}


def coevolve_shape(spec: TableSpec, cfg: Any) -> TableSpec:
    """A table whose rows are named after co-evolution stages (G0, G1, G2, G2-stale; P1, P2, P2-stale), with the
    checkpoints `cfg.coevolve` names: a generator row is its preset spec with the stage as generator and the
    co-evolution's verifier, a policy row the stage's checkpoint.

    Raises:
        ConfigError: naming the stages the dir lacks (G2-stale and P2-stale need `stale_controls: true`).
    """
    if cfg.coevolve is None:
        return spec
    found = read_coevolve(cfg.coevolve)
    missing = [r.label for r in spec.rows if r.label not in found["specs"]]
    if missing:
        raise ConfigError(f"coevolve: {cfg.coevolve}/coevolve.json has no stage {', '.join(missing)} (the stale "
                          "controls need stale_controls: true and rounds >= 2)")
    rows = []
    for row in spec.rows:
        model = found["specs"][row.label]
        if spec.kind == "policy":
            specs = {preset: model for preset in row.specs}
        else:
            specs = {preset: with_models(s, generator=model, verifier=found["verifier"])
                     for preset, s in row.specs.items()}
        rows.append(dataclasses.replace(row, specs=MappingProxyType(specs)))
    return dataclasses.replace(spec, rows=tuple(rows))
