"""The commands: the `harness` CLI and the verbs behind it (run, eval, generate, score, bench, doctor).

This package sits on top of everything else: it may import `benchmarks`, `judges`, `reports` and `training`. The
rest of `harness/` (errors, registry, seeds, config, backends, cache, pool, run store, records, the resumable loop)
is the low layer: it imports none of them, and `tests/harness/test_layers.py` keeps it so.
"""
