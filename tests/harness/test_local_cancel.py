"""Stopping local model work nobody waits for: a cancelled call stops `hf`'s generation after the decode step it
is in and `vllm`'s engine requests after the engine step, raises instead of returning truncated text, and caches
nothing; Ctrl-C and SIGTERM end a command at once, keeping what was finished.

The model is the tests' tiny random Llama with the end-of-sequence row of its output layer zeroed, so it never
stops on its own (its other logits are well spread around zero, so one of them always beats 0): a generation runs
its whole budget unless it is stopped. Every wait is on an event or a file; the steps taken after a cancel are
counted, not timed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from tiny_models import build_tiny_lm  # noqa: E402
from waits import HANG_GUARD_S, wait_until  # noqa: E402

from harness.backends.base import BackendOptions, GenerateRequest, SamplingParams, user_chat  # noqa: E402
from harness.backends.local import Cancelled  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

CONTEXT = 4096
BUDGET = 3000
"""New tokens a long request asks for (and must produce: `min_tokens`)."""


def build_endless_lm(path: Path) -> Path:
    """`build_tiny_lm` with a context of `CONTEXT` whose end-of-sequence token never wins."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_lm(path, context=CONTEXT)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 0.0
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def endless_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_endless_lm(tmp_path_factory.mktemp("endless") / "model")


def long_request(text: str = "Hello") -> GenerateRequest:
    return GenerateRequest(user_chat(text), SamplingParams(max_tokens=BUDGET, min_tokens=BUDGET))


class Steps:
    """Counts the model's forward passes (one per decode step) and holds the first one until `go` is set, so a
    test acts while generation is known to be under way; `returned` is set when the backend's decode of a batch
    returns or raises."""

    def __init__(self, backend) -> None:
        self.count = 0
        self.first, self.go, self.returned = threading.Event(), threading.Event(), threading.Event()
        backend.load()
        backend._lm.register_forward_hook(self._step)
        real = backend._generate_batch

        def generate(*args, **kwargs):
            try:
                return real(*args, **kwargs)
            finally:
                self.returned.set()

        backend._generate_batch = generate

    def _step(self, module, args, output) -> None:
        self.count += 1
        if self.count == 1:
            self.first.set()
            assert self.go.wait(HANG_GUARD_S), "the test never let generation go on"


def test_cancel_from_another_thread_stops_generation_after_the_step_in_flight(endless_dir: Path, tmp_path) -> None:
    from harness.backends.hf import HFBackend
    from harness.cache import CachedBackend, CallCache

    backend = HFBackend(str(endless_dir), BackendOptions(dtype="float32"))
    steps = Steps(backend)
    cache = CallCache(tmp_path / "calls.sqlite")
    cached = CachedBackend(backend, cache)

    def cancel_after_the_first_token() -> None:
        assert steps.first.wait(HANG_GUARD_S)
        backend.cancel()
        steps.go.set()

    canceller = threading.Thread(target=cancel_after_the_first_token)
    canceller.start()
    with pytest.raises(Cancelled, match="cancelled; nothing of it is kept"):
        asyncio.run(cached.generate([long_request()]))
    canceller.join()
    assert steps.returned.is_set() and steps.count == 1  # the step in flight, then the stop
    assert cache.stats().entries == 0  # a truncated text is never an answer

    steps.go.set()  # the backend works on after a cancel, and caches what it finishes
    [done] = asyncio.run(cached.generate([GenerateRequest(user_chat("Hello"), SamplingParams(max_tokens=4))]))
    assert done.ok and done.usage.completion_tokens == 4 and cache.stats().entries == 1
    asyncio.run(cached.close())


def test_cancelling_the_waiting_task_stops_generation_as_ctrl_c_does(endless_dir: Path, tmp_path) -> None:
    """The run's units await merged calls; cancelling them (what Ctrl-C does) stops the shared generation."""
    from harness.backends.hf import HFBackend
    from harness.cache import CachedBackend, CallCache

    backend = HFBackend(str(endless_dir), BackendOptions(dtype="float32"))
    steps = Steps(backend)
    cache = CallCache(tmp_path / "calls.sqlite")
    cached = CachedBackend(backend, cache)

    async def scenario() -> None:
        units = [asyncio.ensure_future(cached.generate([long_request(text)])) for text in ("Hello", "one two")]
        await asyncio.to_thread(steps.first.wait, HANG_GUARD_S)
        for unit in units:
            unit.cancel()
        for unit in units:
            with pytest.raises(asyncio.CancelledError):
                await unit
        steps.go.set()  # every caller is gone: the generation must stop at the end of this step
        assert await asyncio.to_thread(steps.returned.wait, HANG_GUARD_S)

    asyncio.run(scenario())
    assert steps.count == 1
    assert cache.stats().entries == 0
    asyncio.run(cached.close())


