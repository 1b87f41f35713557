"""Shared test set-up: offline hub, a per-test call cache, CUDA-gated `gpu` tests, `vllm` tests where vLLM is
installed (required, not skipped, with HARNESS_TEST_VLLM=1), opt-in `network`/`api` tests."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The project's tests see its built-in entries only: an installed plugin must not change their results (the plugin
# tests give their subprocesses entry points of their own, without this variable).
os.environ["HARNESS_DISABLE_PLUGIN_AUTOLOAD"] = "1"
# Converted embedded models are reused across test runs of one checkout (conversion takes ~30 s).
os.environ.setdefault("HARNESS_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "harness"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = False
    if any(item.get_closest_marker("gpu") for item in items):
        try:
            import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            pass
    has_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if item.get_closest_marker("gpu") and not has_cuda:  # the marker, not the keyword: tests/gpu/ is `gpu`
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "vllm" in item.keywords and not has_vllm and os.environ.get("HARNESS_TEST_VLLM") != "1":
            item.add_marker(pytest.mark.skip(reason="needs vLLM (make test-vllm installs it and runs these)"))
        if "network" in item.keywords and os.environ.get("HARNESS_TEST_NETWORK") != "1":
            item.add_marker(pytest.mark.skip(reason="needs the internet; set HARNESS_TEST_NETWORK=1"))
        if "api" in item.keywords and os.environ.get("HARNESS_TEST_API") != "1":
            item.add_marker(pytest.mark.skip(reason="calls a paid API; set HARNESS_TEST_API=1"))


@pytest.fixture(autouse=True)
def _isolated_call_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own call cache file so tests never see each other's entries."""
    path = tmp_path / "calls.sqlite"
    monkeypatch.setenv("HARNESS_CALL_CACHE", str(path))
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark files (`$HARNESS_TEST_DATA`, default `../shared/data` beside the checkout).

    Missing data fails the test in CI (`CI` set) and skips it elsewhere.
    """
    default = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
    path = Path(os.environ.get("HARNESS_TEST_DATA", default))
    if not path.is_dir():
        message = f"benchmark test data not found at {path} (set HARNESS_TEST_DATA)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
