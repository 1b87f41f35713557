"""Reading JSONL input files with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.errors import ConfigError


def read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield `(where, value)` for each non-blank line; `where` is `FILE:LINE` for error messages.

    Raises:
        ConfigError: naming the file and line of the first line that is not valid JSON.
    """
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            yield where, value
