"""Benchmarks: datasets, item types, loaders and metrics, one module per benchmark.

Each module registers its benchmark under the registry kind "benchmark"; `register_all()` imports them all.
"""

from __future__ import annotations

_MODULES = (
    "benchmarks.judgebench",
    "benchmarks.rm_bench",
    "benchmarks.ultrafeedback",
    "benchmarks.personalized_rb",
    "benchmarks.aeollm",
    "benchmarks.nectar",
    "benchmarks.alpaca_eval2",
    "benchmarks.arena_hard",
    "benchmarks.wildbench",
    "benchmarks.writingbench",
    "benchmarks.math500",
    "benchmarks.mmlu_pro",
    "benchmarks.codescope",
)


def register_all() -> None:
    """Import every benchmark module so each registers itself."""
    import importlib

    for name in _MODULES:
        importlib.import_module(name)
