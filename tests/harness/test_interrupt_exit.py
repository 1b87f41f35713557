"""How an interrupted command ends: one `interrupted:` line and exit code 130 wherever the signal lands (before
the loop, in it, after it), no wait for a local engine's step in flight or its graceful shutdown, no interpreter
teardown, and no child process left behind.

The loop's own handling (a signal while a local model generates) is tested in `test_local_cancel.py`. Here the
command runs in a process of its own with a prelude that writes a file when it reaches the moment a test wants
and, where a test needs it, holds there; every wait is on such a file or on the process, never on the clock.
The `vllm` tests run vLLM's real engine (`make test-vllm`); the others need no vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU build otherwise claims most of the RAM

from tiny_models import build_tiny_lm  # noqa: E402
from waits import HANG_GUARD_S, wait_until  # noqa: E402

from harness.errors import NOTHING_STARTED  # noqa: E402

GONE_S = 120.0
"""A guard on processes that were sent SIGKILL disappearing (they do within milliseconds on an idle machine)."""


def _default_signals() -> None:
    # As from a terminal: a test run started in the background hands its children SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _harness(args: list[str], tmp_path: Path, *, prelude: str = "", env: dict[str, str] | None = None,
             session: bool = False) -> tuple[subprocess.Popen, Path]:
    """Start `harness ARGS` in a process of its own, `prelude` run first; stdout is dropped, stderr kept in a file.
    `session`: in a session (and process group) of its own, so a test can signal the group as a terminal does."""
    code = f"{prelude}\nimport sys\nfrom harness.commands.cli import main\nsys.argv = ['harness', *{args!r}]\nmain()\n"
    err = tmp_path / "stderr.txt"
    with err.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=fh,
                                env={**os.environ, **(env or {})}, preexec_fn=_default_signals,
                                start_new_session=session)
    return proc, err


def _finish(proc: subprocess.Popen, err: Path) -> str:
    try:
        proc.wait(HANG_GUARD_S)
    finally:
        proc.kill()
    return err.read_text()


def _interrupted_line(text: str) -> str:
    """The one `interrupted:` line of a command's stderr ("" when there is none; a second one fails the test).

    With vLLM, multiprocessing's resource tracker (a process of its own) may warn after it, as it removes the
    shared memory of the engine processes the command killed."""
    found = [line for line in text.splitlines() if line.startswith("interrupted")]
    assert len(found) <= 1, found
    return found[0] if found else ""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _status(manifest: Path) -> str | None:
    try:
        return json.loads(manifest.read_text()).get("status")
    except (OSError, ValueError):  # not written yet
        return None


# ------------------------------------------------------------------------------------------------------------
# Outside the loop (the `hf` backend; any backend takes the same path)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny") / "model")


def _score_args(tiny_dir: Path, tmp_path: Path) -> tuple[list[str], Path]:
    sets = tmp_path / "sets.jsonl"
    sets.write_text(json.dumps({"id": "a", "prompt": "Hello", "responses": ["Yes.", "No."]}) + "\n")
    out = tmp_path / "out.jsonl"
    return ["score", "--evaluator", f"pairwise-judge:model=hf:{tiny_dir},max_tokens=4", "--input", str(sets),
            "--out", str(out), "--dtype", "float32"], out


HOLD_BEFORE_THE_LOOP = """
import pathlib, threading
from harness import pool
def preflight(self):
    pathlib.Path({gate!r}).write_text("models built")
    threading.Event().wait()
pool.BackendPool.preflight = preflight
"""
"""Holds the command where it checks its models, before the loop (and before any model loads)."""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_before_the_loop_says_nothing_was_started(tiny_dir: Path, tmp_path: Path,
                                                           sig: signal.Signals) -> None:
    gate = tmp_path / "gate"
    args, out = _score_args(tiny_dir, tmp_path)
    proc, err = _harness(args, tmp_path, prelude=HOLD_BEFORE_THE_LOOP.format(gate=str(gate)))
    try:
        wait_until("the models to be built", gate.exists, (proc, err))
        proc.send_signal(sig)
    finally:
        text = _finish(proc, err)
    assert proc.returncode == 130, text[-3000:]
    assert _interrupted_line(text) == NOTHING_STARTED and "Traceback" not in text
    assert _records(out) == []


HOLD_WHILE_CLOSING = """
import asyncio, pathlib, threading
from harness import pool
def close_for_ever(self):
    pathlib.Path({gate!r}).write_text("closing")
    async def hold():
        try:
            await {waiting}
        except BaseException:
            pathlib.Path({unwinding!r}).write_text("unwinding")
            raise
    return hold()
