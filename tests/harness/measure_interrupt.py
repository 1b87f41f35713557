"""Seconds from a Ctrl-C to the command's exit, on the `hf` and `vllm` backends: a generation and a judge run.

Not a test (pytest does not collect it): a measurement, run by hand, in the environment of the backend measured
(vLLM in its own, `make install-vllm`):

    HF_HUB_OFFLINE=1 .venv/bin/python tests/harness/measure_interrupt.py --backend hf --data-dir ../shared/data
    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python tests/harness/measure_interrupt.py \\
        --backend vllm --data-dir ../shared/data

Each case runs the command on the embedded SmolLM2-135M-Instruct (`smollm2-135m`; vLLM eager), call cache off,
in a session of its own, and sends SIGINT once the model has taken `--at-step` decode steps (a forward pass of
`hf`, an engine step of `vllm`) since the command started; `--group` sends it to the command's process group, as
a terminal's Ctrl-C does (vLLM's engine processes get it too). The time is from the signal to the exit of the
command's process; the exit code must be 130 and the `interrupted:` line printed, else the case fails.
The cases:
- `generate`: `harness generate` of one prompt with a 2000-token budget;
- `judge`: `harness eval -e dynamic-rubric:generator=KIND:smollm2-135m -b judgebench --limit 2` (the rubric
  generation and the per-item verification of two sets; the same model generates and verifies).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELUDE = """
import os, pathlib
ready, at = pathlib.Path({ready!r}), {at}
steps = [0]
def count():
    steps[0] += 1
    if steps[0] == at:
        ready.write_text("stepping")
if {backend!r} == "hf":
    from harness.backends import hf
    load = hf.HFBackend._load
    def counted_load(self):
        load(self)
        self._lm.register_forward_hook(lambda module, args, output: count())
    hf.HFBackend._load = counted_load
else:
    from harness.backends import vllm_backend
    step_engine = vllm_backend.step_engine
    def counted(llm, prompts, params, *, stop):
        engine = llm.llm_engine
        if not getattr(engine, "counted", False):
            step = engine.step
            def counted_step():
                count()
                return step()
            engine.step, engine.counted = counted_step, True
        return step_engine(llm, prompts, params, stop=stop)
    vllm_backend.step_engine = counted
"""


def command(case: str, backend: str, work: Path, data_dir: Path | None) -> list[str]:
    model = f"{backend}:smollm2-135m"
    extra = ["--no-cache"] + (["--enforce-eager"] if backend == "vllm" else [])
    if case == "generate":
        prompts = work / "prompts.jsonl"
        prompts.write_text(json.dumps({"id": "p", "prompt": "Count from 1 to 1000, one number per line."}) + "\n")
        return ["generate", "--model", model, "--prompts", str(prompts), "--max-tokens", "2000",
                "--out", str(work / "out.jsonl"), *extra]
    data = ["--data-dir", str(data_dir)] if data_dir else []
    return ["eval", "-e", f"dynamic-rubric:generator={model}", "-b", "judgebench", "--limit", "2", *data,
            "--out", str(work / "run"), *extra]


def measure(case: str, backend: str, *, at_step: int, group: bool, data_dir: Path | None) -> float:
    """Seconds from SIGINT to exit of one run of `case`."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ready = work / "ready"
        args = command(case, backend, work, data_dir)
        code = (PRELUDE.format(ready=str(ready), at=at_step, backend=backend)
                + f"\nimport sys\nfrom harness.commands.cli import main\nsys.argv = ['harness', *{args!r}]\nmain()\n")
        err = work / "stderr.txt"
        with err.open("w") as fh:
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=fh,
                                    start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            while not ready.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"{case} on {backend} exited with {proc.returncode} before step {at_step}:\n"
                                     + err.read_text()[-3000:])
                time.sleep(0.01)  # polling a file the command writes; the signal's time is taken after
            sent = time.monotonic()
            if group:
                os.killpg(proc.pid, signal.SIGINT)
            else:
                proc.send_signal(signal.SIGINT)
            proc.wait()
            seconds = time.monotonic() - sent
        finally:
            proc.kill()
        text = err.read_text()
        if proc.returncode != 130 or "interrupted:" not in text:
            raise SystemExit(f"{case} on {backend}: exit code {proc.returncode}, stderr:\n{text[-3000:]}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["hf", "vllm"], required=True)
    parser.add_argument("--case", choices=["generate", "judge"], action="append",
                        help="A case to measure (repeatable; default both).")
    parser.add_argument("--data-dir", type=Path, help="JudgeBench's files (else from the Hub).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--at-step", type=int, default=20, help="Decode steps before the signal (1: during the "
                        "first prefill).")
    parser.add_argument("--group", action="store_true", help="Signal the process group, as a terminal does.")
    args = parser.parse_args()
    for case in args.case or ["generate", "judge"]:
        times = [measure(case, args.backend, at_step=args.at_step, group=args.group, data_dir=args.data_dir)
                 for _ in range(args.repeats)]
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(f"{args.backend} {case} (SIGINT at step {args.at_step}{', to the group' if args.group else ''}): "
              f"{min(times):.2f}-{max(times):.2f} s ({shown})", flush=True)


if __name__ == "__main__":
    main()
