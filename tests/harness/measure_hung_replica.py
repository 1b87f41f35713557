"""How long a 10-set `harness eval` takes when one of two replicas hangs, against the healthy replica alone.

Not a test (pytest does not collect it): a measurement, run by hand:

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python tests/harness/measure_hung_replica.py [--data-dir DIR]

The healthy replica is a loopback judge that answers each request after `--latency-s` (0.1 s: a pairwise set,
both orders, in about 0.2 s). The hanging one accepts connections and never answers: in the `silent` case not
even the run's first probe (`GET /models`), in the `chat-hangs` case only chat requests. Every run uses the
default timeout (`BackendOptions.timeout`, 120 s), a fresh call cache and `--limit 10`; the bound printed is
the one the router is held to: twice the healthy-only time plus one timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.backends.base import BackendOptions  # noqa: E402
from harness.loopback import chat_completion, json_response, serve_in_thread  # noqa: E402


def healthy(latency_s: float):
    async def handle(request):
        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": [{"id": "judge"}]})
        await asyncio.sleep(latency_s)
        text = request.json()["messages"][-1]["content"]
        verdict = "[[A]]" if hashlib.sha256(text.encode()).digest()[0] % 3 else "[[B]]"
        return json_response(chat_completion([f"Verdict: {verdict}"]))

    return handle


def hanging(*, models: bool):
    async def handle(request):
        if models and request.path.endswith("/models"):
            return json_response({"object": "list", "data": [{"id": "judge"}]})
        await asyncio.Event().wait()

    return handle


def run_eval(urls: list[str], data_dir: Path, work: Path) -> tuple[float, str, str]:
    """Wall seconds of one `harness eval` over `urls`, and its stdout and stderr."""
    work.mkdir(parents=True)
    endpoints = work / "endpoints.yaml"
    endpoints.write_text(json.dumps({"models": {"vllm:judge": {"base_url": urls, "served": "judge"}}}))
    command = [sys.executable, "-m", "harness", "eval", "-e", "pairwise-judge:model=vllm:judge", "-b",
               "ultrafeedback", "--limit", "10", "--data-dir", str(data_dir), "--endpoints", str(endpoints),
               "--out", str(work / "run")]
    env = {**os.environ, "HARNESS_CALL_CACHE": str(work / "calls.sqlite")}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"harness eval exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds, done.stdout, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = Path(__file__).resolve().parents[3] / "shared" / "data"
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("HARNESS_TEST_DATA", default_data)))
    parser.add_argument("--latency-s", type=float, default=0.1)
    args = parser.parse_args()
    timeout = BackendOptions().timeout
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(healthy(args.latency_s)) as good, \
            serve_in_thread(hanging(models=False)) as silent, serve_in_thread(hanging(models=True)) as stuck:
        alone, _, _ = run_eval([good], args.data_dir, Path(tmp) / "alone")
        bound = 2 * alone + timeout
        print(f"healthy replica alone: {alone:.1f} s; bound for a run with a hanging replica: 2 x {alone:.1f} + "
              f"{timeout:g} (the default timeout) = {bound:.1f} s")
        for case, url in (("silent", silent), ("chat-hangs", stuck)):
            seconds, out, err = run_eval([good, url], args.data_dir, Path(tmp) / case)
            lines = out.splitlines()
            counts = lines[lines.index("replicas:") + 1].strip() if "replicas:" in lines else ""
            told = [line for line in err.splitlines() if "replica" in line]
            print(f"{case}: {seconds:.1f} s ({'within' if seconds < bound else 'OVER'} the bound); {counts}")
            for line in told:
                print(f"  stderr: {line}")


if __name__ == "__main__":
    main()
