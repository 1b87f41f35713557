"""One backend per model spec for a whole run: evaluators that share a model share its weights and its cache.

Building a backend loads nothing: local models load, and servers are probed, on the first call the cache cannot
answer (`harness.cache.CachedBackend`), so a run whose every call is cached starts no model at all.

The pool's `BackendOptions` apply to every backend. An evaluator with load-time settings of its own (`scalar-rm`'s
`dtype`, `device`, `batch_size`) asks for them as `overrides`: a spec with overrides that differ from the pool's
options is a backend of its own (its own copy of the weights), keyed `SPEC[key=value,...]`; overrides equal to the
pool's options are dropped, so such an evaluator shares the pool's backend of that spec.

Over a read-only cache (a replay, `--replay FILE`) every call is answered from the file: nothing is checked
(`preflight`), probed or loaded, and a local model (`hf:`, `vllm:`) is built as a `harness.calllog.ReplayedBackend`
with the identity the file recorded for it. `recording_calls` records the calls of a run in its `calls.sqlite`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.backends.base import BackendOptions
from harness.backends.replicas import ReplicaBackend
from harness.cache import CachedBackend, CallCache
from harness.errors import ConfigError, HarnessError


class BackendPool:
    """Builds each model spec's backend once (wrapped in the call cache) and closes them all at the end."""

    def __init__(self, *, options: BackendOptions | None = None, cache: CallCache | None = None,
                 endpoints: Mapping[str, Any] | None = None) -> None:
        self.options = options or BackendOptions()
        self.cache = cache
        self.endpoints = dict(endpoints or {})
        """Model spec -> `harness.endpoints.Endpoint`: the models served elsewhere (their own servers, key
        variables, concurrency; several URLs are replicas)."""
        self._backends: dict[str, CachedBackend] = {}
        self._closed_calls = 0
        self._closed_hits = 0
        self._lacks: dict[str, dict[str, str]] = {}
        self._spent: dict[str, dict[str, int]] = {}
        self._recording: list[set[str]] = []
        self._engines: dict[str, dict[str, int]] = {}
        self._replicas: dict[str, dict[str, Any]] = {}
        self._peak = 0
        self._log: Any = None

    @property
    def replaying(self) -> bool:
        """Whether every call is answered from a read-only cache (`--replay FILE`)."""
        return self.cache is not None and self.cache.read_only

    def get(self, spec: str, *, overrides: Mapping[str, Any] | None = None) -> CachedBackend:
        """The cached backend for `spec` (with `overrides` of the pool's `BackendOptions` fields), built on first use.

        Raises:
            ConfigError: for an override that names no `BackendOptions` field.
        """
        fields = {f.name for f in dataclasses.fields(BackendOptions)}
        unknown = sorted(set(overrides or {}) - fields)
        if unknown:
            raise ConfigError(f"unknown backend option(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
        changed = {k: v for k, v in sorted((overrides or {}).items()) if getattr(self.options, k) != v}
        key = spec + (f"[{','.join(f'{k}={v}' for k, v in changed.items())}]" if changed else "")
        if key not in self._backends:
            from harness.backends import load_backend
            from harness.endpoints import served_backend

            options = dataclasses.replace(self.options, **changed)
            endpoint = self.endpoints.get(spec)
            if endpoint:
                built = served_backend(spec, endpoint, options)
            elif self.replaying:
                built = self._replayed(spec, options)
            else:
                built = load_backend(spec, options)
            self._backends[key] = CachedBackend(built, self.cache)
            self._backends[key].log = self._log
        for keys in self._recording:
            keys.add(key)
        return self._backends[key]

    def _replayed(self, spec: str, options: BackendOptions) -> Any:
        """The backend of `spec` in a replay: a local model's identity only (the one the file recorded for it, where
        exactly one fits; else found by locating the model, which loads nothing), any other backend as built."""
        from harness.backends import LOCAL_KINDS, load_backend, parse_spec
        from harness.calllog import ReplayedBackend, recorded_identity

        kind, name = parse_spec(spec)
        if kind not in LOCAL_KINDS:
            return load_backend(spec, options)
        assert self.cache is not None
        identity = recorded_identity(self.cache.path, kind, name, dtype=options.dtype,
                                     top_logprobs=options.top_logprobs)
        if identity is None:
            identity = load_backend(spec, options).identity()
        return ReplayedBackend(kind, name, identity)

    @contextlib.contextmanager
    def recording_calls(self, path: Path) -> Iterator[None]:
        """Within the block, record every call the backends look up in `path` (a run's `calls.sqlite`:
        `harness.calllog.CallLog`); nothing without a call cache."""
        if self.cache is None:
            yield
            return
        from harness.calllog import CallLog

        log = CallLog(path)
        self._log = log
        for backend in self._backends.values():
            backend.log = log
        failed = True
        try:
            yield
            failed = False
        finally:
            self._log = None
            for backend in self._backends.values():
                backend.log = None
            if failed:
                with contextlib.suppress(HarnessError):  # the error in flight is the one to report
                    log.close()
            else:
                log.close()

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[str]]:
        """Within the block, collect the keys of every backend asked for (what an evaluator being built uses)."""
        keys: set[str] = set()
        self._recording.append(keys)
        try:
            yield keys
        finally:
            self._recording.remove(keys)

    def preflight(self) -> None:
        """Check every backend can run here before the first model call (a backend's `preflight`, where it has
        one: vLLM installed, say).

        Raises:
            HarnessError: the first backend that cannot, naming it.
        """
        if self.replaying:  # no backend runs in a replay
            return
        for backend in self._backends.values():
            check = getattr(backend.backend, "preflight", None)
            if check is not None:
                check()

    def key_of(self, backend: CachedBackend) -> str:
        """The key `backend` was built under."""
        return next(key for key, b in self._backends.items() if b is backend)

    def backend(self, key: str) -> CachedBackend:
        """The backend built under `key` (a spec, with its overrides)."""
        return self._backends[key]

    def local(self) -> list[str]:
        """Keys of the backends whose models run in this process (`hf`, `vllm`)."""
        return [key for key, b in self._backends.items() if b.local]

    def resident(self) -> list[str]:
        """Keys of the local backends whose weights are in memory now."""
        return [key for key, b in self._backends.items() if b.resident]

    def replicas(self) -> dict[str, dict[str, Any]]:
        """Key -> requests per replica and failovers, for every model served by replicas; kept after `close`."""
        for key, b in self._backends.items():
            if isinstance(b.backend, ReplicaBackend):
                self._replicas[key] = b.backend.stats()
        return dict(self._replicas)

    def engines(self) -> dict[str, Any]:
        """The local models' loads and releases so far, and the most that were resident at once at a phase's
        end (`release`); kept after `close`."""
        for key, b in self._backends.items():
            if b.local:
                self._engines[key] = {"loads": b.backend.loads, "releases": b.backend.releases}
        return {"peak_resident": self._peak, "models": dict(self._engines)} if self._engines else {}

    async def release(self, keys: Iterable[str]) -> None:
        """End of a phase: note how many local models are resident, then free the memory of `keys` (each
        reloads on its next uncached request)."""
        self._peak = max(self._peak, len(self.resident()))
        for key in keys:
            await self._backends[key].release()

    def identities(self) -> dict[str, dict[str, str]]:
        """Model spec (with its overrides, see the module docstring) -> identity of every backend built so far
        (computed without loading any weights)."""
        return {spec: backend.identity() for spec, backend in self._backends.items()}

    def capabilities(self) -> dict[str, dict[str, str]]:
        """Model spec -> what its backend was found to lack (`BaseBackend.capabilities`), for the backends that lack
        something; kept after `close`."""
        found = {spec: backend.capabilities() for spec, backend in self._backends.items()}
        self._lacks.update({spec: lacks for spec, lacks in found.items() if lacks})
        return dict(self._lacks)

    def spent(self) -> dict[str, dict[str, int]]:
        """Model spec -> requests sent and tokens the backend reported (prompt, completion), for every backend
        built so far that sent a request; kept after `close`."""
        for spec, b in self._backends.items():
            if b.calls:
                self._spent[spec] = {"calls": b.calls, "prompt_tokens": b.prompt_tokens,
                                     "completion_tokens": b.completion_tokens}
        return dict(self._spent)

    @property
    def calls(self) -> int:
        """Requests sent to backends so far (cache misses)."""
        return self._closed_calls + sum(b.calls for b in self._backends.values())

    @property
    def hits(self) -> int:
        """Requests answered by the call cache so far."""
        return self._closed_hits + sum(b.hits for b in self._backends.values())

    async def close(self) -> None:
        self.capabilities()  # what the backends found outlives them
        self.spent()
        self._peak = max(self._peak, len(self.resident()))
        self.engines()
        self.replicas()
        for backend in self._backends.values():
            await backend.close()
        self._closed_calls, self._closed_hits = self.calls, self.hits  # the counts outlive the backends
        self._backends.clear()