def test_closing_stops_the_generation_it_would_otherwise_wait_for(endless_dir: Path) -> None:
    from harness.backends.hf import HFBackend

    backend = HFBackend(str(endless_dir), BackendOptions(dtype="float32"))
    steps = Steps(backend)
    real_cancel, cancelled = backend.cancel, threading.Event()

    def cancel() -> None:
        real_cancel()
        cancelled.set()

    backend.cancel = cancel

    async def scenario() -> None:
        call = asyncio.ensure_future(backend.generate([long_request()]))
        await asyncio.to_thread(steps.first.wait, HANG_GUARD_S)
        closing = asyncio.ensure_future(backend.close())
        assert await asyncio.to_thread(cancelled.wait, HANG_GUARD_S)  # close asks the work to stop first
        steps.go.set()
        await closing
        with pytest.raises(Cancelled):
            await call

    asyncio.run(scenario())
    assert steps.count == 1 and not backend.resident


@pytest.mark.parametrize("op", ["generate", "next_token_logprobs"])
def test_a_cancel_during_a_forward_pass_stops_it_before_the_next_layer(endless_dir: Path, op: str) -> None:
    """A long prompt's prefill is one decode step; the stop is also checked before every decoder layer."""
    from harness.backends.base import LogprobRequest
    from harness.backends.hf import HFBackend, decoder_layers

    backend = HFBackend(str(endless_dir), BackendOptions(dtype="float32"))
    backend.load()
    first, second = decoder_layers(backend._lm)
    ran, reached, go = [], threading.Event(), threading.Event()

    def hold(module, args, output) -> None:
        ran.append(module)
        if len(ran) == 1:
            reached.set()
            assert go.wait(HANG_GUARD_S), "the test never let the pass go on"

    first.register_forward_hook(hold)
    second.register_forward_hook(lambda module, args, output: ran.append(module))

    def cancel_inside_the_first_layer() -> None:
        assert reached.wait(HANG_GUARD_S)
        backend.cancel()
        go.set()

    canceller = threading.Thread(target=cancel_inside_the_first_layer)
    canceller.start()
    call = (backend.generate([long_request()]) if op == "generate"
            else backend.next_token_logprobs([LogprobRequest(user_chat("Hello"))], ["Yes"]))
    with pytest.raises(Cancelled):
        asyncio.run(call)
    canceller.join()
    assert ran == [first]  # the pass stopped before its second layer
    asyncio.run(backend.close())


# ------------------------------------------------------------------------------------------------------------
# vLLM: the backend steps the engine and aborts


class FakeEngine:
    """`LLM.enqueue` plus `llm_engine` as vLLM 0.32 has them; each request finishes after `length` steps."""

    def __init__(self, length: int) -> None:
        self.length, self.steps, self.aborted, self.waiting = length, 0, [], {}
        self.llm_engine = types.SimpleNamespace(
            has_unfinished_requests=lambda: bool(self.waiting), step=self.step, abort_request=self.abort
        )

    def enqueue(self, prompts, params, use_tqdm):
        ids = [str(9 - i) for i in range(len(prompts))]  # finished in the reverse order of their ids
        self.waiting = dict.fromkeys(ids, self.length)
        return [f"{i}-internal" for i in ids]

    def step(self):
        self.steps += 1
        out = []
        for rid in list(self.waiting):
            self.waiting[rid] -= 1
            out.append(types.SimpleNamespace(request_id=rid, finished=self.waiting[rid] == 0))
            if self.waiting[rid] == 0:
                del self.waiting[rid]
        return out

    def abort(self, ids, internal=False):
        self.aborted.append((ids, internal))
        self.waiting.clear()


def test_step_engine_returns_finished_outputs_in_request_order() -> None:
    from harness.backends.vllm_backend import step_engine

    engine = FakeEngine(length=3)
    outs = step_engine(engine, [{"prompt_token_ids": [1]}] * 3, [None] * 3, stop=lambda: None)
    assert [o.request_id for o in outs] == ["7", "8", "9"] and engine.steps == 3 and not engine.aborted


