"""Benchmarks: datasets, item types, loaders and metrics, one module per benchmark.

Each benchmark is catalogued in `harness.catalog` (name -> `module:OBJECT`) and looked up through the registry
(`harness.registry.lookup("benchmark", name)`), which imports its module on first use.
"""
