"""One local model loads at a time in this process, and a released model's memory is back before the next starts.

Why: vLLM sizes an engine's KV cache from the *device's* free memory, read before and after its own profiling run
(`vllm/v1/worker/utils.py:761-772`, `request_memory`: free memory at startup must cover the engine's share;
`vllm/v1/worker/gpu_worker.py:716-727`: an assertion that free memory did not *grow* meanwhile, "other processes
... release GPU memory while vLLM is profiling"). An engine that starts while a neighbour loads its weights
charges them to itself (its KV budget shrinks or goes negative), and one that starts while a released engine's
worker processes are still giving their memory back trips the assertion. Hence:

- `load_gate(what)`: a process-wide gate that every local load holds (the `hf` backend's weights loading to their
  devices, a `vllm` engine from its constructor until it is ready). Loads from any number of threads run one after
  another; the same thread may re-enter (a load inside a load). `GATE.history` keeps the order, for the run's log
  and tests.
- `Engines`: the run's scheduler starts a phase's engines one after another before any of its units runs
  (`start`), reading each device's free memory around each start, so it knows what every engine took; after a
  phase it releases the engines the next phase does not need (`release`) and waits, bounded, until that memory is
  free again (`wait_for_memory`), with an error that names the device and the GiB still missing.

Free memory is read with `torch.cuda.mem_get_info` per visible device (`cuda_free_gib`), only where torch is
already imported with CUDA: on a CPU machine, or before any model loaded, there is nothing to wait for and the
waits are no-ops. The reader, the clock and the sleep are parameters, so tests drive them with fake readings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

from harness.errors import BackendUnavailableError

log = logging.getLogger(__name__)

GIB = 2**30
MEMORY_WAIT_S = 180.0
"""How long a released engine's memory may take to come back (vLLM's engine-core shutdown joins its processes
within seconds; the rest is the driver tearing their contexts down)."""
POLL_S = 0.5
"""Seconds between two readings while waiting."""
SLACK_GIB = 0.25
SLACK_SHARE = 0.05
"""What may stay missing of a released engine's memory: `SLACK_GIB` plus `SLACK_SHARE` of it (allocator
rounding, a library workspace kept by the process, another process's small growth meanwhile)."""

FreeReader = Callable[[], Mapping[int, float]]
"""Returns the free GiB of each device by index (empty: no CUDA device to watch)."""


class LoadGate:
    """The process-wide gate around local loads (see the module docstring); use `GATE` through `load_gate`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._depth = 0
        self._holding: str | None = None
        self._waiting: list[str] = []
        self.history: list[tuple[str, str]] = []
        """`("start" | "end", what)` of every outermost load, in order."""

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        """Hold the gate for the load of `what` (a model spec: `hf:/ckpt`), waiting while another thread holds it."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:  # a load inside a load of the same thread
                self._depth += 1
            else:
                if self._owner is not None:
                    log.info("%s waits for %s to finish loading", what, self._holding)
                self._waiting.append(what)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._owner is None)
                self._waiting.remove(what)
                self._owner, self._depth, self._holding = me, 1, what
                self.history.append(("start", what))
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self.history.append(("end", what))
                    self._owner = self._holding = None
                self._cond.notify_all()

    @property
    def holding(self) -> str | None:
        """What is loading now (None: nothing)."""
        return self._holding

    @property
    def waiting(self) -> tuple[str, ...]:
        """What waits to load, in arrival order."""
        with self._cond:
            return tuple(self._waiting)

    def wait_until_waiting(self, what: str, timeout: float) -> bool:
        """Block until a load of `what` waits at the gate (False after `timeout` seconds): lets a test hold one
        load and know, without sleeping, that another one is blocked behind it."""
        with self._cond:
            return self._cond.wait_for(lambda: what in self._waiting, timeout)


GATE = LoadGate()


def load_gate(what: str) -> contextlib.AbstractContextManager[None]:
    """The process-wide load gate, held for the load of `what` until the model is ready (see `LoadGate`)."""
    return GATE(what)


