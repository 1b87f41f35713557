"""One backend per model spec for a whole run: evaluators that share a model share its weights and its cache.

Building a backend loads nothing: local models load, and servers are probed, on the first call the cache cannot
answer (`harness.cache.CachedBackend`), so a run whose every call is cached starts no model at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.backends.base import BackendOptions
from harness.cache import CachedBackend, CallCache


class BackendPool:
    """Builds each model spec's backend once (wrapped in the call cache) and closes them all at the end."""

    def __init__(self, *, options: BackendOptions | None = None, cache: CallCache | None = None) -> None:
        self.options = options or BackendOptions()
        self.cache = cache
        self._backends: dict[str, CachedBackend] = {}
        self._closed_calls = 0
        self._closed_hits = 0

    def get(self, spec: str) -> CachedBackend:
        """The cached backend for `spec`, built on first use."""
        if spec not in self._backends:
            from harness.backends import load_backend

            self._backends[spec] = CachedBackend(load_backend(spec, self.options), self.cache)
        return self._backends[spec]

    def identities(self, evaluators: Mapping[str, Any] | None = None) -> dict[str, dict[str, str]]:
        """Model spec -> identity of every backend built so far (computed without loading any weights).

        `evaluators` (spec -> evaluator) adds the identity of each evaluator that holds a model outside the pool
        (one with an `identity()` method, such as `scalar-rm`), under its spec.
        """
        found = {spec: backend.identity() for spec, backend in self._backends.items()}
        for spec, evaluator in (evaluators or {}).items():
            if callable(getattr(evaluator, "identity", None)):
                found[spec] = evaluator.identity()
        return found

    @property
    def calls(self) -> int:
        """Requests sent to backends so far (cache misses)."""
        return self._closed_calls + sum(b.calls for b in self._backends.values())

    @property
    def hits(self) -> int:
        """Requests answered by the call cache so far."""
        return self._closed_hits + sum(b.hits for b in self._backends.values())

    async def close(self) -> None:
        for backend in self._backends.values():
            await backend.close()
        self._closed_calls, self._closed_hits = self.calls, self.hits  # the counts outlive the backends
        self._backends.clear()
