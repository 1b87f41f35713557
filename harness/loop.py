"""The one evaluation loop: `generate`, `score`, `run` and `eval` write their records through it.

    units --(resume rule)--> to do --(`parallel` workers: work(unit) -> records)--> output (append, flush)

A *unit* is the smallest piece of work (a prompt with its n samples, a set to score, an evaluator x benchmark x
item x repeat) and names the keys of the records it produces. The loop runs the units the output does not hold yet,
at most `parallel` at once, appends each unit's records as soon as it finishes, drives the progress bar and leaves
a summary on the output, whose manifest records it when the output closes (`harness.runstore.Output`). Units may
carry a phase (`harness.schedule`): phases run one after another; a hook before a phase's units (`before_phase`)
starts its models, one after another, and a hook after them (`after_phase`) frees the models the next phase does
not need. Both run only for phases with units to do, so a resumed run starts nothing for a finished phase.

**The resume rule, for every verb.** A record is kept on rerun unless it holds a failure of the backend (rate
limit, server error, timeout, connection, malformed body, auth, bad request, unsupported, other backend errors):
those units are retried. A parse failure (the model answered, the answer could not be read) is final: it is the
model's measured behaviour, counted wrong next to every metric, and a rerun would replay the same cached output.
`retry_failed` (`--retry-failed`) redoes every record with any failure, which re-reads cached outputs with the
current parsers at no model cost, and resamples where the cache is bypassed.

**Stopping.** A `HarnessError` raised by a unit (a server that cannot be reached, a model that cannot be loaded, a
cache the disk refuses) stops every worker: finished records stay, the output is marked failed and the error is the
command's one line. Ctrl-C or SIGTERM cancels the workers, marks the output interrupted and raises `Interrupted`
saying what was saved; a rerun of the same command resumes. Cancelling a worker stops the local model work it
waited for after the current decode step (`harness.backends.local.InFlight`), and nothing of that work is cached
or recorded. A second Ctrl-C or SIGTERM, any time until the command's event loop closes (while the backends
close, say), prints the same `interrupted:` line and exits with code 130 at once: every record already written
stays (each is flushed as it is appended).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from harness.errors import Interrupted
from harness.progress import progress_bar
from harness.records import Record
from harness.runstore import Output, OutputPaths

T = TypeVar("T")

EXAMPLES = 5
"""Failed records named in the summary."""


@dataclass(frozen=True, slots=True)
class Unit(Generic[T]):
    """One piece of work and the keys of the records it produces."""

    keys: tuple[tuple, ...]
    payload: T
    phase: int = 0
    """Units run phase by phase (`harness.schedule`): none of phase k+1 starts before every unit of phase k
    has finished."""


def settled(record: Record | None, *, retry_failed: bool = False) -> bool:
    """Whether a rerun keeps `record` (the resume rule in the module docstring)."""
    if record is None:
        return False
    if retry_failed:
        return not record.failures
    return all(f.category.final for f in record.failures)


@dataclass(slots=True)
class LoopSummary:
    """What the loop did, and the state of every record it was asked for."""

    noun: str
    """What a record is called in messages (`samples`, `sets`)."""
    total: int = 0
    """Records asked for."""
    skipped: int = 0
    """Records kept from earlier sessions."""
    written: int = 0
    """Records written by this session."""
    complete: int = 0
    """Records asked for that hold no failure."""
    with_failures: int = 0
    """Records asked for that hold a failure (final, or left by an interrupted or failed session)."""
    missing: int = 0
    """Records asked for that the output does not hold (an interrupted session)."""
    failures: dict[str, int] = field(default_factory=dict)
    """Failures per category over the records asked for."""
    examples: list[str] = field(default_factory=list)
    """A few failed records: key, category and message."""
    final_failures: int = 0
    """Of `failures`, the parse failures a rerun keeps."""
    backend_calls: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    lacking: dict[str, dict[str, str]] = field(default_factory=dict)
    """Model spec -> what its backend was found to lack, and how requests coped (`BaseBackend.capabilities`)."""
    spent: dict[str, dict[str, int]] = field(default_factory=dict)
    """Model spec -> requests sent and tokens spent by this command (`BackendPool.spent`; cache hits spend none)."""
    engines: dict[str, Any] = field(default_factory=dict)
    """Local models' loads and releases, and the most resident at once (`BackendPool.engines`)."""
    replicas: dict[str, Any] = field(default_factory=dict)
    """Models served by replicas: requests per replica and failovers (`BackendPool.replicas`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, out: str) -> str:
        """The one-line summary every verb prints."""
        return (
            f"{out}: {self.total} {self.noun} ({self.complete} complete, {self.with_failures} with failures, "
            f"{self.skipped} already done); backend calls: {self.backend_calls}, cache hits: {self.cache_hits}; "
            f"{self.seconds:.1f} s"
        )

    def spent_lines(self) -> list[str]:
        """Requests and tokens per model that sent any (empty when everything came from the cache)."""
        return [f"{spec}: {s['calls']} calls, {s['prompt_tokens']} prompt + {s['completion_tokens']} completion "
                "tokens" for spec, s in self.spent.items() if s.get("calls")]

    def replica_lines(self) -> list[str]:
        """Requests per replica and failovers, one line per model served by replicas."""
        return [f"{spec}: " + ", ".join(f"{url} {n}" for url, n in r["requests"].items())
                + f" requests; {r['failovers']} moved to another replica" for spec, r in self.replicas.items()]

    def lacking_lines(self) -> list[str]:
        """What the backends lacked, one line per model and feature (empty when none lacked anything)."""
        return [f"{spec}: {feature}: {how}" for spec, lacks in self.lacking.items() for feature, how in lacks.items()]

    def failure_lines(self, out: str) -> list[str]:
        """Which records could not be evaluated and why, and what a rerun does about it (empty when none)."""
        if not self.with_failures:
            return []
        cats = ", ".join(f"{k}={v}" for k, v in self.failures.items())
        lines = [f"{self.with_failures} {self.noun} hold failures: {cats} (details in {out})"]
        lines += [f"  {example}" for example in self.examples]
        retried = sum(self.failures.values()) - self.final_failures
        if retried:
            lines.append("backend failures are retried when you rerun the same command")
        if self.final_failures:
            lines.append("parse failures are final (counted wrong); --retry-failed redoes them")
        return lines


async def run_loop(
    output: Output,
    units: Sequence[Unit[T]],
    work: Callable[[T], Awaitable[Sequence[Record]]],
    *,
    parallel: int,
    noun: str,
    label: str,
    retry_failed: bool = False,
    counters: Any = None,
    before_phase: Callable[[int], Awaitable[None]] | None = None,
    after_phase: Callable[[int], Awaitable[None]] | None = None,
) -> LoopSummary:
    """Run the units `output` does not hold yet and append their records; see the module docstring.

    Args:
        output: The open output (its log is read for the resume rule and appended to).
        units: Everything asked for, in a stable order.
        work: Produces one unit's records (exactly its keys).
        parallel: Units in flight at once.
        noun: What a record is called in messages.
        label: The progress bar's label.
        retry_failed: Redo records with final (parse) failures too.
        counters: Anything with `calls` and `hits` (the backend pool): the summary reports their growth, and
            what its backends lack (`capabilities()`, where it has one).
        before_phase: Awaited before any unit of a phase (`Unit.phase`) to do starts (the run's scheduler
            starts the phase's models there, one after another).
        after_phase: Awaited when every unit of a phase to do has finished, before the next phase starts (the
            run's scheduler releases models there, and waits for their memory).

    Raises:
        Interrupted: on Ctrl-C or SIGTERM, saying how many records are saved.
        HarnessError: the first fatal error a unit raised (after every worker stopped).
    """
    started = time.perf_counter()
    log = output.log
    summary = LoopSummary(noun=noun, total=sum(len(u.keys) for u in units))
    todo = [u for u in units if not all(settled(log.get(k), retry_failed=retry_failed) for k in u.keys)]
    summary.skipped = summary.total - sum(len(u.keys) for u in todo)
    calls0, hits0 = (counters.calls, counters.hits) if counters is not None else (0, 0)

    def finish() -> LoopSummary:
        _tally(summary, units, log)
        if counters is not None:
            summary.backend_calls, summary.cache_hits = counters.calls - calls0, counters.hits - hits0
            summary.lacking = counters.capabilities() if hasattr(counters, "capabilities") else {}
            summary.spent = counters.spent() if hasattr(counters, "spent") else {}
            summary.engines = counters.engines() if hasattr(counters, "engines") else {}
            summary.replicas = counters.replicas() if hasattr(counters, "replicas") else {}
        summary.seconds = time.perf_counter() - started
        output.summary = summary.to_json()
        return summary

    async def worker(pending: Iterator[Unit[T]], advance: Callable[[int], None]) -> None:
        for unit in pending:  # one shared iterator: each unit goes to exactly one worker
            records = list(await work(unit.payload))
            if sorted(r.key for r in records) != sorted(unit.keys):
                raise RuntimeError(f"work for {unit.keys} returned records {[r.key for r in records]}")
            log.append(records)
            summary.written += len(records)
            advance(1)

    def interrupted() -> Interrupted:
        finish()
        saved = summary.total - summary.missing
        return Interrupted(
            f"interrupted: {saved} of {summary.total} {noun} are saved in {output.paths.shown} "
            f"({summary.written} by this session); rerun the same command to resume"
        )

    phases = sorted({u.phase for u in todo})
    workers: list[asyncio.Future] = []
    with progress_bar(len(todo), label) as bar, _Signals(output, interrupted, bar):
        try:
            for phase in phases:
                if before_phase is not None:
                    await before_phase(phase)
                pending = iter([u for u in todo if u.phase == phase])
                size = sum(u.phase == phase for u in todo)
                workers = [asyncio.ensure_future(worker(pending, bar.advance)) for _ in range(min(parallel, size))]
                done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
                await _stop(workers)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if after_phase is not None:
                    await after_phase(phase)
        except asyncio.CancelledError:
            await _stop(workers)
            raise interrupted() from None
        except BaseException:
            await _stop(workers)
            finish()
            raise
    return finish()


async def write_output(
    paths: OutputPaths,
    record_type: type,
    *,
    command: str,
    settings: Mapping[str, Any],
    config: Mapping[str, Any],
    units: Sequence[Unit[T]],
    work: Callable[[T], Awaitable[Sequence[Record]]],
    parallel: int,
    noun: str,
    extra: Mapping[str, Any] | None = None,
    counters: Any = None,
    overwrite: bool = False,
    wait: bool = False,
    retry_failed: bool = False,
    before_phase: Callable[[int], Awaitable[None]] | None = None,
    after_phase: Callable[[int], Awaitable[None]] | None = None,
    calls: Callable[[Path], AbstractContextManager[Any]] | None = None,
) -> LoopSummary:
    """Open the output (lock, settings binding, manifest; `harness.runstore.Output`) and run the loop into it.

    Every verb writes its records through this one function. `calls(path)`, where given, is entered while the
    output is open, with the file the output keeps its model calls in (`OutputPaths.calls`, where it has one):
    the backend pool's `recording_calls`.
    """
    with Output(paths, record_type, command=command, settings=settings, config=config, extra=extra,
                overwrite=overwrite, wait=wait) as output:
        recording = calls(paths.calls) if calls is not None and paths.calls is not None else nullcontext()
        with recording:
            return await run_loop(output, units, work, parallel=parallel, noun=noun, label=command,
                                  retry_failed=retry_failed, counters=counters, before_phase=before_phase,
                                  after_phase=after_phase)


async def _stop(tasks: list[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _tally(summary: LoopSummary, units: Sequence[Unit], log: Any) -> None:
    counts: dict[str, int] = {}
    summary.complete = summary.with_failures = summary.missing = summary.final_failures = 0
    summary.examples = []
    for unit in units:
        for key in unit.keys:
            record = log.get(key)
            if record is None:
                summary.missing += 1
                continue
            if not record.failures:
                summary.complete += 1
                continue
            summary.with_failures += 1
            for failure in record.failures:
                counts[failure.category.value] = counts.get(failure.category.value, 0) + 1
                summary.final_failures += failure.category.final
            if len(summary.examples) < EXAMPLES:
                first = record.failures[0]
                shown = "/".join(str(k) for k in key)
                summary.examples.append(f"{shown}: {first.category.value}: {first.message[:160]}")
    summary.failures = dict(sorted(counts.items()))


class _Signals:
    """Ctrl-C and SIGTERM while the loop runs ("Stopping" in the module docstring); both take the same path.

    The first notes the stop for the whole process (`harness.errors.request_stop`: a backend that closes after it
    does not wait for its work, a vLLM engine is killed) and cancels the loop's task. A second one ends the
    process at once (`harness.errors.exit_interrupted`, which kills child processes such as a vLLM engine core
    first): the bar leaves the terminal, the output is marked interrupted unless the loop already left it, and
    the `interrupted:` line is printed. Once a signal came, the handlers stay until the event loop closes
    (`loop.close` removes them), so a second signal while the backends close still exits at once; otherwise
    leaving the block restores the handlers it found (asyncio's Ctrl-C handler, or the command line's for both
    signals). A signal the process ignores (a background job of a non-interactive shell ignores Ctrl-C) stays
    ignored. From entry on, `harness.errors.saved_line` builds this loop's `interrupted:` line, so a signal the
    command line catches after the loop (while the backends close) says what is saved too.

    Args:
        output: The open output.
        interrupted: Builds the `Interrupted` error that says what is saved.
        bar: The progress bar.
    """

    def __init__(self, output: Output, interrupted: Callable[[], Interrupted], bar: Any) -> None:
        self._output, self._interrupted, self._bar = output, interrupted, bar
        self._signals = 0
        self._left = False
        self._message: str | None = None
        self._installed: list[signal.Signals] = []
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> None:
        from harness.errors import note_saved

        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        note_saved(self._line)
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            if previous == signal.SIG_IGN:
                continue
            try:
                self._loop.add_signal_handler(sig, self._received)
            except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
                break
            self._installed.append(sig)
            self._previous[sig] = previous

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._left = True
        if isinstance(exc, Interrupted):
            self._message = str(exc)
        if self._signals:
            return
        for sig in self._installed:
            self._loop.remove_signal_handler(sig)  # SIGINT back to Python's default, SIGTERM to the system's
            if self._previous[sig] is not None:  # None: a handler not installed from Python, left as it is
                signal.signal(sig, self._previous[sig])

    def _line(self) -> str:
        """The `interrupted:` line: the loop's own once it was interrupted, else built from the records now."""
        return self._message if self._message is not None else str(self._interrupted())

    def _received(self) -> None:
        from harness.errors import exit_interrupted, request_stop

        self._signals += 1
        if self._signals == 1:
            request_stop()
            self._task.cancel()  # type: ignore[union-attr]
            return
        self._bar.stop()
        message = self._line()
        if not self._left:  # the output is open: its manifest would say the session still runs
            try:
                self._output.manifest.finish(status="interrupted", summary=self._output.summary)
            except Exception:  # noqa: BLE001 - exiting now matters more; the records are on disk
                pass
        exit_interrupted(message)