def cuda_free_gib() -> dict[int, float]:
    """Free GiB of each visible CUDA device (`torch.cuda.mem_get_info`), or {} where torch is not imported yet (no
    model loaded in this process: nothing to wait for) or has no CUDA. Reading a device creates this process's
    CUDA context on it, if it has none, before the load being measured.

    This process's cached blocks count as free: a load in this process draws on them before the device's free
    memory moves (on an H200 an `hf` model of 0.75 GiB read as 0.22 GiB taken beside blocks an earlier model left
    cached). What the cache can give back goes back first (`torch.cuda.empty_cache`), since an engine in another
    process (vLLM's engine core) cannot use it; what stays is reserved beside a live block."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {}
    if not torch.cuda.is_initialized():
        return {i: torch.cuda.mem_get_info(i)[0] / GIB for i in range(torch.cuda.device_count())}
    torch.cuda.empty_cache()
    return {i: (torch.cuda.mem_get_info(i)[0] + torch.cuda.memory_reserved(i) - torch.cuda.memory_allocated(i)) / GIB
            for i in range(torch.cuda.device_count())}


class MemoryNotBack(BackendUnavailableError):
    """Released models' memory did not come back within the wait."""


async def wait_for_memory(
    want: Mapping[int, float],
    *,
    what: str,
    read_free: FreeReader = cuda_free_gib,
    timeout: float = MEMORY_WAIT_S,
    poll: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[int, float]:
    """Wait until every device `d` of `want` has at least `want[d]` GiB free; returns the last readings.

    A device the reader does not list is not waited for (no CUDA: nothing is).

    Args:
        want: Device index -> the free GiB to wait for.
        what: What freed the memory, for the error (`releasing hf:/a, vllm:b`).
        read_free: The reader (`cuda_free_gib`).
        timeout: Seconds before giving up.
        poll: Seconds between readings.
        clock, sleep: Time (tests pass fakes).

    Raises:
        MemoryNotBack: naming each device still short, its free and expected GiB and what is missing.
    """
    deadline = clock() + timeout
    while True:
        free = dict(read_free())
        short = {d: w for d, w in sorted(want.items()) if d in free and free[d] < w}
        if not short:
            return free
        if clock() >= deadline:
            shown = "; ".join(f"cuda:{d} has {free[d]:.2f} GiB free of the {w:.2f} GiB expected "
                              f"({w - free[d]:.2f} GiB missing)" for d, w in short.items())
            raise MemoryNotBack(
                f"memory did not come back {timeout:.0f} s after {what}: {shown}; another process may hold it "
                "(nvidia-smi lists them), or an engine's worker did not exit"
            )
        await sleep(poll)


class Engines:
    """The local engines a run starts up front, what each took of every device, and the wait for it after a
    release (see the module docstring).

    Args:
        read_free, timeout, poll, clock, sleep: As for `wait_for_memory`.
    """

    def __init__(self, *, read_free: FreeReader = cuda_free_gib, timeout: float = MEMORY_WAIT_S,
                 poll: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._read = read_free
        self._wait = {"read_free": read_free, "timeout": timeout, "poll": poll, "clock": clock, "sleep": sleep}
        self.held: dict[str, dict[int, float]] = {}
        """Engine -> GiB it took of each device when it started (free memory before its start minus after)."""
        self.started: list[str] = []
        """Every engine started, in order."""

    async def start(self, engines: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Start each `(key, load)` in turn: `load` runs in a worker thread (the backend holds `load_gate` in it),
        and the next starts only once it returned; free memory is read before and after each."""
        for key, load in engines:
            before = dict(self._read())
            await asyncio.to_thread(load)
            after = dict(self._read())
            self.held[key] = {d: max(0.0, before[d] - after[d]) for d in before if d in after}
            self.started.append(key)
            taken = ", ".join(f"cuda:{d} {g:.2f}" for d, g in self.held[key].items() if g)
            log.info("started %s%s", key, f" (GiB taken: {taken})" if taken else "")

    async def release(self, keys: Iterable[str], free: Callable[[list[str]], Awaitable[None]]) -> None:
        """Free `keys` with `free(keys)`, then wait until what they took when they started is free again.

        Raises:
            MemoryNotBack: see `wait_for_memory`.
        """
        keys = sorted(keys)
        before = dict(self._read())
        await free(keys)
        back: dict[int, float] = {}
        for key in keys:
            for d, gib in self.held.pop(key, {}).items():
                back[d] = back.get(d, 0.0) + gib
        want = {d: before[d] + gib - SLACK_GIB - SLACK_SHARE * gib
                for d, gib in back.items() if d in before and gib > SLACK_GIB}
        if want:
            await wait_for_memory(want, what=f"releasing {', '.join(keys)}", **self._wait)  # type: ignore[arg-type]
