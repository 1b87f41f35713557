"""MATH-500's checker: math-verify in a process pool with a per-item wall timeout (no model, no judge).

math-verify (0.9) parses LaTeX into sympy and compares: `verify(gold, answer)` is asymmetric (gold first). Its own
timeouts use `signal.alarm`, which fails off a process's main thread, so both are switched off
(`parsing_timeout=None`, `timeout_seconds=None`) and the bound is enforced from outside: each check runs in a worker
process, and one that takes longer than `timeout_s` is a recorded failure (category `parse`, message `timeout: ...`:
final, as the same output would time out again): the worker pool is terminated and started again, so a
pathological expression never hangs the run.

Gold: the `answer` string wrapped in `$...$` (raw, 449 of the 500 answers parse; wrapped, all 500 do). Answer: the
policy's whole output, parsed with math-verify's default extraction (LaTeX with `\\boxed{}` first, then plain
expressions; the last match of the highest-priority kind wins).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
        self._pool: Any = None
        self._lock = threading.Lock()
        self.requests = 0
        """Model requests (always 0: nothing is asked of a model)."""

    @property
    def settings(self) -> dict[str, Any]:
        return {"checker": "math-verify", "timeout_s": self.timeout_s}

    def _get_pool(self) -> Any:
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers, initializer=_warm)
        return self._pool

    def check(self, gold: str, output: str) -> tuple[bool | None, str, str, Failure | None]:
        """One bounded check (blocking): (verified, gold parsed, answer parsed, failure)."""
        with self._lock:
            pending = self._get_pool().apply_async(check_answer, (gold, output))
        try:
            ok, g, a = pending.get(timeout=self.timeout_s)
            return ok, g, a, None
        except multiprocessing.TimeoutError:
            with self._lock:  # the worker is stuck in sympy: no way to stop just it
                if self._pool is not None:
                    self._pool.terminate()
                    self._pool = None
            return None, "", "", Failure(FailureCategory.PARSE, f"timeout: math-verify took over {self.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - math-verify or sympy raising on odd input
            return None, "", "", Failure(FailureCategory.PARSE, f"math-verify failed: {type(exc).__name__}: {exc}")

    async def judge_all(self, pairs: Sequence[tuple[PolicyItem, str]], *, seed: int) -> list[MathJudgment]:
        """Check every (item, output) pair (concurrently, in the pool); aligned with `pairs`."""
        del seed

        async def one(item: PolicyItem, output: str) -> MathJudgment:
            ok, g, a, failure = await asyncio.to_thread(self.check, item.meta["answer"], output)
            return MathJudgment(item.id, ok, g, a, failure)

        return list(await asyncio.gather(*(one(item, output) for item, output in pairs)))

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.terminate()
                self._pool = None
