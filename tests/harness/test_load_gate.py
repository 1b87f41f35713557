"""One model loads at a time (the process-wide load gate), a phase's engines start one by one before its units run,
and after a release the next phase waits until the freed memory is back (fake free-memory readings).

No test sleeps: threads are held on events, and `LoadGate.wait_until_waiting` says when a load is blocked at the
gate. The memory waits run on a fake clock and a fake sleep.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

from harness.backends.gate import GATE, Engines, LoadGate, MemoryNotBack, cuda_free_gib, load_gate, wait_for_memory
from harness.errors import HarnessError
from harness.loop import Unit, write_output
from harness.records import GenerationRecord
from harness.runstore import OutputPaths
from harness.schedule import Phase

BLOCKED = 30.0
"""Seconds a test waits for a thread to reach the gate before failing (a bound, never slept)."""


def _thread(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def _hold_then_load(gate, log: list[str], *, holder: str, other: str, load_other) -> None:
    """`holder` holds the gate until `other` is seen waiting at it; `load_other()` then loads `other` from another
    thread. Records what each did, in order."""
    inside, finish = threading.Event(), threading.Event()

    def first() -> None:
        with gate(holder):
            log.append(f"start {holder}")
            inside.set()
            finish.wait(BLOCKED)
            log.append(f"end {holder}")

    a = _thread(first)
    assert inside.wait(BLOCKED)
    b = _thread(load_other)
    blocked = GATE.wait_until_waiting(other, BLOCKED) if gate is load_gate else gate.wait_until_waiting(other, BLOCKED)
    finish.set()
    a.join(BLOCKED)
    b.join(BLOCKED)
    assert blocked, f"{other} did not wait for {holder} at the gate: {log}"


def test_two_loads_from_concurrent_threads_never_overlap():
    gate, log = LoadGate(), []

    def second() -> None:
        with gate("hf:b"):
            log.append("start hf:b")
            log.append("end hf:b")

    _hold_then_load(gate, log, holder="vllm:a", other="hf:b", load_other=second)
    assert log == ["start vllm:a", "end vllm:a", "start hf:b", "end hf:b"]
    assert gate.history == [("start", "vllm:a"), ("end", "vllm:a"), ("start", "hf:b"), ("end", "hf:b")]
    assert gate.holding is None and gate.waiting == ()


def test_the_same_thread_may_load_inside_a_load():
    gate = LoadGate()
    with gate("hf:outer"), gate("hf:inner"):
        assert gate.holding == "hf:outer"
    assert gate.history == [("start", "hf:outer"), ("end", "hf:outer")]


def test_an_hf_load_waits_for_any_other_local_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The hf backend's load holds the process-wide gate: it waits while a vLLM engine (any holder of
    `load_gate`) starts, and starts only when that one is ready."""
    from tiny_models import build_tiny_lm

    from harness.backends.hf import HFBackend

    path = build_tiny_lm(tmp_path / "m")
    log: list[str] = []

    def fake_load(self) -> None:
        log.append(f"start {self.kind}:{self.model}")
        self._lm = object()
        log.append(f"end {self.kind}:{self.model}")

    monkeypatch.setattr(HFBackend, "_load", fake_load)
    backend = HFBackend(str(path))
    spec = f"hf:{path}"
    _hold_then_load(load_gate, log, holder="vllm:engine", other=spec, load_other=backend.load)
    assert log == ["start vllm:engine", "end vllm:engine", f"start {spec}", f"end {spec}"]
    assert GATE.history[-4:] == [("start", "vllm:engine"), ("end", "vllm:engine"), ("start", spec), ("end", spec)]



