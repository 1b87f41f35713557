"""The one registry of everything that exists: backends, models, benchmarks, evaluators, policy judges, tables.

A dict keyed by kind and name. The harness's own entries come from `harness.catalog` as `module:attribute`
targets, imported on first lookup (as lm-eval's registry does), so listing names costs no import. An installed
package adds its own through entry points (group `harness.benchmark`, `harness.judge`, ...: `NAME =
"module:attribute"`); code adds one with `declare` (a target, imported when looked up) or `register` (an object,
or as a decorator). Looking up an unknown name suggests the closest and lists the valid ones; a name taken twice is an
error.

Every entry is checked against its kind's contract when it is looked up (as lm-eval's registry checks `base_cls`),
so a plugin that lacks something fails in one line naming it, its distribution and what is missing, before any
model call (`contract_problem`): a benchmark has `name`, `display`, `kind` (pairwise, listwise or policy),
`metrics` (at least one) and `load`; a judge has `judge_all`, `read` and `settings`; a backend subclasses
`harness.backends.base.BaseBackend`; a table has a `reports.tables.TableSpec`'s fields; an evaluator is callable; a model alias
has `description`, `license` and `status`. A plugin whose target does not import, or whose name a built-in entry or
another plugin already has, is refused the same way when looked up (a built-in keeps its name); `broken` lists
them, and `harness list` shows each as `broken: NAME (why)` beside the rest. `HARNESS_DISABLE_PLUGIN_AUTOLOAD=1`
reads no entry point (as pytest's variable of the same name): the built-in entries only.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, TypeVar

from harness.errors import ConfigError

T = TypeVar("T")

_TARGETS: dict[str, dict[str, str]] = {}
"""Kind -> name -> `module:attribute`, not imported yet."""
_REGISTRY: dict[str, dict[str, Any]] = {}
"""Kind -> name -> the object (registered, or a target already imported)."""
_PLUGINS: dict[str, dict[str, str]] = {}
"""Kind -> name -> where a plugin's entry comes from (`plugin NAME = TARGET of distribution DIST`)."""
_BROKEN: dict[str, dict[str, str]] = {}
"""Kind -> name -> why no entry of that name can be used (two plugins claim it)."""
_SHADOWED: dict[str, list[tuple[str, str]]] = {}
"""Kind -> (name, why) of plugins that claim a built-in name (the built-in keeps it)."""
DISABLE_PLUGINS = "HARNESS_DISABLE_PLUGIN_AUTOLOAD"
"""Set (to anything but empty): no entry point is read, only the built-in entries exist."""
BENCHMARK_KINDS = ("pairwise", "listwise", "policy")


def _seed() -> None:
    """Fill the targets once: the catalog's, then every installed plugin's (entry point groups `harness.KIND`,
    each entry `NAME = module:attribute`, as a package declares them in its pyproject.toml), unless
    `DISABLE_PLUGINS` is set. A plugin's name that is taken is recorded as broken, never raised here: one bad
    plugin must not break the others, or the listing."""
    if _TARGETS:
        return
    from harness.catalog import BUILTIN

    for kind, entries in BUILTIN.items():
        _TARGETS.setdefault(kind, {}).update(entries)
    if os.environ.get(DISABLE_PLUGINS):
        return
    from importlib.metadata import entry_points

    for kind in KINDS:
        taken = _TARGETS.setdefault(kind, {})
        by_name: dict[str, dict[str, Any]] = {}
        for entry in entry_points(group=f"harness.{kind}"):
            by_name.setdefault(entry.name, {}).setdefault(_origin(entry), entry)  # one dist seen twice is one
        for name, same in by_name.items():
            if name in taken:  # a built-in keeps its name
                for origin in same:
                    _SHADOWED.setdefault(kind, []).append(
                        (name, f"{origin}: the {kind} name {name!r} is built in; the plugin needs another name"))
            elif len(same) > 1:  # neither is chosen silently
                _BROKEN.setdefault(kind, {})[name] = (f"{len(same)} plugins name this {kind} ({'; '.join(same)}); "
                                                      "uninstall all but one")
            else:
                origin, entry = next(iter(same.items()))
                taken[name] = entry.value
                _PLUGINS.setdefault(kind, {})[name] = origin


