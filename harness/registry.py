"""The one registry of everything that exists: backends, models, benchmarks, evaluators, policy judges, tables.

A dict keyed by kind and name. The harness's own entries come from `harness.catalog` as `module:attribute`
targets, imported on first lookup (as lm-eval's registry does), so listing names costs no import. An installed
package adds its own through entry points (group `harness.benchmark`, `harness.judge`, ...: `NAME =
"module:attribute"`); code adds one with `declare` (a target, imported when looked up) or `register` (an object,
or as a decorator). Looking up an unknown name suggests the closest and lists the valid ones; a name taken twice is an
error.
"""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from harness.errors import ConfigError

T = TypeVar("T")

_TARGETS: dict[str, dict[str, str]] = {}
"""Kind -> name -> `module:attribute`, not imported yet."""
_REGISTRY: dict[str, dict[str, Any]] = {}
"""Kind -> name -> the object (registered, or a target already imported)."""


def _seed() -> None:
    """Fill the targets once: the catalog's, then every installed plugin's (entry point groups `harness.KIND`,
    each entry `NAME = module:attribute`, as a package declares them in its pyproject.toml)."""
    if _TARGETS:
        return
    from importlib.metadata import entry_points

    from harness.catalog import BUILTIN

    for kind, entries in BUILTIN.items():
        _TARGETS.setdefault(kind, {}).update(entries)
    for kind in KINDS:
        for entry in entry_points(group=f"harness.{kind}"):
            if entry.name in _TARGETS.setdefault(kind, {}):
                raise ValueError(f"plugin {entry.value!r}: duplicate {kind} name {entry.name!r}")
            _TARGETS[kind][entry.name] = entry.value


KINDS = ("backend", "model", "benchmark", "evaluator", "judge", "table")
"""What the registry holds."""


def declare(kind: str, name: str, target: str) -> None:
    """Add an entry whose object `target` (`module:attribute`) is imported when it is first looked up.

    Raises:
        ValueError: if the name is taken for this kind, or the target is not `module:attribute`.
    """
    _seed()
    module, sep, attribute = target.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"{kind} {name!r}: target {target!r} is not module:attribute")
    if name in _TARGETS.get(kind, {}) or name in _REGISTRY.get(kind, {}):
        raise ValueError(f"duplicate {kind} name {name!r}")
    _TARGETS.setdefault(kind, {})[name] = target


def register(kind: str, name: str, obj: Any = None) -> Any:
    """Register `obj` under (`kind`, `name`); without `obj`, a decorator that registers what it decorates.

    Raises:
        ValueError: if the name is already taken for this kind by something else.
    """
    _seed()

    def add(found: T) -> T:
        table = _REGISTRY.setdefault(kind, {})
        if (name in table and table[name] is not found) or name in _TARGETS.get(kind, {}):
            raise ValueError(f"duplicate {kind} name {name!r}: already registered")
        table[name] = found
        return found

    return add if obj is None else add(obj)


def lookup(kind: str, name: str) -> Any:
    """What is registered under (`kind`, `name`), importing its module on first use.

    Raises:
        ConfigError: naming the closest valid name and all of them when `name` is unknown.
    """
    _seed()
    table = _REGISTRY.setdefault(kind, {})
    if name in table:
        return table[name]
    target = _TARGETS.get(kind, {}).get(name)
    if target is None:
        valid = names(kind)
        raise ConfigError(f"unknown {kind} {name!r}{did_you_mean(name, valid)}; valid: "
                          f"{', '.join(valid) or '(none)'}")
    module, _, attribute = target.partition(":")
    table[name] = getattr(importlib.import_module(module), attribute)
    return table[name]


def names(kind: str) -> list[str]:
    """All names of `kind`, sorted (nothing is imported)."""
    _seed()
    return sorted(set(_TARGETS.get(kind, {})) | set(_REGISTRY.get(kind, {})))


def did_you_mean(name: str, choices: Any) -> str:
    """` (did you mean X?)` for the closest of `choices` to a misspelt `name`, else an empty string."""
    import difflib

    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def entries(kind: str) -> dict[str, Any]:
    """Every entry of `kind`, imported (for `harness list` and checks that need the objects)."""
    return {name: lookup(kind, name) for name in names(kind)}

