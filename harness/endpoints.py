"""Per-model endpoints: a model a run names (`vllm:Qwen/Qwen3-8B`, a row's generator, a judge) served instead by
one or several OpenAI-compatible servers, each model with its own server, key variable and concurrency.

A run config's `models:` mapping (or an endpoints file, `--endpoints FILE`, which `harness serve` writes) maps a
model spec, exactly as the run names it, to where it is served:

    models:
      vllm:Qwen/Qwen3-8B: {base_url: http://node1:8000/v1}
      vllm:Qwen/Qwen3-30B-A3B:
        base_url: [http://node2:8000/v1, http://node3:8000/v1]     # replicas of one model
        served: Qwen/Qwen3-30B-A3B                                 # the name the servers know (default: the spec's)
        concurrency: 64                                            # per replica
        identity: {weights: 3f2a...}                               # the served weights' (`harness serve` writes it)
      openai:deepseek-v4-flash: {base_url: https://api.deepseek.com/v1, api_key_env: DEEPSEEK_API_KEY}

Any other `BackendOptions` field may stand beside `base_url` (timeout, max_attempts, top_logprobs, ...); the run's
`backend:` options are the defaults. A served model's identity is `identity` where given (so its call-cache
entries are those of the same weights, whichever replica served them, and survive a change of servers), else its
server URLs. Several URLs are replicas, routed by `harness.backends.replicas.ReplicaBackend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one model is served."""

    urls: tuple[str, ...]
    """One server, or its replicas."""
    served: str | None = None
    """The model name the servers know (None: the spec's model name)."""
    identity: Mapping[str, str] = field(default_factory=dict)
    """The served weights' identity (empty: the servers' URLs stand for it)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """`BackendOptions` fields for this model alone (api_key_env, concurrency, timeout, ...)."""


def parse_endpoints(data: Any, *, where: str) -> dict[str, Endpoint]:
    """Model spec -> `Endpoint` from a `models:` mapping (see the module docstring).

    Raises:
        ConfigError: naming `where` and the entry at fault.
    """
    from harness.backends.base import BackendOptions

    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: models: a mapping of model spec -> endpoint, got {type(data).__name__}")
    valid = {f.name for f in dataclasses.fields(BackendOptions)} - {"base_url"}
    found = {}
    for spec, entry in data.items():
        at = f"{where}: models.{spec}"
        if not isinstance(entry, Mapping) or "base_url" not in entry:
            raise ConfigError(f"{at}: needs base_url (a URL, or a list of replicas' URLs)")
        urls = entry["base_url"]
        urls = (urls,) if isinstance(urls, str) else tuple(urls) if isinstance(urls, list) else ()
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ConfigError(f"{at}: base_url must be an http(s) URL or a list of them, got {entry['base_url']!r}")
        rest = {k: v for k, v in entry.items() if k not in ("base_url", "served", "identity")}
        unknown = sorted(set(rest) - valid)
        if unknown:
            raise ConfigError(f"{at}: unknown setting {unknown[0]!r}; valid: base_url, served, identity, "
                              f"{', '.join(sorted(valid))}")
        identity = entry.get("identity") or {}
        if not isinstance(identity, Mapping):
            raise ConfigError(f"{at}: identity must be a mapping, got {type(identity).__name__}")
        found[str(spec)] = Endpoint(urls, entry.get("served"), {str(k): str(v) for k, v in identity.items()}, rest)
    serving: dict[str, str] = {}
    for spec, endpoint in found.items():  # one vLLM server serves one model
        for url in endpoint.urls:
            other = serving.setdefault(url.rstrip("/"), spec)
            if other != spec:
                raise ConfigError(f"{where}: models.{other} and models.{spec} name the same server {url}; a server "
                                  "serves one model: give each its own base_url")
    return found


def read_endpoints(path: Path) -> dict[str, Endpoint]:
    """An endpoints file (`harness serve` writes one): YAML or JSON with a `models:` mapping.

    Raises:
        ConfigError: one line naming the file and what is wrong.
    """
    from harness.config import read_yaml_mapping

    data = read_yaml_mapping(path, what="endpoints file")
    unknown = sorted(set(data) - {"models", "servers"})
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; an endpoints file holds models (and servers)")
    return parse_endpoints(data.get("models"), where=str(path))


def model_name(spec: str) -> str:
    """What a server calls the model a spec names: the name after `KIND:` (`vllm:Qwen/Qwen3-8B` -> Qwen/Qwen3-8B)."""
    kind, sep, name = spec.partition(":")
    return name if sep and "/" not in kind else spec


def served_backend(spec: str, endpoint: Endpoint, options: Any) -> Any:
    """The backend that calls `spec`'s servers: an `openai` backend, or a replica router over several."""
    from harness.backends.openai_backend import OpenAIBackend
    from harness.backends.replicas import ReplicaBackend

    name = endpoint.served or model_name(spec)
    merged = dataclasses.replace(options, **endpoint.options)
    backends = [OpenAIBackend(name, dataclasses.replace(merged, base_url=url)) for url in endpoint.urls]
    if len(backends) == 1 and not endpoint.identity:
        return backends[0]
    return ReplicaBackend(name, backends, identity=endpoint.identity)