def test_step_engine_aborts_the_requests_when_stopped() -> None:
    from harness.backends.vllm_backend import step_engine

    engine = FakeEngine(length=1000)
    stop = threading.Event()

    def check() -> None:
        if engine.steps == 2:
            stop.set()
        if stop.is_set():
            raise Cancelled("stopped")

    with pytest.raises(Cancelled):
        step_engine(engine, [{"prompt_token_ids": [1]}] * 2, [None] * 2, stop=check)
    assert engine.steps == 2
    assert engine.aborted == [(["9-internal", "8-internal"], True)]  # enqueue's internal ids, as vLLM aborts them


def test_step_engine_takes_no_sample_the_engine_aborted_for_an_answer() -> None:
    """A terminal's Ctrl-C reaches vLLM's engine processes too: the engine core then ends every request as aborted
    (vllm/v1/engine/core.py:1626-1652), which must not come back as finished samples."""
    from harness.backends.vllm_backend import step_engine

    engine = FakeEngine(length=1000)

    def shutting_down():
        engine.steps += 1
        ended, engine.waiting = list(engine.waiting), {}
        return [types.SimpleNamespace(request_id=rid, finished=True,
                                      outputs=[types.SimpleNamespace(finish_reason="abort")]) for rid in ended]

    engine.llm_engine.step = shutting_down
    with pytest.raises(RuntimeError, match="ended 2 of 2 requests without their answer"):
        step_engine(engine, [{"prompt_token_ids": [1]}] * 2, [None] * 2, stop=lambda: None)
    assert engine.aborted == [(["9-internal", "8-internal"], True)]


class BlockedEngine:
    """`LLM` over vLLM 0.32's `SyncMPClient`, whose step waits on `outputs_queue` for the engine core's output
    (vllm/v1/engine/core_client.py:986); this engine core never answers (a long prefill on a CPU), and
    `shutdown(timeout)` is recorded."""

    def __init__(self) -> None:
        import queue

        self.outputs_queue, self.shutdowns, self.aborted = queue.Queue(), [], []
        self.waiting = threading.Event()
        core = types.SimpleNamespace(outputs_queue=self.outputs_queue, shutdown=self.shutdown)
        self.llm_engine = types.SimpleNamespace(
            engine_core=core, has_unfinished_requests=lambda: True, step=self.step,
            abort_request=lambda ids, internal=False: self.aborted.append(ids),
        )

    def enqueue(self, prompts, params, use_tqdm):
        return ["0-internal"]

    def step(self):
        self.waiting.set()
        out = self.outputs_queue.get()
        if isinstance(out, Exception):
            raise out
        return out

    def shutdown(self, timeout: float | None = None) -> None:
        self.shutdowns.append(timeout)


