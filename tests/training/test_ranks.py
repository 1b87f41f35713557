"""Training under `accelerate launch --num_processes 2` on the CPU (torchrun, gloo): the main process samples the
generator's sets once and the other rank reads them, each rank rewards its own groups, the manifest and the log are
written once, both ranks hold the same weights after the step, and an interrupted run resumes from TRL's checkpoint
to the same weights as an uninterrupted one."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(kind: str, config: Path, data: Path) -> subprocess.CompletedProcess:
    """`accelerate launch --num_processes 2 -m harness train KIND` (on a machine without GPUs accelerate's
    `--multi_gpu` starts the processes through torchrun; they train on the CPU with gloo)."""
    accelerate = Path(sys.executable).parent / "accelerate"
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_port()),
               "-m", "harness", "train", kind, "--config", str(config), "--data-dir", str(data)]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


def _why(done: subprocess.CompletedProcess) -> str:
    """A failed launch's `error:` lines (the main process's one-line errors), then the end of its stderr."""
    errors = [line for line in done.stderr.splitlines() if "error:" in line and "Error:" not in line]
    return "\n".join(errors[:5]) + "\n...\n" + done.stderr[-3000:]


def _config(path: Path, model: Path, out: Path, **changes) -> Path:
    config = {"model": f"hf:{model}", "output_dir": str(out), "verifier": f"hf:{model}", "verify_mode": "logprob",
              "grpo": {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 12,
                       "learning_rate": 1e-3, "max_steps": 1, "report_to": []}}
    for key, value in changes.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and key in config else value
    path.write_text(json.dumps(config))
    return path


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _trained_once(out: Path, steps: int) -> dict:
    """The manifest, checked: finished, written for 2 processes whose weights agree; one log line per step."""
    manifest = json.loads((out / "dr_manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["processes"]["count"] == 2
    first, second = manifest["processes"]["weights"]
    assert first == second, "the ranks hold different weights after the step"
    losses = [line["step"] for line in _log(out) if "loss" in line]
    assert losses == list(range(1, steps + 1))
    return manifest


def test_a_generator_step_on_two_processes_samples_the_sets_once(tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    out = tmp_path / "g"
    config = _config(tmp_path / "g.yaml", tiny_lm, out, data={
        "limit": 2, "generator_rules": {"max_prompt_chars": 300, "min_useful": 2},
        "sets": {"policy": f"hf:{tiny_lm}", "set_size": 2, "max_tokens": 8}},
        grpo={"max_completion_length": 44})  # the rubric grammar's smallest budget is 43 tokens
    done = launch("generator", config, nectar_dir)
    assert done.returncode == 0, _why(done)
    assert done.stdout.count("generator checkpoint:") == 1  # the main process reports
    manifest = _trained_once(out, steps=1)
    assert manifest["data"]["rows"] == 2
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["sets.jsonl", "train_log.jsonl"]
    records = [json.loads(line) for line in (out / "sets.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["sample"]) for r in records) == sorted(
        {(r["id"], s) for r in records for s in range(2)})  # each (row, sample) once: sampled by one process
    assert len(records) == 4
    assert len(list(out.glob("dr_manifest*.json"))) == 1


def test_a_policy_run_on_two_processes_resumes_to_the_same_weights(tmp_path: Path, tiny_lm: Path, nectar_dir: Path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    common = dict(generator=f"hf:{tiny_lm}", gen_max_tokens=96,
                  data={"limit": 4, "policy_rules": {"max_prompt_chars": 300}},
                  grpo={"max_steps": 2, "save_steps": 1})
    done = launch("policy", _config(tmp_path / "whole.yaml", tiny_lm, whole, **common), nectar_dir)
    assert done.returncode == 0, _why(done)
    uninterrupted = _trained_once(whole, steps=2)["processes"]["weights"]

    # The same run, interrupted after step 1: its step-2 checkpoint and final weights never written.
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoint-2")
    (cut / "model.safetensors").unlink()
    manifest = json.loads((cut / "dr_manifest.json").read_text())
    (cut / "dr_manifest.json").write_text(json.dumps({**manifest, "status": "interrupted", "reward_history": None}))
    lines = (cut / "train_log.jsonl").read_text().splitlines()
    (cut / "train_log.jsonl").write_text("\n".join(lines + ['{"step": 2, "loss": 99.0}']) + "\n")  # lost with it

    again = launch("policy", _config(tmp_path / "cut.yaml", tiny_lm, cut, **common), nectar_dir)
    assert again.returncode == 0, _why(again)
    resumed = _trained_once(cut, steps=2)
    assert resumed["processes"]["weights"] == uninterrupted
    assert len(resumed["reward_history"]) == 1  # only step 2 was trained again
    assert [line["loss"] for line in _log(cut) if "loss" in line][0] == [
        line["loss"] for line in _log(whole) if "loss" in line][0]  # step 1's line kept, the stale step 2 gone
    assert 99.0 not in [line.get("loss") for line in _log(cut)]
