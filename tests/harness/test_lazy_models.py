"""A run the call cache answers entirely loads no model: no weights, no torch, no transformers (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tiny_models import build_tiny_lm  # noqa: E402

WATCH = (
    "import json, sys\n"
    "from harness.commands.cli import main\n"
    "sys.argv = ['harness', *sys.argv[1:]]\n"
    "try:\n"
    "    main()\n"
    "    code = 0\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "heavy = {m: m in sys.modules for m in ('torch', 'transformers')}\n"
    "print('MODULES ' + json.dumps(heavy), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def harness_watched(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict[str, bool]]:
    proc = subprocess.run([sys.executable, "-c", WATCH, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return proc, json.loads(line.removeprefix("MODULES "))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny") / "model", context=16384)  # room for a judge prompt


def test_a_fully_cached_generate_imports_no_torch(tiny: Path, tmp_path: Path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Hello"}\n{"id": "b", "prompt": "Yes or No?"}\n')
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    args = ["generate", "--model", f"hf:{tiny}", "--prompts", str(prompts), "--max-tokens", "8"]
    cold, cold_modules = harness_watched(*args, "--out", str(tmp_path / "cold.jsonl"), env=env)
    assert cold.returncode == 0, cold.stderr
    assert cold_modules["torch"] and "backend calls: 2, cache hits: 0" in cold.stdout
    warm, warm_modules = harness_watched(*args, "--out", str(tmp_path / "warm.jsonl"), env=env)
    assert warm.returncode == 0, warm.stderr
    assert "backend calls: 0, cache hits: 2" in warm.stdout
    assert warm_modules == {"torch": False, "transformers": False}
    texts = [json.loads(x)["text"] for x in (tmp_path / "cold.jsonl").read_text().splitlines()]
    assert [json.loads(x)["text"] for x in (tmp_path / "warm.jsonl").read_text().splitlines()] == texts


def test_a_fully_cached_eval_imports_no_torch(tiny: Path, tmp_path: Path, shared_data: Path):
    env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
    args = ["eval", "-e", f"pairwise-judge:model=hf:{tiny},max_tokens=8", "-b", "ultrafeedback", "--limit", "2",
            "--data-dir", str(shared_data)]
    cold, cold_modules = harness_watched(*args, "--out", str(tmp_path / "cold"), env=env)
    assert cold.returncode in (0, 1), cold.stderr  # a random model's verdicts rarely parse: recorded, counted
    assert cold_modules["torch"]
    warm, warm_modules = harness_watched(*args, "--out", str(tmp_path / "warm"), env=env)
    assert warm.returncode == cold.returncode, warm.stderr
    assert "backend calls: 0" in warm.stdout and warm_modules == {"torch": False, "transformers": False}
    results = [json.loads((tmp_path / d / "results.json").read_text())["results"] for d in ("cold", "warm")]
    assert results[0] == results[1]


def test_bench_cache_prints_the_warm_cold_ratio(tiny: Path, tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "harness", "bench", "cache", "--model", f"hf:{tiny}",
                           "--max-tokens", "4"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "torch imported: True" in lines[1] and "backend calls: 2, cache hits: 0" in lines[1]
    assert "torch imported: False" in lines[2] and "backend calls: 0, cache hits: 2" in lines[2]
    ratio = float(lines[3].rsplit(" ", 1)[1])
    assert 0 < ratio < 1