pool.BackendPool.close = close_for_ever
"""
"""Holds the command where its backends close, after the loop finished: in the event loop (`asyncio.Event`) or
in a worker thread it waits for (a model that never finishes freeing). The file `unwinding` says the first
signal got there."""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_backends_close_says_what_the_loop_saved(tiny_dir: Path, tmp_path: Path,
                                                                    sig: signal.Signals) -> None:
    gate, unwinding = tmp_path / "closing", tmp_path / "unwinding"
    args, out = _score_args(tiny_dir, tmp_path)
    prelude = HOLD_WHILE_CLOSING.format(gate=str(gate), unwinding=str(unwinding), waiting="asyncio.Event().wait()")
    proc, err = _harness(args, tmp_path, prelude=prelude)
    try:
        wait_until("the backends to close", gate.exists, (proc, err))
        proc.send_signal(sig)
    finally:
        text = _finish(proc, err)
    assert proc.returncode == 130, text[-3000:]
    assert _interrupted_line(text) == (f"interrupted: 1 of 1 sets are saved in {out} (1 by this session); rerun "
                                       "the same command to resume")
    assert unwinding.exists() and [r["id"] for r in _records(out)] == ["a"]
    # The loop had finished (a random model's verdicts do not parse: a failure it records, not an interrupt).
    assert _status(tmp_path / "out.jsonl.manifest.json") in ("finished", "finished_with_failures")


def test_a_second_signal_exits_while_a_backend_never_finishes_closing(tiny_dir: Path, tmp_path: Path) -> None:
    """The first Ctrl-C after the loop unwinds the command, which then waits for the thread that frees the model;
    the second exits at once with the line."""
    gate, unwinding = tmp_path / "closing", tmp_path / "unwinding"
    args, out = _score_args(tiny_dir, tmp_path)
    prelude = HOLD_WHILE_CLOSING.format(gate=str(gate), unwinding=str(unwinding),
                                        waiting="asyncio.to_thread(threading.Event().wait)")
    proc, err = _harness(args, tmp_path, prelude=prelude)
    try:
        wait_until("the backends to close", gate.exists, (proc, err))
        proc.send_signal(signal.SIGINT)
        wait_until("the first Ctrl-C to unwind the command", unwinding.exists, (proc, err))
        proc.send_signal(signal.SIGINT)
    finally:
        text = _finish(proc, err)
    assert proc.returncode == 130, text[-3000:]
    assert _interrupted_line(text).startswith(f"interrupted: 1 of 1 sets are saved in {out}")
    assert [r["id"] for r in _records(out)] == ["a"]


EXIT_NOW = """
import atexit, multiprocessing, pathlib, sys, time
from harness.errors import exit_interrupted

def grandchild():
    time.sleep(3600)

def child(pids):
    spawned = multiprocessing.get_context("fork").Process(target=grandchild)
    spawned.start()
    pids.put(spawned.pid)
    spawned.join()

if __name__ == "__main__":
    pids = multiprocessing.Queue()
    proc = multiprocessing.get_context("fork").Process(target=child, args=(pids,))
    proc.start()
    pathlib.Path({pids!r}).write_text(f"{{proc.pid}} {{pids.get()}}")
    atexit.register(lambda: pathlib.Path({teardown!r}).write_text("the interpreter tore itself down"))
    print("a line the command printed", flush=False)
    exit_interrupted("interrupted: 3 of 4 sets are saved in out.jsonl")
