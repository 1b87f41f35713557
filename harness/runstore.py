"""Run store primitives: a run directory with `manifest.json` and append-only JSONL record logs with resume.

A record log holds one JSON object per line. Each record has a key (a tuple of some of its fields); when a key
appears more than once the last line wins, so retrying a failed record appends instead of rewriting. A crash can
leave a torn last line: it is detected, reported and cut off when the log is reopened, never duplicated. A malformed
line anywhere else is an error that names the file and line.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

Key = tuple

_VERSIONED = ("dynamicrubric-harness", "torch", "transformers", "vllm", "openai", "trl", "datasets", "numpy")


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
            ["git", "-C", str(src), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
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


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)


class Manifest:
    """`manifest.json`: resolved config, package versions, git commit, command, start and end times.

    Resuming a run keeps the first start time and records each session in `sessions`.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def start(self, *, command: str, config: dict[str, Any], extra: dict[str, Any] | None = None) -> dict:
        previous = self.read() if self.path.exists() else None
        now = utc_now()
        data = {
            "command": command,
            "argv": sys.argv[1:],
            "config": config,
            "versions": package_versions(),
            "git": git_commit(),
            "started": previous["started"] if previous else now,
            "ended": None,
            "status": "running",
            "sessions": (previous or {}).get("sessions", []) + [{"started": now, "ended": None}],
            **(extra or {}),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(self.path, data)
        return data

    def finish(self, *, status: str = "finished", summary: dict[str, Any] | None = None) -> None:
        data = self.read()
        now = utc_now()
        data["ended"] = now
        data["status"] = status
        data["sessions"][-1]["ended"] = now
        if summary is not None:
            data["summary"] = summary
        _write_json_atomic(self.path, data)

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{self.path}: cannot read manifest ({exc})") from exc


class RecordLog:
    """An append-only JSONL file of records, keyed by `key_fields`, resumable after a crash."""

    def __init__(self, path: Path, key_fields: Sequence[str]) -> None:
        self.path = Path(path)
        self.key_fields = tuple(key_fields)
        self.torn_line_dropped = False
        """True when opening cut off a torn last line left by a crash."""
        self._latest: dict[Key, dict] = {}
        self._lines = 0
        self._load()
        self._fh = None

    def key(self, record: dict) -> Key:
        try:
            return tuple(record[f] for f in self.key_fields)
        except KeyError as exc:
            raise ConfigError(
                f"{self.path}: record lacks key field {exc.args[0]!r}: {record!r:.200}"
            ) from exc

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        # Every record is written as one line ending in a newline; bytes after the last newline are a torn write.
        tail = lines.pop()
        for lineno, raw in enumerate(lines, start=1):
            if raw.strip():
                self._remember(self._parse(raw, lineno))
        if tail.strip():
            try:
                record = self._parse(tail, len(lines) + 1)
            except ConfigError:
                self.torn_line_dropped = True
                with self.path.open("r+b") as fh:
                    fh.truncate(len(data) - len(tail))
            else:
                self._remember(record)
                with self.path.open("ab") as fh:
                    fh.write(b"\n")

    def _parse(self, raw: bytes, lineno: int) -> dict:
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{self.path}:{lineno}: malformed record line ({exc})") from exc
        if not isinstance(record, dict):
            raise ConfigError(f"{self.path}:{lineno}: record is not a JSON object")
        return record

    def _remember(self, record: dict) -> None:
        self._latest[self.key(record)] = record
        self._lines += 1

    def __contains__(self, key: Key) -> bool:
        return key in self._latest

    def get(self, key: Key) -> dict | None:
        return self._latest.get(key)

    def records(self) -> list[dict]:
        """The latest record of every key, in first-seen order."""
        return list(self._latest.values())

    def __iter__(self) -> Iterator[dict]:
        return iter(self.records())

    def __len__(self) -> int:
        return len(self._latest)

    @property
    def superseded(self) -> int:
        """Lines whose key was written again later."""
        return self._lines - len(self._latest)

    def append(self, records: Iterable[dict]) -> None:
        """Append records (one line each) and flush, so a crash loses at most the line being written."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        for record in records:
            self._fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            self._remember(record)
        self._fh.flush()

    def compact(self) -> None:
        """Rewrite the file atomically with one line per key (the latest), dropping superseded lines."""
        self.close()
        if not self.superseded:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for record in self._latest.values():
                fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._lines = len(self._latest)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RecordLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunDir:
    """A run directory: `manifest.json`, `records.jsonl` and whatever reports render beside them."""

    def __init__(self, path: Path, *, key_fields: Sequence[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.manifest = Manifest(self.path / "manifest.json")
        self.records = RecordLog(self.path / "records.jsonl", key_fields)
