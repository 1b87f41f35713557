"""The calls a run made: its `calls.sqlite`, their export, and what a replay builds instead of local models.

A run directory of `harness run` or `harness eval` holds `calls.sqlite`: every call its backends looked up in the
call cache, whether the cache answered it or the backend did (then stored). It has the call cache's own tables
(`harness.cache.SCHEMA`: `calls` maps a key to its model label and stored value) plus `requests`, which says what
each key asked: the backend's identity, the operation, the request's payload (the JSON the key hashes) and the
sample index, so a later tool can send the request again. A rerun into the directory adds to it; with `--no-cache`
nothing is recorded. Writes are batched (`BATCH` rows or `FLUSH_SECONDS`, and when the run ends), in WAL mode
without a sync per write; the file is left out of WAL mode when the run ends, so it is one file again.

`harness cache export RUN_DIR... --out FILE` writes the union of some runs' files as one small file of the same
format; `--replay FILE` answers every call of a command from it (`harness.cache.CallCache(read_only=True)`).
A replay builds no local model: each `hf:` or `vllm:` spec becomes a `ReplayedBackend` with the identity the file
recorded for it, so neither weights nor the hub are needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.backends.base import BaseBackend, Completion, GenerateRequest, ScoreHead
from harness.cache import SCHEMA
from harness.errors import ConfigError, HarnessError
from harness.redact import scrub_secrets

REQUESTS = """
CREATE TABLE IF NOT EXISTS requests (
    key TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    op TEXT NOT NULL,
    payload TEXT NOT NULL,
    sample INTEGER NOT NULL
);
"""
"""What each key of `calls` asked: the backend's identity (JSON), the operation, the payload (JSON), the sample."""

CALLS_FILE = "calls.sqlite"
"""The file in a run directory (`harness.runstore.OutputPaths.calls`)."""

BATCH = 256
"""Rows kept in memory before they are written."""
FLUSH_SECONDS = 2.0
"""The longest a recorded call waits in memory while calls keep coming."""


def _dumps(value: Any) -> str:
    return scrub_secrets(json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")))


class CallLogError(HarnessError):
    """A run's calls.sqlite cannot be written or read."""


class CallLog:
    """A run's `calls.sqlite`, appended to in batches (one writer: the run's lock holder)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._pending: list[tuple] = []
        self._seen: set[str] = set()
        self._flushed = time.monotonic()
        try:
            self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(SCHEMA + REQUESTS)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: Exception) -> CallLogError:
        return CallLogError(f"cannot record the run's calls in {self.path}: {exc}; or run with --no-cache")

    def add(self, identity: dict[str, str], op: str, entries: Iterable[tuple[str, dict, int, object]]) -> None:
        """Note (key, payload, sample index, stored value) lookups of `op` on the backend `identity`; written with
        the next batch (a key already noted is skipped)."""
        label = f"{identity.get('kind', '?')}:{identity.get('model', '?')}"
        now = time.time()
        who = None
        with self._lock:
            for key, payload, sample, value in entries:
                if key in self._seen:
                    continue
                self._seen.add(key)
                who = who or _dumps(identity)
                self._pending.append((key, label, _dumps(value), now, who, op, _dumps(payload), sample))
            due = len(self._pending) >= BATCH or time.monotonic() - self._flushed >= FLUSH_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the noted rows in one transaction."""
        with self._lock:
            rows, self._pending = self._pending, []
            self._flushed = time.monotonic()
            if not rows:
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany("INSERT OR IGNORE INTO calls VALUES (?, ?, ?, ?)",
                                           [row[:4] for row in rows])
                    self._conn.executemany("INSERT OR IGNORE INTO requests VALUES (?, ?, ?, ?, ?)",
                                           [(row[0], *row[4:]) for row in rows])
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def close(self) -> None:
        """Write what is noted and close the file, leaving it one file (no WAL) for whoever reads it next."""
        try:
            self.flush()
            with contextlib.suppress(sqlite3.Error):  # a reader holds it: it stays in WAL mode, as readable
                self._conn.execute("PRAGMA journal_mode=DELETE")
        finally:
            self._conn.close()


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)


def export_calls(run_dirs: Sequence[Path], out: Path) -> dict[str, int]:
    """Write the union of the runs' `calls.sqlite` (both tables) to `out`, a call-cache file of its own
    (one file, no WAL), replacing it; returns the calls per model label.

    Raises:
        ConfigError: a run directory without calls.sqlite, or `out` being one of them.
        CallLogError: a file SQLite cannot read or write.
    """
    sources = [Path(d) / CALLS_FILE for d in run_dirs]
    for run, source in zip(run_dirs, sources):
        if not source.is_file():
            raise ConfigError(f"{run} holds no {CALLS_FILE} (a run of `harness run` or `harness eval` records one "
                              "unless --no-cache)")
        if out.exists() and out.resolve() == source.resolve():
            raise ConfigError(f"--out {out} is the calls file of {run}; choose another file")
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        conn = sqlite3.connect(tmp.resolve().as_uri(), uri=True, isolation_level=None)  # URIs attach read-only
        try:
            conn.executescript(SCHEMA + REQUESTS)
            for source in sources:
                try:
                    conn.execute("ATTACH DATABASE ? AS src", (f"{source.resolve().as_uri()}?mode=ro",))
                except sqlite3.Error as exc:
                    raise CallLogError(f"cannot read {source}: {exc}") from None
                try:
                    conn.execute("BEGIN")
                    conn.execute("INSERT OR IGNORE INTO calls SELECT key, model, value, created FROM src.calls")
                    conn.execute("INSERT OR IGNORE INTO requests SELECT key, identity, op, payload, sample "
                                 "FROM src.requests")
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    conn.execute("ROLLBACK")
                    raise CallLogError(f"cannot read {source}: {exc}") from None
                finally:
                    conn.execute("DETACH DATABASE src")
            counts = dict(conn.execute("SELECT model, COUNT(*) FROM calls GROUP BY model ORDER BY 2 DESC, 1"))
        finally:
            conn.close()
        os.replace(tmp, out)
    except sqlite3.Error as exc:
        raise CallLogError(f"cannot write {out}: {exc}") from None
    except OSError as exc:
        raise CallLogError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return counts


def recorded_identity(path: Path, kind: str, name: str, *, dtype: str, top_logprobs: int) -> dict[str, str] | None:
    """The identity the replay file `path` recorded for the local model `kind:name` with these backend options,
    where exactly one fits (None for none or several, or a file without a `requests` table)."""
    try:
        conn = _read_only(path)
        try:
            rows = conn.execute("SELECT DISTINCT identity FROM requests").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    names = {name, name.partition("@")[0]}
    fits = []
    for (text,) in rows:
        identity = json.loads(text)
        if (identity.get("kind") == kind and identity.get("model") in names
                and identity.get("dtype", "auto") == dtype
                and identity.get("top_logprobs", str(top_logprobs)) == str(top_logprobs)):
            fits.append(identity)
    return fits[0] if len(fits) == 1 else None


class ReplayedBackend(BaseBackend):
    """A local model in a replay: its identity only; nothing loads, and every call is answered from the replay
    file before it reaches this backend."""

    def __init__(self, kind: str, model: str, identity: dict[str, str]) -> None:
        self.kind = kind
        self.model = model
        self._identity = dict(identity)

    def identity(self) -> dict[str, str]:
        return dict(self._identity)

    def check_score(self, head: ScoreHead) -> None:
        """Nothing to check: the checkpoint is not read in a replay."""

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        raise HarnessError(f"{self.kind}:{self.model} runs no model in a replay")
