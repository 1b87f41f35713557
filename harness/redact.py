"""Credentials never reach a file or a log: redaction of URLs, argv and manifest values.

Two shapes of secret are recognised wherever a string is written: the `user:password@` part of a URL
(`http://user:key@host/v1` -> `http://***@host/v1`) and the value of a query parameter that names a key or token
(`?api_key=...`, `&token=...`). API keys themselves live only in the environment (see `--api-key-env`) and are
scrubbed from server messages by the backend that reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "***"

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<name>[?&](?:api[_-]?key|key|token|access[_-]?token|secret|password|auth)=)(?P<value>[^&#\s]+)",
    re.IGNORECASE,
)


def redact_text(text: str) -> str:
    """`text` with URL credentials and secret-looking query values replaced by `***`."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['name']}{MASK}", text)


def redact(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings, scalars) with every string redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [redact(v) for v in value]
    return value