"""


def test_exit_interrupted_kills_child_processes_and_skips_the_teardown(tmp_path: Path) -> None:
    """What every interrupted command ends with: stdout flushed, the line, exit code 130, the children (with
    theirs) killed rather than orphaned, and none of the interpreter's slow way out (the atexit hooks)."""
    pids, teardown = tmp_path / "pids", tmp_path / "teardown"
    script = tmp_path / "exit_now.py"
    script.write_text(EXIT_NOW.format(pids=str(pids), teardown=str(teardown)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "a line the command printed\n"
    assert done.stderr.strip() == "interrupted: 3 of 4 sets are saved in out.jsonl"
    assert not teardown.exists()
    for pid in map(int, pids.read_text().split()):
        wait_until(f"process {pid} to be gone", lambda pid=pid: not _alive(pid), timeout=GONE_S)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it waits only to be reaped, by a parent that may be gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------------------------------------------------------------
# vLLM's engine: killed, not waited for


def _marked(mark: str) -> list[int]:
    """The pids of live processes whose environment holds `mark` (a command and every process it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.fixture(scope="module")
def endless_vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' tiny random Llama (head_dim 32, as vLLM's CPU attention needs) whose end-of-sequence token never
    wins, so a generation runs its whole budget unless it is stopped."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_lm(tmp_path_factory.mktemp("endless-vllm") / "model", head_dim=32, context=4096)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 0.0
    model.save_pretrained(path)
    return path


WATCH_THE_ENGINE = """
import atexit, functools, pathlib
from harness.backends import vllm_backend
files = {{name: pathlib.Path(path) for name, path in {files!r}.items()}}
atexit.register(lambda: files["teardown"].write_text("the interpreter tore itself down"))
step_engine = vllm_backend.step_engine
def watched(llm, prompts, params, *, stop):
    engine, core = llm.llm_engine, llm.llm_engine.engine_core
    if not files["stepping"].exists():
        shutdown, step = core.shutdown, engine.step
        @functools.wraps(shutdown)
        def recorded(*args, **kwargs):
            with files["shutdowns"].open("a") as fh:
                fh.write(f"{{kwargs.get('timeout')}}\\n")
            return shutdown(*args, **kwargs)
        def first_step():
            files["stepping"].write_text("stepping")
            return step()
        core.shutdown, engine.step = recorded, first_step
    return step_engine(llm, prompts, params, stop=stop)
vllm_backend.step_engine = watched
"""
"""Writes `stepping` when the engine takes its first step and records every engine shutdown's timeout in
`shutdowns`; an atexit hook writes `teardown` (the interpreter's way out, which an interrupted command skips)."""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("group", [False, True], ids=["SIGINT to the command", "Ctrl-C in a terminal"])
def test_ctrl_c_kills_the_vllm_engine_at_once_and_keeps_nothing_in_flight(endless_vllm_dir: Path, tmp_path: Path,
                                                                         group: bool) -> None:
    """A Ctrl-C while the engine generates: the engine is killed (shutdown timeout 0, no grace) instead of
    finishing its step and shutting down gracefully (5 s on 2 CPU cores), the command ends without the
    interpreter's teardown, nothing of the generation is recorded or cached, and no process of the command is
    left. In a terminal the engine's processes get the Ctrl-C too and abort their requests themselves: those
    aborted samples are not taken for answers either."""
    from harness.cache import CallCache

    files = {name: str(tmp_path / name) for name in ("stepping", "shutdowns", "teardown")}
    prompts, out, cache = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl", tmp_path / "calls.sqlite"
    prompts.write_text(json.dumps({"id": "p", "prompt": "Tell me everything."}) + "\n")
    mark = f"HARNESS_TEST_MARK={uuid.uuid4().hex}"
    args = ["generate", "--model", f"vllm:{endless_vllm_dir}", "--prompts", str(prompts), "--max-tokens", "3500",
            "--dtype", "float32", "--enforce-eager", "--out", str(out)]
    proc, err = _harness(args, tmp_path, prelude=WATCH_THE_ENGINE.format(files=files), session=group,
                         env={"HARNESS_CALL_CACHE": str(cache), mark.split("=")[0]: mark.split("=")[1]})
    try:
        wait_until("the engine's first step", Path(files["stepping"]).exists, (proc, err))
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
    finally:
        text = _finish(proc, err)
    assert proc.returncode == 130, text[-3000:]
    assert _interrupted_line(text).startswith(f"interrupted: 0 of 1 samples are saved in {out}")
    assert _records(out) == [] and _status(tmp_path / "out.jsonl.manifest.json") == "interrupted"
    assert CallCache(cache).stats().entries == 0
    assert Path(files["shutdowns"]).read_text().split()[0] == "0.0"  # killed, not given vLLM's grace
    assert not Path(files["teardown"]).exists()
    wait_until("no process of the command left", lambda: not _marked(mark), timeout=GONE_S)


HOLD_THE_ENGINE_START = """
import pathlib
from vllm.v1.engine import utils
start = utils.CoreEngineProcManager.__init__
def started(self, *args, **kwargs):
    start(self, *args, **kwargs)
    pathlib.Path({started!r}).write_text(" ".join(str(p.pid) for p in self.processes))
utils.CoreEngineProcManager.__init__ = started
"""
"""Writes `started` once vLLM has started its engine core process (it then waits for the engine to load)."""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_second_sigterm_while_the_engine_starts_leaves_no_engine_process(endless_vllm_dir: Path,
                                                                           tmp_path: Path) -> None:
    """The first SIGTERM cannot stop an engine that is loading (the command waits for the load to close it); the
    second ends the command at once, and the engine core it was starting goes with it, its workers too."""
    started = tmp_path / "started"
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text(json.dumps({"id": "p", "prompt": "Tell me everything."}) + "\n")
    mark = f"HARNESS_TEST_MARK={uuid.uuid4().hex}"
    args = ["generate", "--model", f"vllm:{endless_vllm_dir}", "--prompts", str(prompts), "--max-tokens", "8",
            "--dtype", "float32", "--enforce-eager", "--out", str(out)]
    proc, err = _harness(args, tmp_path, prelude=HOLD_THE_ENGINE_START.format(started=str(started)),
                         env={mark.split("=")[0]: mark.split("=")[1]})
    try:
        wait_until("the engine core process", started.exists, (proc, err))
        proc.send_signal(signal.SIGTERM)
        wait_until("the output marked interrupted",
                   lambda: _status(tmp_path / "out.jsonl.manifest.json") == "interrupted", (proc, err))
        proc.send_signal(signal.SIGTERM)
    finally:
        text = _finish(proc, err)
    assert proc.returncode == 130, text[-3000:]
    assert _interrupted_line(text).startswith(f"interrupted: 0 of 1 samples are saved in {out}")
    engine = [int(pid) for pid in started.read_text().split()]
    wait_until("the engine core to be gone", lambda: not any(map(_alive, engine)), timeout=GONE_S)
    wait_until("no process of the command left", lambda: not _marked(mark), timeout=GONE_S)