def _origin(entry: Any) -> str:
    """Where an entry point comes from, in words."""
    name = getattr(getattr(entry, "dist", None), "name", None)
    return f"plugin {entry.name} = {entry.value}" + (f" of distribution {name}" if name else "")


def contract_problem(kind: str, obj: Any) -> str | None:
    """What `obj` lacks of the contract of `kind` (module docstring), in words; None when it has it all."""
    if kind == "benchmark":
        missing = [a for a in ("name", "display", "kind", "metrics", "load") if not hasattr(obj, a)]
        if missing:
            return f"a benchmark needs name, display, kind, metrics and load; it has no {', '.join(missing)}"
        if obj.kind not in BENCHMARK_KINDS:
            return f"a benchmark's kind is one of {', '.join(BENCHMARK_KINDS)}, not {obj.kind!r}"
        if not callable(obj.load):
            return "a benchmark's load must be a method"
        try:
            if not list(obj.metrics):
                return "a benchmark declares at least one metric (its headline first)"
        except TypeError:
            return f"a benchmark's metrics are a sequence of Metric, not {type(obj.metrics).__name__}"
        return None
    if kind == "judge":
        missing = [a for a in ("judge_all", "read", "settings") if not hasattr(obj, a)]
        return f"a judge needs judge_all, read and settings; it has no {', '.join(missing)}" if missing else None
    if kind == "backend":
        from harness.backends.base import BaseBackend

        ok = isinstance(obj, type) and issubclass(obj, BaseBackend)
        return None if ok else "a backend is a subclass of harness.backends.base.BaseBackend"
    if kind == "table":  # read by its fields: the registry is below `reports/` and imports nothing of it
        missing = [a for a in ("name", "title", "rows", "columns", "setups") if not hasattr(obj, a)]
        return f"a table is a reports.tables.TableSpec; this {type(obj).__name__} has no {', '.join(missing)}" \
            if missing else None
    if kind == "evaluator":
        return None if callable(obj) else "an evaluator is a callable that builds it from its settings"
    if kind == "model":
        missing = [a for a in ("description", "license", "status") if not hasattr(obj, a)]
        return f"a model alias needs description, license and status; it has no {', '.join(missing)}" if missing \
            else None
    return None


def broken(kind: str) -> list[tuple[str, str]]:
    """(name, why) of the plugin entries of `kind` found unusable while reading the entry points (a name taken
    twice); those whose target does not import or lacks the contract show when looked up."""
    _seed()
    return sorted(_BROKEN.get(kind, {}).items()) + list(_SHADOWED.get(kind, []))


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
        problem = contract_problem(kind, found)
        if problem:
            raise ConfigError(f"{kind} {name!r}: {problem} (see CONTRIBUTING.md)")
        table[name] = found
        return found

    return add if obj is None else add(obj)


def lookup(kind: str, name: str) -> Any:
    """What is registered under (`kind`, `name`), importing its module on first use.

    Raises:
        ConfigError: naming the closest valid name and all of them when `name` is unknown; naming the plugin, its
            distribution and the problem when its name is taken twice, its target does not import, or what it
            names lacks the kind's contract (`contract_problem`).
    """
    _seed()
    table = _REGISTRY.setdefault(kind, {})
    if name in table:
        return table[name]
    if name in _BROKEN.get(kind, {}):
        raise ConfigError(f"{kind} {name!r}: {_BROKEN[kind][name]}")
    target = _TARGETS.get(kind, {}).get(name)
    if target is None:
        valid = names(kind)
        raise ConfigError(f"unknown {kind} {name!r}{did_you_mean(name, valid)}; valid: "
                          f"{', '.join(valid) or '(none)'}")
    module, _, attribute = target.partition(":")
    origin = _PLUGINS.get(kind, {}).get(name)
    if origin is None:  # built in: a failure is the project's bug, shown whole
        found = getattr(importlib.import_module(module), attribute)
    else:
        try:
            found = getattr(importlib.import_module(module), attribute)
        except Exception as exc:  # noqa: BLE001 - a plugin's import may fail in any way; said in one line
            why = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"{kind} {name!r} ({origin}): cannot import {target}: {type(exc).__name__}: "
                              f"{why}") from None
    problem = contract_problem(kind, found)
    if problem:
        where = f" ({origin})" if origin else ""
        raise ConfigError(f"{kind} {name!r}{where}: {problem} (see CONTRIBUTING.md)")
    table[name] = found
    return found


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

