"""`harness bench cache`: what a fully cached rerun costs next to the cold run, as a user runs both.

Runs `harness generate` twice in fresh processes with a private call cache: cold (every call misses) into one
output, then warm (the same settings, every call a hit) into another. Each process is timed from start to exit,
interpreter start and imports included, and reports whether it imported torch; the warm run should load no model
at all (`harness.cache.CachedBackend` probes a backend only before its first miss).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

_QUESTIONS = ("What is the capital of France?", "Name a prime number.", "What colour is the sky?",
              "Say hello in Spanish.", "How many legs has a spider?", "What is 2 + 2?")

_WATCHED = (
    "import sys\n"
    "from harness.commands.cli import main\n"
    "sys.argv = ['harness', *sys.argv[1:]]\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print('TORCH_IMPORTED=' + str('torch' in sys.modules), file=sys.stderr)\n"
)


@dataclass(frozen=True, slots=True)
class Timed:
    seconds: float
    torch_imported: bool
    summary: str


def _generate(args: list[str], env: dict[str, str]) -> Timed:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WATCHED, *args], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-2:]
        raise HarnessError(f"bench cache: `harness {' '.join(args[:3])} ...` failed: {' '.join(last)}")
    torch = "TORCH_IMPORTED=True" in proc.stderr
    return Timed(seconds, torch, proc.stdout.strip().splitlines()[-1])


def run_bench_cache(model: str, *, prompts: int, max_tokens: int) -> tuple[Timed, Timed]:
    """(cold, warm) runs of `harness generate` over `prompts` short questions."""
    with tempfile.TemporaryDirectory(prefix="harness-bench-cache-") as tmp:
        folder = Path(tmp)
        source = folder / "prompts.jsonl"
        source.write_text("".join(
            json.dumps({"id": f"q{i}", "prompt": _QUESTIONS[i % len(_QUESTIONS)] + f" ({i})"}) + "\n"
            for i in range(prompts)
        ))
        env = {**os.environ, "HARNESS_CALL_CACHE": str(folder / "calls.sqlite")}
        common = ["generate", "--model", model, "--prompts", str(source), "--max-tokens", str(max_tokens)]
        cold = _generate([*common, "--out", str(folder / "cold.jsonl")], env)
        warm = _generate([*common, "--out", str(folder / "warm.jsonl")], env)
    return cold, warm


def format_bench_cache(cold: Timed, warm: Timed, *, model: str, prompts: int) -> str:
    return "\n".join([
        f"cache bench: harness generate --model {model}, {prompts} prompts, two fresh processes",
        f"cold  {cold.seconds:7.2f} s  torch imported: {cold.torch_imported}  ({cold.summary})",
        f"warm  {warm.seconds:7.2f} s  torch imported: {warm.torch_imported}  ({warm.summary})",
        f"warm/cold wall time: {warm.seconds / cold.seconds:.3f}",
    ])