def test_a_vllm_engine_start_waits_for_any_other_local_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The vllm backend holds the gate from its engine's constructor until the engine is ready (the first load and
    every restart go through `_start`); vLLM itself is not needed: the engine start is replaced."""
    from tiny_models import build_tiny_lm

    from harness.backends.vllm_backend import VLLMBackend

    path = build_tiny_lm(tmp_path / "m")
    log: list[str] = []

    def fake_engine(self) -> None:
        log.append(f"start {self.kind}:{self.model}")
        self._llm = object()
        log.append(f"end {self.kind}:{self.model}")

    monkeypatch.setattr(VLLMBackend, "_start_engine", fake_engine)
    backend = VLLMBackend(str(path))
    spec = f"vllm:{path}"
    _hold_then_load(load_gate, log, holder="hf:neighbour", other=spec, load_other=backend.load)
    assert log == ["start hf:neighbour", "end hf:neighbour", f"start {spec}", f"end {spec}"]
    assert GATE.history[-4:] == [("start", "hf:neighbour"), ("end", "hf:neighbour"), ("start", spec), ("end", spec)]

# ------------------------------------------------------------------------------------------------------------
# Waiting for memory (fake readings, fake clock)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1


def test_the_wait_passes_once_the_memory_is_back():
    clock, readings = FakeTime(), iter([{0: 30.0, 1: 80.0}, {0: 55.0, 1: 80.0}, {0: 70.0, 1: 80.0}])
    free = asyncio.run(wait_for_memory({0: 69.5}, what="releasing vllm:a", read_free=lambda: next(readings),
                                       timeout=60, poll=1.0, clock=clock.clock, sleep=clock.sleep))
    assert free == {0: 70.0, 1: 80.0} and clock.sleeps == 2


def test_the_wait_names_the_device_and_the_gib_missing():
    clock = FakeTime()
    with pytest.raises(MemoryNotBack) as caught:
        asyncio.run(wait_for_memory({0: 40.0, 1: 60.0}, what="releasing vllm:a", read_free=lambda: {0: 45.0, 1: 52.5},
                                    timeout=10, poll=1.0, clock=clock.clock, sleep=clock.sleep))
    message = str(caught.value)
    assert "10 s after releasing vllm:a" in message
    assert "cuda:1 has 52.50 GiB free of the 60.00 GiB expected (7.50 GiB missing)" in message
    assert "cuda:0" not in message  # that one came back
    assert isinstance(caught.value, HarnessError) and clock.sleeps == 10


def test_without_cuda_nothing_is_waited_for():
    clock = FakeTime()
    assert asyncio.run(wait_for_memory({0: 10.0}, what="x", read_free=dict, clock=clock.clock,
                                       sleep=clock.sleep)) == {}
    assert clock.sleeps == 0
    assert cuda_free_gib() == {}  # this machine: no CUDA


def test_free_memory_is_read_after_this_process_returns_its_cached_blocks(monkeypatch: pytest.MonkeyPatch):
    """A model loaded in this process draws on torch's cached blocks first: the reading must count them as taken
    (seen on an H200: 0.22 GiB read for 0.75 GiB of weights), so the cache goes back before each reading."""
    import types

    calls: list[str] = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 2,
        empty_cache=lambda: calls.append("empty_cache"),
        mem_get_info=lambda i: (calls.append(f"read {i}"), ((10 + i) * 2**30, 80 * 2**30))[1],
        memory_reserved=lambda i: (3 + i) * 2**30, memory_allocated=lambda i: 2 * 2**30)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert cuda_free_gib() == {0: 11.0, 1: 13.0}  # the device's free memory and this process's unused cache
    assert calls == ["empty_cache", "read 0", "read 1"]


def test_an_engine_is_charged_what_it_took_and_waited_for_after_its_release():
    """Engines measures each start (free before minus after) and, after a release, waits for that much back."""
    device = {"free": 80.0, "returning": 0.0, "reads": 0}

    def read() -> dict[int, float]:
        device["reads"] += 1
        if device["returning"]:  # a released engine's processes give memory back over a few readings
            step = min(10.0, device["returning"])
            device["free"] += step
            device["returning"] -= step
        return {0: device["free"]}

    def load() -> None:
        device["free"] -= 30.0

    async def release(keys: list[str]) -> None:
        device["returning"] += 30.0

    clock = FakeTime()
    engines = Engines(read_free=read, timeout=60, poll=1.0, clock=clock.clock, sleep=clock.sleep)
    asyncio.run(engines.start([("vllm:a", load)]))
    assert engines.held == {"vllm:a": {0: 30.0}} and engines.started == ["vllm:a"]
    asyncio.run(engines.release(["vllm:a"], release))
    assert device["free"] == 80.0 and clock.sleeps == 2 and engines.held == {}

    asyncio.run(engines.start([("vllm:a", load)]))

    async def never(keys: list[str]) -> None:
        pass  # the memory never comes back

    with pytest.raises(MemoryNotBack, match=r"cuda:0 has 50.00 GiB free of the 78.25 GiB expected"):
        asyncio.run(engines.release(["vllm:a"], never))


# ------------------------------------------------------------------------------------------------------------
# A run's phases: engines start one by one before the units, memory comes back before the next phase


class FakeEngine:
    """A local backend whose load holds the gate, and takes memory on a fake device."""

    kind = "vllm"

    def __init__(self, key: str, run: FakeRun) -> None:
        self.key, self.run, self.resident = key, run, False

    def load(self) -> None:
        with load_gate(self.key):
            self.run.active += 1
            self.run.most = max(self.run.most, self.run.active)
            self.run.log.append(f"load {self.key}")
            self.run.free -= 20.0
            self.resident = True
            self.run.active -= 1


class Wrapped:
    """What the pool hands out (`CachedBackend`): the backend, and whether it is resident."""

    def __init__(self, backend: FakeEngine) -> None:
        self.backend = backend

    @property
    def resident(self) -> bool:
        return self.backend.resident


class FakeRun:
    """A pool of fake engines on one fake device whose released memory comes back two readings later."""

    def __init__(self, keys: str) -> None:
        self.log: list[str] = []
        self.active = self.most = 0
        self.free, self.returning = 80.0, []
        self.engines = {k: Wrapped(FakeEngine(k, self)) for k in keys}

    def backend(self, key: str) -> Wrapped:
        return self.engines[key]

    async def release(self, keys) -> None:
        for key in keys:
            self.log.append(f"release {key}")
            self.engines[key].backend.resident = False
            self.returning.append(2)

    def read(self) -> dict[int, float]:
        if self.returning:
            self.returning = [n - 1 for n in self.returning]
            while 0 in self.returning:
                self.returning.remove(0)
                self.free += 20.0
                self.log.append("memory back")
        return {0: self.free}


def _run_phases(tmp_path: Path, run: FakeRun, phases: list[Phase], *, timeout: float = 60.0):
    from harness.commands.runner import Schedule, phase_hooks

    clock = FakeTime()
    engines = Engines(read_free=run.read, timeout=timeout, poll=1.0, clock=clock.clock, sleep=clock.sleep)
    before, after = phase_hooks(Schedule(phases, {}, {}), run, start=True, engines=engines)

    async def work(unit: tuple[str, int]) -> list[GenerationRecord]:
        name, phase = unit
        run.log.append(f"unit {phase}")
        return [GenerationRecord(id=name, sample=0, model="m", text="x")]

    units = [Unit(((f"{p}-{i}", 0),), (f"{p}-{i}", p), p) for p in range(len(phases)) for i in range(3)]
    return asyncio.run(write_output(
        OutputPaths.file(tmp_path / "o.jsonl"), GenerationRecord, command="generate", settings={}, config={},
        units=units, work=work, parallel=3, noun="samples", before_phase=before, after_phase=after,
    ))


def test_a_phases_engines_start_one_by_one_before_its_units(tmp_path: Path):
    run = FakeRun("abv")
    phases = [Phase(frozenset("av"), (frozenset("av"),), frozenset("a")),
              Phase(frozenset("bv"), (frozenset("bv"),), frozenset())]
    summary = _run_phases(tmp_path, run, phases)
    assert summary.complete == 6
    assert run.log == ["load a", "load v", "unit 0", "unit 0", "unit 0",
                       "release a", "memory back",  # the next phase waits for it
                       "load b", "unit 1", "unit 1", "unit 1"]  # v stays resident: not loaded again
    assert run.most == 1  # never two loads at once
    assert [h for h in GATE.history if h[1] in {"a", "b", "v"}][-6:] == [("start", "a"), ("end", "a"), ("start", "v"),
                                                               ("end", "v"), ("start", "b"), ("end", "b")]


def test_memory_that_never_comes_back_stops_the_run_before_the_next_phase(tmp_path: Path):
    run = FakeRun("ab")
    run.release = _release_without_memory(run)  # type: ignore[method-assign]
    phases = [Phase(frozenset("a"), (frozenset("a"),), frozenset("a")),
              Phase(frozenset("b"), (frozenset("b"),), frozenset())]
    with pytest.raises(MemoryNotBack, match=r"after releasing a: cuda:0 has 60.00 GiB free of the 78.75 GiB"):
        _run_phases(tmp_path, run, phases, timeout=5.0)
    assert "load b" not in run.log and "unit 1" not in run.log


def _release_without_memory(run: FakeRun):
    async def release(keys) -> None:
        for key in keys:
            run.log.append(f"release {key}")
            run.engines[key].backend.resident = False

    return release


def test_without_devices_nothing_starts_up_front(tmp_path: Path):
    """A run without devices (a CPU machine) loads each model on its first uncached request, as before."""
    from harness.commands.runner import Schedule, phase_hooks

    run = FakeRun("a")
    before, after = phase_hooks(Schedule([Phase(frozenset("a"), (frozenset("a"),), frozenset())], {}, {}), run,
                                start=False, engines=Engines(read_free=dict))
    asyncio.run(before(0))
    asyncio.run(after(0))
    assert run.log == []
