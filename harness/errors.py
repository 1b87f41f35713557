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


class NotImplementedYetError(HarnessError):
    """A CLI verb whose implementation lands in a later release."""


class Interrupted(HarnessError):
    """The user stopped the run (Ctrl-C, SIGTERM); the message says what was saved."""

    exit_code = 130


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
