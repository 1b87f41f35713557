"""Errors the harness raises on purpose, and the failure categories it records.

A `HarnessError` is a user-facing problem (bad input, missing model or data, unreachable server): the CLI prints
its message as one line and exits non-zero, with a traceback only under `--debug`. A `Failure` is a per-request
problem that does not stop a run: it is recorded next to the request and counted in every summary.

Ctrl-C and SIGTERM are caught at two layers (the command line for a whole verb, the loop while it runs) and
acted on by a third (local backends, which stop their work); the little state they share lives here:
`request_stop` / `stop_requested`, `note_saved` / `saved_line` (what an interrupt now leaves saved), and
`exit_interrupted`, the one way an interrupted command ends.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn


class HarnessError(Exception):
    """A problem the user can fix; its message says what and where."""

    exit_code: int = 2


class ConfigError(HarnessError):
    """A malformed config, spec string, CLI value or input file."""


class ModelNotFoundError(HarnessError):
    """An unknown alias, a missing local file or package holding model weights."""


class BackendUnavailableError(HarnessError):
    """A backend that cannot start or be reached (server down, missing extra, no GPU)."""


class Interrupted(HarnessError):
    """The user stopped the run (Ctrl-C, SIGTERM); the message says what was saved."""

    exit_code = 130


# ------------------------------------------------------------------------------------------------------------
# Stopping the process: shared by the command line (`harness.commands.cli`), the loop (`harness.loop`) and local
# backends, which sit at different layers; one process has one Ctrl-C.

TOO_DEEP = "nested too deeply to read (past Python's recursion limit)"
"""What a JSON or YAML file whose nesting overflows the parser is told (`RecursionError`, caught where files are
read)."""
NOTHING_STARTED = "interrupted: nothing was started; rerun the same command to start"

_stop = threading.Event()
_saved: list[Callable[[], str]] = []


def request_stop() -> None:
    """Note the first Ctrl-C or SIGTERM: from now on the process wants none of the work in flight, so what closes
    does not wait for it (a vLLM engine is killed, not shut down gracefully: `stop_requested`)."""
    _stop.set()


def stop_requested() -> bool:
    """Whether the process was told to stop (`request_stop`)."""
    return _stop.is_set()


def note_saved(line: Callable[[], str]) -> None:
    """Say how to tell what is saved: `line()` builds the `interrupted:` line of the loop that runs (or ran
    last)."""
    _saved[:] = [line]


def saved_line() -> str:
    """The `interrupted:` line for a stop now: what the latest loop saved, or that nothing was started."""
    if not _saved:
        return NOTHING_STARTED
    try:
        return _saved[0]()
    except Exception:  # noqa: BLE001 - the line must still come out; the records are on disk either way
        return "interrupted: the records written so far are saved; rerun the same command to resume"


def exit_interrupted(message: str) -> NoReturn:
    """Print `message` (the `interrupted:` line) on stderr and end the process now with exit code 130.

    Safe at any moment, from a signal handler too: each record is flushed as it is appended, manifests and
    compacted logs are replaced atomically, and the call cache commits every entry. Child processes
    (multiprocessing's: a vLLM engine core, with its workers) are killed first, so none outlives the command
    holding memory. What the interpreter would do on its way out is skipped: joining threads that still compute
    work nobody waits for, the `atexit` hooks (their cleanups are of the processes killed here, of sockets and
    of log handlers, which are flushed here) and tearing down every object, which takes 3-4 s on 2 CPU cores
    once torch, transformers and vLLM are loaded (measured).
    """
    _kill_children()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream must not keep the process alive
            pass
    for handler in list(logging.getLogger().handlers):
        try:
            handler.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        print(message, file=sys.stderr, flush=True)
    finally:
        os._exit(Interrupted.exit_code)


def _kill_children() -> None:
    """SIGKILL every live child process multiprocessing started here, after its own descendants (found with
    psutil where installed: vLLM depends on it, and kills an engine core's process tree so,
    `vllm/utils/system_utils.py:207`)."""
    import multiprocessing

    try:
        children = multiprocessing.active_children()
    except Exception:  # noqa: BLE001 - e.g. a set another thread changes while it is read
        return
    try:
        import psutil
    except ImportError:
        psutil = None
    for child in children:
        pids = [child.pid]
        if psutil is not None:
            try:
                pids = [p.pid for p in psutil.Process(child.pid).children(recursive=True)] + pids
            except Exception:  # noqa: BLE001 - it exited meanwhile
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (OSError, TypeError):  # gone already, or never started (no pid)
                pass


class FailureCategory(str, enum.Enum):
    """Why one request produced no usable result."""

    RATE_LIMIT = "rate_limit"
    """429 after every retry."""
    SERVER_ERROR = "server_error"
    """5xx after every retry."""
    TIMEOUT = "timeout"
    """No answer within the per-request timeout, after every retry."""
    CONNECTION = "connection"
    """Connection refused, reset or dropped, after every retry."""
    MALFORMED_RESPONSE = "malformed_response"
    """The server answered 200 with a body that is not a valid completion."""
    BAD_REQUEST = "bad_request"
    """4xx other than 429: the request itself is wrong (not retried)."""
    AUTH = "auth"
    """401/403: the key is missing or refused (not retried)."""
    UNSUPPORTED = "unsupported"
    """The server lacks a feature the request needs (e.g. logprobs)."""
    PARSE = "parse"
    """The model answered but its text could not be parsed (judges)."""
    BACKEND = "backend"
    """Any other error raised inside a backend."""

    @property
    def final(self) -> bool:
        """Whether a rerun keeps a record with this failure (see `harness.loop`): only PARSE is final.

        A parse failure is the model's measured behaviour, counted wrong next to every metric, and a rerun would
        replay the same cached output; every other category is a failure of the backend, retried on rerun.
        """
        return self is FailureCategory.PARSE


@dataclass(frozen=True, slots=True)
class Failure:
    """A categorised, recorded failure of one request."""

    category: FailureCategory
    """What kind of failure this is."""
    message: str
    """One line saying what went wrong; never contains secrets."""
    attempts: int = 1
    """How many attempts were made before giving up."""

    def to_json(self) -> dict:
        return {"category": self.category.value, "message": self.message, "attempts": self.attempts}

    @classmethod
    def from_json(cls, data: dict) -> Failure:
        return cls(FailureCategory(data["category"]), data["message"], int(data.get("attempts", 1)))
