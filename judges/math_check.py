"""MATH-500's checker: math-verify in a process pool with a per-item wall timeout (no model, no judge).

math-verify (0.9) parses LaTeX into sympy and compares: `verify(gold, answer)` is asymmetric (gold first). Its own
timeouts use `signal.alarm`, which fails off a process's main thread, so both are switched off
(`parsing_timeout=None`, `timeout_seconds=None`) and the bound is enforced from outside: each check runs in a worker
process, and one that takes longer than `timeout_s` is a recorded failure (category `parse`, message `timeout: ...`:
final, as the same output would time out again): that worker is killed and another started, so a pathological
expression never hangs the run. The clock starts when a started, idle worker receives the check, so neither a
worker's start (a fresh Python importing math-verify: seconds on a busy machine) nor the wait for a free worker
counts against it, and a timeout stops no other check.

Gold: the `answer` string wrapped in `$...$` (raw, 449 of the 500 answers parse; wrapped, all 500 do). Answer: the
policy's whole output, parsed with math-verify's default extraction (LaTeX with `\\boxed{}` first, then plain
expressions; the last match of the highest-priority kind wins).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from benchmarks.base import PolicyItem
from harness.errors import ConfigError, Failure, FailureCategory

DEFAULT_TIMEOUT_S = 10.0


def check_answer(gold: str, output: str) -> tuple[bool, str, str]:
    """(verified, the gold as parsed, the answer as parsed) for one output; runs in a worker process."""
    from math_verify import parse, verify

    wrapped = parse(f"${gold}$", parsing_timeout=None)
    found = parse(output, parsing_timeout=None)
    ok = bool(found) and bool(wrapped) and verify(wrapped, found, timeout_seconds=None)
    return ok, str(wrapped[-1]) if wrapped else "", str(found[-1]) if found else ""


def _warm() -> None:
    import logging

    import math_verify  # noqa: F401  (the first import takes a second: pay it once per worker)

    # It warns on every call that its timeouts are off; they are, on purpose (the bound is the pool's).
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _serve(conn: Any) -> None:
    """A worker process: warm up, say so, then answer (gold, output) checks until the pipe closes."""
    _warm()
    conn.send(READY)
    while True:
        try:
            gold, output = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", check_answer(gold, output)))
        except Exception as exc:  # noqa: BLE001 - math-verify or sympy raising on odd input
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


READY = "ready"
WORKER_START_S = 600.0
"""How long a worker may take to start before it counts as broken (a hang guard, not a check's bound)."""


class _Worker:
    """One checking process and the pipe to it."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.started = False

    def wait_started(self) -> None:
        """Block until the worker has imported math-verify (no check's clock runs meanwhile).

        Raises:
            ConfigError: when it dies or does not start within `WORKER_START_S`.
        """
        if self.started:
            return
        try:
            if self.conn.poll(WORKER_START_S) and self.conn.recv() == READY:
                self.started = True
                return
        except (EOFError, OSError):
            pass
        self.kill()
        raise ConfigError(f"a math-verify worker did not start within {WORKER_START_S:g} s")

    def run(self, gold: str, output: str, timeout_s: float) -> tuple[str, Any] | None:
        """The worker's answer to one check, or None when it takes over `timeout_s` (counted from now)."""
        self.conn.send((gold, output))
        if not self.conn.poll(timeout_s):
            return None
        return self.conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


@dataclass(frozen=True, slots=True)
class MathJudgment:
    """One output checked against its gold."""

    item: str
    verified: bool | None
    """True / False; None when the check timed out or crashed."""
    gold_parsed: str = ""
    answer_parsed: str = ""
    failure: Failure | None = None
    raw: dict[str, Any] = field(default_factory=dict)


class MathChecker:
    """Checks MATH answers with math-verify in `workers` processes, each check bounded by `timeout_s` seconds.

    Raises:
        ConfigError: when math-verify is not installed (the `verifiable` extra), or for bad settings.
    """

    needs_model: ClassVar[bool] = False
    """A checker: the run's judge model is not asked (`judges.policy.judge_needs_model`)."""

    def __init__(self, backend: Any = None, *, timeout_s: float = DEFAULT_TIMEOUT_S, workers: int = 2) -> None:
        del backend  # a checker, not a judge: the table's judge model is not used
        try:
            import math_verify  # noqa: F401
        except ImportError:
            raise ConfigError('MATH-500 is checked by math-verify: pip install -e ".[verifiable]"') from None
        if not timeout_s > 0 or workers < 1:
            raise ConfigError(f"math checker: need timeout_s > 0 and workers >= 1, got {timeout_s}, {workers}")
        self.timeout_s = timeout_s
        self.workers = workers
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._free = threading.BoundedSemaphore(workers)
        self.requests = 0
        """Model requests (always 0: nothing is asked of a model)."""

    @property
    def settings(self) -> dict[str, Any]:
        return {"checker": "math-verify", "timeout_s": self.timeout_s}

    def check(self, gold: str, output: str) -> tuple[bool | None, str, str, Failure | None]:
        """One bounded check (blocking): (verified, gold parsed, answer parsed, failure)."""
        with self._free:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker()
            worker.wait_started()
            try:
                answer = worker.run(gold, output, self.timeout_s)
            except (EOFError, OSError) as exc:  # the worker died (out of memory, killed)
                worker.kill()
                return None, "", "", Failure(FailureCategory.PARSE, f"math-verify's worker died: {exc!r}")
            if answer is None:  # the worker is stuck in sympy: no way to stop just the check
                worker.kill()
                return None, "", "", Failure(FailureCategory.PARSE,
                                             f"timeout: math-verify took over {self.timeout_s:g} s")
            self._idle.put(worker)
        status, found = answer
        if status == "error":
            return None, "", "", Failure(FailureCategory.PARSE, f"math-verify failed: {found}")
        ok, g, a = found
        return ok, g, a, None

    def read(self, item: PolicyItem, text: str, j: Any) -> tuple[tuple[float | None, ...], dict[str, Any],
                                                              tuple[tuple[str, Failure], ...]]:
        """One judgment as its record reads it (`judges.policy`): the scores the benchmark's metrics take, the
        trace fields they read, and (where, failure) of every part that failed."""
        del item, text
        score = None if j.verified is None else float(j.verified)
        trace = {"judgment": {"verified": j.verified, "gold_parsed": j.gold_parsed, "answer_parsed": j.answer_parsed}}
        failures = (("check", j.failure),) if j.failure is not None else ()
        return (score,), trace, failures

    async def judge_all(self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int) -> list[MathJudgment]:
        """Check every (item, output) pair (concurrently, in the pool); aligned with `pairs`."""
        del seed

        async def one(item: PolicyItem, output: str) -> MathJudgment:
            ok, g, a, failure = await asyncio.to_thread(self.check, item.meta["answer"], output)
            return MathJudgment(item.id, ok, g, a, failure)

        return list(await asyncio.gather(*(one(item, output) for item, output in pairs)))

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return
