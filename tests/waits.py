"""Waiting on what a test can observe (a file appearing, a process exiting), with a deadline that only guards a
hang: the condition, never the clock, is what passes the test."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HANG_GUARD_S = 600.0


def wait_until(what: str, ready: Callable[[], bool], *procs: tuple[subprocess.Popen, Path | None],
               timeout: float = HANG_GUARD_S) -> None:
    """Return once `ready()`; fail at once should one of `procs` (a process and its stderr file) exit first, or
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        for proc, err in procs:
            if proc.poll() is not None:
                shown = err.read_text()[-5000:] if err is not None else ""
                pytest.fail(f"{' '.join(map(str, proc.args[:4]))} exited with {proc.returncode} while waiting for "
                            f"{what}:\n{shown}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)  # polling state another process changes; the condition decides, not the clock
