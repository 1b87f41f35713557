"""The call cache: every model call goes through it.

SQLite in WAL mode under the user cache dir, safe for several processes at once. The key is the sha256 of the
canonical JSON of: the backend's identity (kind, model id, revision or weights hash, server), the operation, the full
messages, the semantic sampling parameters and the sample index. Timeouts, concurrency and API keys never enter it.
A failed call is never stored, so a rerun retries it. With greedy decoding the seed does not change the output and is
left out of the key. A reward model's score (`score`) is keyed by the conversation, the head and `max_length`, and
stored with the input's token counts; a loglikelihood (`loglikelihood`) by the context and the continuation.
An answer a backend sent without its request's constraint (a server that takes no form of it,
`Completion.constrained`) is keyed as sent (`sent_plain`), never as the constrained request; a constrained request
reads such an answer back, marked unconstrained, only where no constrained answer is stored.

Identical requests in flight at once are sent once: a request whose key another call (or an earlier request of the
same batch) is already sending waits for that answer and counts as a hit. What a run asks twice at the same moment,
such as one generator's rubric for a set that several verifiers verify, so costs one call whatever the scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.backends.base import (
    BaseBackend,
    Completion,
    GenerateRequest,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    LogprobRequest,
    LogprobResult,
    ScoreHead,
    ScoreRequest,
    ScoreResult,
    TokenLogprob,
    Usage,
    chat_to_json,
)
from harness.backends.local import LocalBackend
from harness.errors import HarnessError
from harness.paths import call_cache_path
from harness.redact import scrub_secrets

R = TypeVar("R")
T = TypeVar("T")

_BUSY_SECONDS = 60.0
"""How long a call waits for another process's write (SQLite's busy timeout)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
"""The call cache's tables (a run's `calls.sqlite` and an export hold them too: `harness.calllog`)."""


