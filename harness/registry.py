"""The one registry of everything that exists: backends, models, evaluators, benchmarks, tables.

A dict keyed by kind and name, filled by decorators. Looking up an unknown name lists the valid ones; registering a
name twice is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from harness.errors import ConfigError

T = TypeVar("T")

_REGISTRY: dict[str, dict[str, Any]] = {}


def register(kind: str, name: str) -> Callable[[T], T]:
    """Decorator: register `obj` under (`kind`, `name`).

    Raises:
        ValueError: if the name is already taken for this kind.
    """

    def decorator(obj: T) -> T:
        table = _REGISTRY.setdefault(kind, {})
        if name in table and table[name] is not obj:
            raise ValueError(f"duplicate {kind} name {name!r}: already registered by {table[name]!r}")
        table[name] = obj
        return obj

    return decorator


def lookup(kind: str, name: str) -> Any:
    """Return what is registered under (`kind`, `name`).

    Raises:
        ConfigError: naming the valid choices when `name` is unknown.
    """
    table = _REGISTRY.get(kind, {})
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}{did_you_mean(name, table)}; valid: "
                          f"{', '.join(sorted(table)) or '(none)'}")
    return table[name]


def did_you_mean(name: str, choices: Any) -> str:
    """` (did you mean X?)` for the closest of `choices` to a misspelt `name`, else an empty string."""
    import difflib

    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def names(kind: str) -> list[str]:
    """All names registered for `kind`, sorted."""
    return sorted(_REGISTRY.get(kind, {}))
