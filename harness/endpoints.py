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
from collections.abc import Iterable, Mapping
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
    where: str = field(default="", compare=False)
    """Where the entry was read (the config or endpoints file), for messages."""


def parse_endpoints(data: Any, *, where: str) -> dict[str, Endpoint]:
    """Model spec -> `Endpoint` from a `models:` mapping (see the module docstring), every value's type checked.

    Raises:
        ConfigError: naming `where` and the entry at fault.
    """
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: models: a mapping of model spec -> endpoint, got {type(data).__name__}")
    found = {}
    for spec, entry in data.items():
        if not isinstance(spec, str) or not spec:
            raise ConfigError(f"{where}: models: {spec!r} is not a model spec (KIND:NAME)")
        found[spec] = _entry(entry, where=where, spec=spec)
    serving: dict[str, str] = {}
    for spec, endpoint in found.items():  # one vLLM server serves one model
        for url in endpoint.urls:
            other = serving.setdefault(url.rstrip("/"), spec)
            if other != spec:
                raise ConfigError(f"{where}: models.{other} and models.{spec} name the same server {url}; a server "
                                  "serves one model: give each its own base_url")
    return found


def _entry(entry: Any, *, where: str, spec: str) -> Endpoint:
    """The `models:` entry of `spec` (read from `where`) as an `Endpoint`."""
    at = f"{where}: models.{spec}"
    if not isinstance(entry, Mapping) or "base_url" not in entry:
        raise ConfigError(f"{at}: needs base_url (a URL, or a list of replicas' URLs)")
    given = entry["base_url"]
    urls = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, list) else ()
    if not urls or not all(isinstance(u, str) and _is_server_url(u) for u in urls):
        raise ConfigError(f"{at}: base_url must be an http(s) URL with a host, or a list of them; got {given!r}")
    seen: set[str] = set()
    for url in urls:
        if url.rstrip("/") in seen:
            raise ConfigError(f"{at}: base_url lists {url} twice; each replica is a server of its own")
        seen.add(url.rstrip("/"))
    served = entry.get("served")
    if served is not None and (not isinstance(served, str) or not served):
        raise ConfigError(f"{at}: served must be the model name its servers know (a string), got {served!r}")
    identity = entry.get("identity") or {}
    if not isinstance(identity, Mapping):
        raise ConfigError(f"{at}: identity must be a mapping, got {type(identity).__name__}")
    for key, value in identity.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{at}: identity.{key} must be a string, got {value!r}")
    rest = {k: v for k, v in entry.items() if k not in ("base_url", "served", "identity")}
    return Endpoint(urls, served, {str(k): str(v) for k, v in identity.items()}, _options(rest, at=at),
                    where=where)


def _is_server_url(url: str) -> bool:
    """Whether `url` is an http(s) URL that names a host (and, where it has one, a valid port), with no whitespace
    or control character anywhere (`urlsplit` silently drops tabs and line breaks; a space would be sent as is)."""
    from urllib.parse import urlsplit

    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _options(values: Mapping[str, Any], *, at: str) -> dict[str, Any]:
    """An entry's `BackendOptions` fields, each checked against the field's type (strictly: `"8"` is no int, `true`
    no number) and its minimum.

    Raises:
        ConfigError: naming the entry, the field and what it must be.
    """
    import math
    import typing

    from pydantic import TypeAdapter, ValidationError

    from harness.backends.base import BackendOptions

    fields = {f.name: f for f in dataclasses.fields(BackendOptions) if f.name != "base_url"}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{at}: unknown setting {unknown[0]!r}; valid: base_url, served, identity, "
                          f"{', '.join(sorted(fields))}")
    hints = typing.get_type_hints(BackendOptions)
    checked = {}
    for name, value in values.items():
        try:
            checked[name] = TypeAdapter(hints[name]).validate_python(value, strict=True)
        except ValidationError as exc:
            message = " ".join(str(exc.errors()[0]["msg"]).split())
            raise ConfigError(f"{at}.{name}: {message}, got {value!r}") from None
        number, minimum = checked[name], fields[name].metadata.get("min")
        if isinstance(number, float) and not math.isfinite(number):
            raise ConfigError(f"{at}.{name}: must be a finite number, got {value!r}")
        if isinstance(number, (int, float)) and minimum is not None and number < minimum:
            raise ConfigError(f"{at}.{name}: must be >= {minimum:g}, got {value!r}")
    return checked


def check_matched(endpoints: Mapping[str, Endpoint], needs: Mapping[str, Iterable[str]], *,
                  left_out: Mapping[str, str]) -> list[str]:
    """Refuse an endpoint that seems to mean a model the run would then run here (a misspelt spec, a trailing
    slash), and name the entries no model of the run calls (a whole table's file given to `harness eval`, say).

    Args:
        endpoints: Model spec -> `Endpoint` (the config's `models:` and the endpoints file's).
        needs: Row -> the pool keys of the models it calls (`SPEC` or `SPEC[overrides]`), every row built.
        left_out: What could not be built (`evaluator SPEC`, `policy SPEC`, `benchmark NAME` -> why); with a row
            left out the run's models are not all known, and nothing is refused or named.

    Returns:
        One line for each entry that names no model of the run (it is unused).

    Raises:
        ConfigError: naming the entry, the run's models, and the unserved model it seems to mean.
    """
    from harness.registry import did_you_mean

    if any(what.startswith(("evaluator ", "policy ")) for what in left_out):
        return []
    models = sorted({key.split("[", 1)[0] for keys in needs.values() for key in keys})
    local = [m for m in models if m not in endpoints]
    unused = []
    for spec, endpoint in endpoints.items():
        if spec in models:
            continue
        at = f"{endpoint.where}: " if endpoint.where else ""
        slash = next((m for m in local if m.rstrip("/") == spec.rstrip("/")), None)
        hint = (f" (it differs from {slash} by a trailing slash: name the model as the run does)" if slash
                else did_you_mean(spec, local))
        if hint:
            raise ConfigError(f"{at}models.{spec}: no model of this run has that spec{hint}; the run's models: "
                              f"{', '.join(models) or 'none'}")
        unused.append(f"{at}models.{spec}: no model of this run has that spec; the entry is unused")
    return unused


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