def cache_key(identity: dict[str, str], op: str, payload: dict, sample_index: int = 0) -> str:
    """Content address of one model call (one sample)."""
    blob = json.dumps(
        {"identity": identity, "op": op, "payload": payload, "sample": sample_index},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What `harness cache stats` prints."""

    path: Path
    entries: int
    size_bytes: int
    hits: int
    """Lifetime lookups answered from the cache."""
    misses: int
    """Lifetime lookups that had to call a backend."""
    by_model: dict[str, int]
    """Entries per model identity."""


class CacheError(HarnessError):
    """The call cache cannot be used: a corrupt file, a read-only location, a full disk."""

    corrupt: bool = False


class ReplayMiss(HarnessError):
    """A replay (`--replay FILE`) asked for a call its file holds no answer to."""


class CallCache:
    """A process-safe SQLite key-value store of successful model outputs.

    Every SQLite error becomes a `CacheError` that names the file and says what to do (clear a corrupt file,
    make the location writable, free disk space, or bypass the cache with `--no-cache`).

    Args:
        path: The database (default: the user's, `harness.paths.call_cache_path`).
        read_only: Open an existing file for reading only (a replay's, `--replay FILE`): nothing is stored or
            counted, and `CachedBackend` answers every call from it or stops (`ReplayMiss`).
    """

    def __init__(self, path: Path | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path) if path else call_cache_path()
        self.read_only = read_only
        self._lock = threading.Lock()
        if read_only:
            if not self.path.is_file():
                raise CacheError(f"replay file {self.path} not found; `harness cache export` writes one")
            with self._guarded():
                self._conn = self._open_read_only()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._error(exc) from None
        with self._guarded():
            self._conn = self._open()

    def _open_read_only(self) -> sqlite3.Connection:
        """Connect without writing anything, and check the file holds the `calls` table."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("SELECT key, model, value, created FROM calls LIMIT 1").fetchall()
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _open(self) -> sqlite3.Connection:
        """Connect and set the file up (WAL, the tables).

        Processes that open the same new file at once (the ranks of a training job, runs started together) can
        find it locked while one of them switches it to WAL: SQLite answers that at once, without waiting out its
        busy timeout. The setup is idempotent, so it is tried again, with a growing pause, for up to that timeout.
        """
        deadline = time.monotonic() + _BUSY_SECONDS
        pause = 0.01
        while True:
            conn = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout={int(_BUSY_SECONDS * 1000)}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(SCHEMA)
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def _error(self, exc: Exception) -> CacheError:
        text = str(exc) or type(exc).__name__
        low = text.lower()
        corrupt = "not a database" in low or "malformed" in low
        if self.read_only:
            return CacheError(f"replay file {self.path}: {text}; give a file `harness cache export` wrote")
        if corrupt:
            hint = "the file is corrupt: `harness cache clear --yes` deletes it (or run with --no-cache)"
        elif "readonly" in low or "read-only" in low or "unable to open" in low or "permission" in low:
            hint = "make it writable, point $HARNESS_CALL_CACHE elsewhere, or run with --no-cache"
        elif "full" in low or "no space" in low:
            hint = "the disk is full: free space, point $HARNESS_CALL_CACHE elsewhere, or run with --no-cache"
        else:
            hint = "point $HARNESS_CALL_CACHE elsewhere, or run with --no-cache"
        error = CacheError(f"call cache {self.path}: {text}; {hint}")
        error.corrupt = corrupt
        return error

    @staticmethod
    def delete_files(path: Path) -> None:
        """Remove a cache database and its WAL/shared-memory files (for a file too corrupt to open)."""
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)

    def get_many(self, keys: Sequence[str]) -> dict[str, object]:
        """The stored values of whichever `keys` are present (decoded JSON)."""
        found: dict[str, object] = {}
        with self._guarded():
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(f"SELECT key, value FROM calls WHERE key IN ({marks})", chunk)
                found.update((k, json.loads(v)) for k, v in rows)
        return found

    def put_many(self, items: Sequence[tuple[str, str, object]]) -> None:
        """Store (key, model label, value) triples; existing keys keep their first value."""
        if not items:
            return
        if self.read_only:
            raise CacheError(f"replay file {self.path} is read-only; nothing is stored in a replay")
        now = time.time()
        rows = [(k, model, scrub_secrets(json.dumps(v, ensure_ascii=False)), now) for k, model, v in items]
        with self._guarded():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany("INSERT OR IGNORE INTO calls VALUES (?, ?, ?, ?)", rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def count(self, *, hits: int = 0, misses: int = 0) -> None:
        """Add to the lifetime hit/miss counters (a read-only file keeps none)."""
        if self.read_only or (not hits and not misses):
            return
        with self._guarded():
            self._conn.executemany(
                "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                [("hits", hits), ("misses", misses)],
            )

    def stats(self) -> CacheStats:
        with self._guarded():
            entries = self._conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            counters = dict(self._conn.execute("SELECT name, value FROM counters"))
            by_model = dict(
                self._conn.execute("SELECT model, COUNT(*) FROM calls GROUP BY model ORDER BY 2 DESC")
            )
        size = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file())
        return CacheStats(
            self.path, entries, size, counters.get("hits", 0), counters.get("misses", 0), by_model
        )

    def clear(self, *, model: str | None = None) -> int:
        """Delete every entry (or those of one model label); returns how many were removed."""
        with self._guarded():
            if model is None:
                n = self._conn.execute("DELETE FROM calls").rowcount
                self._conn.execute("DELETE FROM counters")
            else:
                n = self._conn.execute("DELETE FROM calls WHERE model = ?", (model,)).rowcount
        with self._guarded():
            self._conn.execute("VACUUM")
        return n

    def close(self) -> None:
        with self._guarded():
            self._conn.close()


def _model_label(identity: dict[str, str]) -> str:
    return f"{identity.get('kind', '?')}:{identity.get('model', '?')}"


def _request_start(payload: Mapping[str, Any], limit: int = 60) -> str:
    """The start of a request's last message (a loglikelihood's context where it has none), quoted on one line."""
    messages = payload.get("messages") or []
    text = " ".join(str(messages[-1]["content"] if messages else payload.get("text", "")).split())
    return json.dumps(text if len(text) <= limit else text[:limit] + "...", ensure_ascii=False)


def _generate_payload(request: GenerateRequest) -> dict:
    p = request.params
    payload = {
        "messages": chat_to_json(request.messages),
        "temperature": p.temperature,
        "top_p": p.top_p,
        "max_tokens": p.max_tokens,
        "seed": None if p.greedy else p.seed,
        "stop": list(p.stop),
        "logprobs": p.logprobs,
    }
    # Later fields enter the key only when set, so entries written before they existed stay valid.
    if request.assistant_prefix:
        payload["prefix"] = request.assistant_prefix
    if p.min_tokens:
        payload["min_tokens"] = p.min_tokens
    if p.constraint is not None:
        payload["constraint"] = p.constraint.to_json()
    return payload


def _logprob_payload(request: LogprobRequest, candidates: list[str]) -> dict:
    payload = {
        "messages": chat_to_json(request.messages),
        "prefix": request.assistant_prefix,
        "candidates": candidates,
    }
    if request.branches:
        payload["branches"] = list(request.branches)
    return payload


def _stored_logprobs(values: dict[str, float]) -> dict[str, float | None]:
    return {c: (None if not math.isfinite(v) else v) for c, v in values.items()}


def _loaded_logprobs(stored: dict[str, float | None]) -> dict[str, float]:
    return {c: (-math.inf if v is None else v) for c, v in stored.items()}


def _loglikelihood_payload(request: LoglikelihoodRequest) -> dict:
    payload: dict[str, object] = {"text": request.text, "continuation": request.continuation}
    if request.messages:
        payload["messages"] = chat_to_json(request.messages)
    return payload


def _score_payload(request: ScoreRequest) -> dict:
    return {"messages": chat_to_json(request.messages), "head": request.head, "max_length": request.max_length}


def _stored_score(result: ScoreResult) -> dict:
    """What the cache keeps of a score: the value and the input's token counts (so a cached result's trace says
    what a computed one says)."""
    return {"score": result.score, "tokens": result.tokens, "kept": result.kept}


def _loaded_score(stored: dict) -> ScoreResult:
    return ScoreResult(float(stored["score"]), stored.get("tokens"), stored.get("kept"), cached=True)


def _sample_value(completion: Completion, i: int) -> object:
    """What the cache stores for sample i: the text, or a dict with the text, its token logprobs when they were
    asked for and `fresh_turn` when the text does not continue the request's prefill."""
    if completion.logprobs is None and completion.continues_prefix:
        return completion.texts[i]
    value: dict[str, object] = {"text": completion.texts[i]}
    if completion.logprobs is not None:
        value["logprobs"] = [t.to_json() for t in completion.logprobs[i]]
    if not completion.continues_prefix:
        value["fresh_turn"] = True
    return value


def _completion_from(values: list[object], *, with_logprobs: bool, cached: bool, usage: Usage,
                     constrained: bool = True) -> Completion:
    entries = [v if isinstance(v, dict) else {"text": v} for v in values]
    texts = tuple(e["text"] for e in entries)
    logprobs = None
    if with_logprobs:
        logprobs = tuple(tuple(TokenLogprob.from_json(t) for t in e["logprobs"]) for e in entries)
    fresh = any(e.get("fresh_turn") for e in entries)
    return Completion(texts, usage, None, cached=cached, logprobs=logprobs, continues_prefix=not fresh,
                      constrained=constrained)


async def _landed(waits: Sequence[tuple[int, asyncio.Future]], results: list[Any]) -> None:
    """Fill `results` with the answers the requests in `waits` waited for: a served answer as a cache hit (it cost
    this request nothing), a failure as it is (failures are never shared beyond the moment)."""
    for idx, future in waits:
        answer = await future
        if answer.ok:
            spent = {"usage": Usage()} if hasattr(answer, "usage") else {}
            answer = dataclasses.replace(answer, cached=True, **spent)
        results[idx] = answer


class CachedBackend(BaseBackend):
    """Wraps a backend so every call goes through the call cache; counts calls and hits.

    A `BaseBackend` itself, so judges and runners never see the difference. The wrapped
    backend is probed (`BaseBackend.probe`: a server's reachability, a local model's loading) once, before the first
    request the cache cannot answer, so a fully cached run needs neither the server nor the weights; a probe that
    fails raises its `HarnessError` to every caller, which stops the run.

    Every lookup answered (from the cache or by the backend, then stored) is also handed to `log` where one is set
    (a run's `calls.sqlite`: `harness.calllog.CallLog`). Over a read-only cache (a replay) a request the cache
    cannot answer raises `ReplayMiss`; the backend is never probed or called.
    """

    def __init__(self, backend: BaseBackend, cache: CallCache | None) -> None:
        self.backend = backend
        self.cache = cache
        self.kind = backend.kind
        self.model = backend.model
        self._identity = backend.identity()
        self.calls = 0
        """Requests this wrapper sent to the backend."""
        self.hits = 0
        """Requests answered entirely from the cache."""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        """Tokens the backend reported for the requests this wrapper sent (cache hits spend none)."""
        self._probe: asyncio.Future | None = None
        self._probe_ok = False
        self._flying: dict[tuple[str, ...], asyncio.Future] = {}
        """Cache keys of the requests being sent now -> the future of their answer."""
        self.log: Any = None
        """Where every answered lookup is recorded (`harness.calllog.CallLog`), or None."""

    @property
    def replaying(self) -> bool:
        """Whether every call must be answered by a read-only cache (`--replay FILE`)."""
        return self.cache is not None and self.cache.read_only

    def identity(self) -> dict[str, str]:
        return self._identity

    def check_score(self, head: ScoreHead) -> None:
        self.backend.check_score(head)

    def capabilities(self) -> dict[str, str]:
        return self.backend.capabilities()

    async def probe(self) -> None:
        """Probe the backend once (concurrent callers wait for, or re-raise, the same probe's outcome)."""
        if self._probe_ok:
            return
        task = self._probe
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = self._probe = asyncio.ensure_future(self.backend.probe())
        await asyncio.shield(task)
        self._probe_ok = True

    async def close(self) -> None:
        await self.backend.close()

    @property
    def local(self) -> bool:
        """Whether the model runs in this process (its weights take this machine's memory): `hf`, `vllm`."""
        return isinstance(self.backend, LocalBackend)

    @property
    def resident(self) -> bool:
        """Whether a local model's weights are in memory now (a server's never are)."""
        return isinstance(self.backend, LocalBackend) and self.backend.resident

    async def release(self) -> None:
        """Free a local model's memory until its next uncached request (a no-op for a server)."""
        if isinstance(self.backend, LocalBackend):
            await self.backend.release()

    def _spent(self, results: Sequence[Any]) -> None:
        for result in results:
            usage = getattr(result, "usage", None)
            if usage is not None:
                self.prompt_tokens += usage.prompt_tokens
                self.completion_tokens += usage.completion_tokens
            elif getattr(result, "kept", None) is not None:  # a reward model's score: the tokens it read
                self.prompt_tokens += result.kept

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        if self.cache is None:
            return await self._uncached(self.backend.generate, requests)
        payloads = [_generate_payload(r) for r in requests]
        keys = [
            tuple(cache_key(self._identity, "generate", payload, i) for i in range(r.params.n))
            for r, payload in zip(requests, payloads)
        ]
        # An answer the backend sent without the request's constraint (`Completion.constrained`) is kept under
        # keys of what was sent, never the constrained request's, and read back only where no constrained answer is.
        sent_plain = [{**payload, "sent_plain": True} if r.params.constraint is not None else None
                      for r, payload in zip(requests, payloads)]
        plain = [
            tuple(cache_key(self._identity, "generate", sent, i) for i in range(r.params.n)) if sent else ()
            for r, sent in zip(requests, sent_plain)
        ]

        def about() -> dict[str, tuple[dict, int]]:
            found = {k: (payload, i) for ks, payload in zip(keys, payloads) for i, k in enumerate(ks)}
            found.update((k, (sent, i)) for ks, sent in zip(plain, sent_plain) for i, k in enumerate(ks))
            return found

        def hit(idx: int, found: Mapping[str, object]) -> Completion | None:
            ks = keys[idx]
            stored = next((where for where in (ks, plain[idx]) if where and all(k in found for k in where)), None)
            if stored is None:
                return None
            return _completion_from([found[k] for k in stored], with_logprobs=requests[idx].params.logprobs > 0,
                                    cached=True, usage=Usage(), constrained=stored is ks)

        def keep(idx: int, completion: Completion, found: Mapping[str, object]
                 ) -> tuple[Completion, list[tuple[str, object]]]:
            wants_logprobs = requests[idx].params.logprobs > 0
            if not (completion.ok and len(completion.texts) == requests[idx].params.n
                    and (not wants_logprobs or completion.logprobs is not None)):
                return completion, []
            where = keys[idx] if completion.constrained else plain[idx]
            # Samples already cached keep their stored value, so a partly cached request stays stable.
            values = [found.get(k, _sample_value(completion, i)) for i, k in enumerate(where)]
            completion = _completion_from(values, with_logprobs=wants_logprobs, cached=False,
                                          usage=completion.usage, constrained=completion.constrained)
            return completion, [(k, v) for k, v in zip(where, values) if k not in found]

        return await self._keyed("generate", requests, keys, self.backend.generate, hit, keep, about,
                                 also=[k for ks in plain for k in ks])

    async def _uncached(self, call: Callable[[list[R]], Awaitable[list[T]]], requests: Sequence[R]) -> list[T]:
        """`call` the backend for every request (no call cache: nothing is read or kept)."""
        await self.probe()
        self.calls += len(requests)
        fresh = await call(list(requests))
        self._spent(fresh)
        return fresh

    async def _keyed(
        self,
        op: str,
        requests: Sequence[R],
        keys: Sequence[tuple[str, ...]],
        call: Callable[[list[R]], Awaitable[list[T]]],
        hit: Callable[[int, Mapping[str, object]], T | None],
        keep: Callable[[int, T, Mapping[str, object]], tuple[T, list[tuple[str, object]]]],
        about: Callable[[], Mapping[str, tuple[dict, int]]],
        *,
        also: Sequence[str] = (),
    ) -> list[T]:
        """Every cached operation `op`: request i's cache entries are `keys[i]` (one per sample; `also`: other keys
        read with them; `about()`: every key's payload and sample index). `hit(i, found)` answers request i from
        the entries read, or None; the rest are sent once (an identical request in flight is waited for, not sent
        again: `_board`), and `keep(i, result, found)` gives what request i returns and the (key, value) entries to
        store (none for a failure). The entries read and stored go to `log`; in a replay a request the entries do
        not answer raises `ReplayMiss` instead of being sent."""
        assert self.cache is not None
        found = self.cache.get_many([k for ks in keys for k in ks] + list(also))
        results: list[T | None] = [None] * len(requests)
        todo = []
        for idx in range(len(requests)):
            results[idx] = hit(idx, found)
            if results[idx] is None:
                todo.append(idx)
        log = self.log  # the same log throughout, however the run's recording changes meanwhile
        told = about() if log is not None or (todo and self.replaying) else {}
        if log is not None and found:
            log.add(self._identity, op, [(k, *told[k], v) for k, v in found.items()])
        if todo and self.replaying:
            first = keys[todo[0]]
            payload = told[first[0]][0] if first else {}
            raise ReplayMiss(f"replay file {self.cache.path} has no answer for {_model_label(self._identity)} {op} "
                             f"{_request_start(payload)}")
        mine, waits = self._board([keys[i] for i in todo], todo)
        self.hits += len(requests) - len(mine)
        self.calls += len(mine)
        self.cache.count(hits=len(requests) - len(mine), misses=len(mine))
        async with self._sending(mine, results):
            if mine:
                await self.probe()
                fresh = await call([requests[i] for i in mine])
                self._spent(fresh)
                label = _model_label(self._identity)
                to_store = []
                for idx, result in zip(mine, fresh):
                    results[idx], entries = keep(idx, result, found)
                    to_store += [(k, label, v) for k, v in entries]
                self.cache.put_many(to_store)
                if log is not None and to_store:
                    log.add(self._identity, op, [(k, *told[k], v) for k, _, v in to_store])
        await _landed(waits, results)
        return results  # type: ignore[return-value]

    def _board(self, flights: Sequence[tuple[str, ...]], todo: Sequence[int]
               ) -> tuple[dict[int, tuple[tuple[str, ...], asyncio.Future]], list[tuple[int, asyncio.Future]]]:
        """Split the requests `todo` (indices; `flights`: their cache keys, in the same order) the cache could not
        answer into those this call sends (index -> (keys, the future it resolves)) and those an identical request
        in flight already sends (index, the future of its answer)."""
        loop = asyncio.get_running_loop()
        mine: dict[int, tuple[tuple[str, ...], asyncio.Future]] = {}
        waits: list[tuple[int, asyncio.Future]] = []
        for idx, flight in zip(todo, flights):
            sending = self._flying.get(flight)
            if sending is not None and sending.get_loop() is loop:
                waits.append((idx, sending))
                continue
            future = self._flying[flight] = loop.create_future()
            mine[idx] = (flight, future)
        return mine, waits

    @contextlib.asynccontextmanager
    async def _sending(self, mine: dict[int, tuple[tuple[str, ...], asyncio.Future]], results: list[Any]):
        """Send `mine` inside the block (it fills `results`); after it, whoever waits on them gets their answer,
        or the block's exception."""
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            for idx, (flight, future) in mine.items():
                if self._flying.get(flight) is future:
                    del self._flying[flight]
                if future.done():
                    continue
                if results[idx] is not None:
                    future.set_result(results[idx])
                elif error is None or isinstance(error, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(error)
                    future.exception()  # retrieved here: only the waiters, if any, raise it

    async def _one_key_each(
        self,
        op: str,
        requests: Sequence[R],
        payloads: Sequence[dict],
        call: Callable[[list[R]], Awaitable[list[T]]],
        load: Callable[[R, object], T],
        store: Callable[[R, T], object | None],
    ) -> list[T]:
        """An operation with one cache entry per request (`next_token_logprobs`, `loglikelihood`, `score`) through
        `_keyed`: `load(request, stored)` answers from the entry, `store(request, result)` gives what to keep
        (None: a failure, never stored)."""
        if self.cache is None:
            return await self._uncached(call, requests)
        keys = [(cache_key(self._identity, op, payload),) for payload in payloads]

        def about() -> dict[str, tuple[dict, int]]:
            return {key: (payload, 0) for (key,), payload in zip(keys, payloads)}

        def hit(idx: int, found: Mapping[str, object]) -> T | None:
            (key,) = keys[idx]
            return load(requests[idx], found[key]) if key in found else None

        def keep(idx: int, result: T, found: Mapping[str, object]) -> tuple[T, list[tuple[str, object]]]:
            value = store(requests[idx], result)
            return result, [] if value is None else [(keys[idx][0], value)]

        return await self._keyed(op, requests, keys, call, hit, keep, about)

    async def next_token_logprobs(
        self, requests: Sequence[LogprobRequest], candidates: Sequence[str]
    ) -> list[LogprobResult]:
        cands = sorted(set(candidates))

        def load(request: LogprobRequest, stored: object) -> LogprobResult:
            if request.branches:  # a list of per-branch dicts
                branches = tuple(_loaded_logprobs(b) for b in stored)  # type: ignore[union-attr]
                return LogprobResult({}, None, cached=True, branches=branches)
            return LogprobResult(_loaded_logprobs(stored), None, cached=True)  # type: ignore[arg-type]

        def store(request: LogprobRequest, result: LogprobResult) -> object | None:
            n_branches = len(request.branches)
            if not result.ok or len(result.branches) != n_branches:
                return None
            return [_stored_logprobs(b) for b in result.branches] if n_branches else _stored_logprobs(result.logprobs)

        return await self._one_key_each(
            "next_token_logprobs",
            requests,
            [_logprob_payload(r, cands) for r in requests],
            lambda todo: self.backend.next_token_logprobs(todo, cands),
            load,
            store,
        )

    async def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
        def store(request: LoglikelihoodRequest, result: LoglikelihoodResult) -> object | None:
            if not result.ok or result.logprob is None or not math.isfinite(result.logprob):
                return None
            return {"logprob": result.logprob, "greedy": result.greedy, "tokens": result.tokens,
                    "truncated": result.truncated}

        def load(request: LoglikelihoodRequest, stored: Any) -> LoglikelihoodResult:
            return LoglikelihoodResult(float(stored["logprob"]), stored["greedy"], stored["tokens"],
                                       stored["truncated"], cached=True)

        return await self._one_key_each(
            "loglikelihood", requests, [_loglikelihood_payload(r) for r in requests], self.backend.loglikelihood,
            load, store,
        )

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        def store(request: ScoreRequest, result: ScoreResult) -> object | None:
            ok = result.ok and result.score is not None and math.isfinite(result.score)
            return _stored_score(result) if ok else None

        return await self._one_key_each(
            "score",
            requests,
            [_score_payload(r) for r in requests],
            self.backend.score,
            lambda request, stored: _loaded_score(stored),  # type: ignore[arg-type]
            store,
        )
