"""Reading input files with errors that name the file and line: JSON lines, UTF-8 text, JSON documents; and
writing JSON that every parser reads (`strict_json`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.errors import ConfigError


def strict_json(value: Any, **options: Any) -> str:
    """`value` as standard JSON (`json.dumps` with `options`). Python writes NaN and infinities as `NaN` and
    `-Infinity`, which strict parsers (JavaScript's `JSON.parse`, jq, most non-Python tools) reject: they are
    written as `null` instead. Records name such values where they can (a label outside the top logprobs is
    listed as unranked), so a null here never stands for a real number."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_error(where: str, exc: json.JSONDecodeError) -> ConfigError:
    """The one message for invalid JSON: `FILE:LINE: invalid JSON (column C: what)`."""
    return ConfigError(f"{where}: invalid JSON (column {exc.colno}: {exc.msg})")


def utf8_error(where: str, exc: UnicodeDecodeError, raw: bytes | None = None) -> ConfigError:
    """The one message for bytes that are not UTF-8: `FILE[:LINE]: not UTF-8 text (byte 0xff at offset 7)`."""
    bad = (raw if raw is not None else exc.object)[exc.start : exc.start + 1]
    return ConfigError(f"{where}: not UTF-8 text (byte 0x{bad.hex()} at offset {exc.start}; save it as UTF-8)")


def read_text(path: Path) -> str:
    """A UTF-8 text file's content.

    Raises:
        ConfigError: naming the file when it cannot be read or is not UTF-8.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise utf8_error(f"{path}:{line}", exc) from None


def read_json(path: Path) -> Any:
    """A JSON document (UTF-8).

    Raises:
        ConfigError: naming the file (and line) when it is unreadable, not UTF-8 or not JSON.
    """
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise json_error(f"{path}:{exc.lineno}", exc) from None


def read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield `(where, value)` for each non-blank line; `where` is `FILE:LINE` for error messages.

    Raises:
        ConfigError: naming the file and line of the first line that is not UTF-8 or not valid JSON.
    """
    try:
        fh = Path(path).open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise utf8_error(where, exc, raw) from None
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise json_error(where, exc) from None
            yield where, value