def test_closing_after_ctrl_c_kills_the_vllm_engine_instead_of_waiting_for_its_step(
    endless_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the process is stopping, closing does not wait for the engine step in flight (it holds the backend's
    lock, and a prefill on a CPU takes seconds): the engine is killed without a grace, the step wakes, its
    requests are aborted, the work raises `Cancelled` and the backend lets the engine go."""
    from harness import errors
    from harness.backends.vllm_backend import VLLMBackend

    monkeypatch.setattr(errors, "_stop", threading.Event())
    backend = VLLMBackend(str(endless_dir), BackendOptions(dtype="float32"))
    backend._llm = engine = BlockedEngine()
    raised: list[BaseException] = []

    def work() -> None:
        try:
            backend._run([[1, 2, 3]], [None], stop=threading.Event())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            raised.append(exc)

    stepping = threading.Thread(target=work, daemon=True)
    stepping.start()
    assert engine.waiting.wait(HANG_GUARD_S)
    errors.request_stop()  # what the first Ctrl-C does
    closing = threading.Thread(target=backend._free, kwargs={"closing": True}, daemon=True)
    closing.start()
    closing.join(HANG_GUARD_S)
    stepping.join(HANG_GUARD_S)
    assert not closing.is_alive() and not stepping.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], Cancelled), raised
    assert engine.shutdowns and set(engine.shutdowns) == {0.0}  # killed at once: no grace
    assert engine.aborted == [["0-internal"]] and not backend.resident


# ------------------------------------------------------------------------------------------------------------
# The command line: a signal during local generation


LONG_PROMPT = " ".join(["one two three four five six seven eight nine ten"] * 222)
"""With the pairwise judge's template, this leaves a few dozen tokens of the context for the answer."""


def _write_sets(path: Path) -> Path:
    """Set `a` fills the model's context, so its generation is short and it finishes first; set `b` leaves
    thousands of tokens to generate."""
    rows = [{"id": "a", "prompt": LONG_PROMPT, "responses": ["Yes.", "No."]},
            {"id": "b", "prompt": "Hello", "responses": ["Yes.", "No."]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GATED = """
import pathlib, time
from harness.backends import hf
first, go = pathlib.Path({first!r}), pathlib.Path({go!r})
load = hf.HFBackend._load
def gated_load(self):
    load(self)
    model, generate, state = self._lm, self._generate_batch, {{"long": False, "steps": 0}}
    def watched(batch, stop):
        state["long"], state["steps"] = max(r.max_new for r in batch) > 1000, 0
        return generate(batch, stop)
    def step(module, args, output):
        if state["long"]:
            state["steps"] += 1
            if state["steps"] == 1:
                first.write_text("first token")
                while not go.exists():  # the test creates it once the signal is handled
                    time.sleep(0.01)
    self._generate_batch = watched
    model.register_forward_hook(step)
hf.HFBackend._load = gated_load
"""
"""Holds the long generation after its first token (the file `first` says so) until the file `go` appears."""


def _score(endless_dir: Path, tmp_path: Path, *, prelude: str = "") -> tuple[subprocess.Popen, Path, Path]:
    """Start `harness --debug score` of the two sets, one at a time, in a process of its own, `prelude` run first
    (the debug log says how far a stopped generation got)."""
    args = ["--debug", "score", "--evaluator", f"pairwise-judge:model=hf:{endless_dir},max_tokens=100000",
            "--input", str(_write_sets(tmp_path / "sets.jsonl")), "--out", str(tmp_path / "out.jsonl"),
            "--parallel", "1", "--dtype", "float32"]
    code = f"{prelude}\nimport sys\nfrom harness.commands.cli import main\nsys.argv = ['harness', *{args!r}]\nmain()\n"
    err = tmp_path / "stderr.txt"
    with err.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=fh,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
                                preexec_fn=_default_sigint)
    return proc, err, tmp_path / "out.jsonl"


def _default_sigint() -> None:
    # As from a terminal: a test run started in the background hands its children SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ids(out: Path) -> list[str]:
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


def _status(tmp_path: Path) -> str | None:
    try:
        return json.loads((tmp_path / "out.jsonl.manifest.json").read_text()).get("status")
    except (OSError, ValueError):  # not written yet, or being replaced
        return None


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_local_generation_stops_it_and_keeps_finished_sets(
    endless_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """The signal comes while set b's generation is held after its first token; once the command has marked
    its output interrupted, the generation may go on: it must stop there, not run its thousands of tokens."""
    first, go = tmp_path / "first", tmp_path / "go"
    proc, err, out = _score(endless_dir, tmp_path, prelude=GATED.format(first=str(first), go=str(go)))
    try:
        wait_until("set b's first token", first.exists, (proc, err))
        assert _ids(out) == ["a"]  # set a finished first
        proc.send_signal(sig)
        wait_until("the output marked interrupted", lambda: _status(tmp_path) == "interrupted", (proc, err))
        go.write_text("go")
        proc.wait(HANG_GUARD_S)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted: 1 of 2 sets are saved in" in text and "rerun the same command to resume" in text
    [(steps, budget)] = re.findall(r"generation stopped after (\d+) of up to (\d+) new tokens", text)
    assert int(steps) == 1 and int(budget) > 1000  # the step in flight, not the budget
    assert _ids(out) == ["a"]


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_while_the_backends_close(endless_dir: Path, tmp_path: Path) -> None:
    """A backend that never finishes closing (here: freeing the model blocks for ever) cannot hold the command:
    the second Ctrl-C prints the `interrupted:` line and exits. (The held generation goes on once the first is
    handled: the model's free runs on the same compute thread, after it.)"""
    first, closing, go = tmp_path / "first", tmp_path / "closing", tmp_path / "go"
    prelude = GATED.format(first=str(first), go=str(go)) + (
        "import threading\n"
        "def stuck(self, *, closing):\n"
        f"    pathlib.Path({str(closing)!r}).write_text('closing')\n"
        "    threading.Event().wait()\n"
        "hf.HFBackend._free = stuck\n"
    )
    proc, err, out = _score(endless_dir, tmp_path, prelude=prelude)
    try:
        wait_until("set b's first token", first.exists, (proc, err))
        proc.send_signal(signal.SIGINT)
        wait_until("the output marked interrupted", lambda: _status(tmp_path) == "interrupted", (proc, err))
        go.write_text("go")
        wait_until("the backends to start closing", closing.exists, (proc, err))
        proc.send_signal(signal.SIGINT)
        proc.wait(HANG_GUARD_S)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted: 1 of 2 sets are saved in" in text
    assert _ids(out) == ["a"]
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["status"] == "interrupted"
