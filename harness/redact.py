"""Credentials never reach a file or a log: redaction of URLs, argv, manifest values and every text we write.

Two shapes of secret are recognised wherever a string is written: the `user:password@` part of a URL
(`http://user:key@host/v1` -> `http://***@host/v1`) and the value of a query parameter that names a key or token
(`?api_key=...`, `&token=...`). API keys themselves live only in the environment (see `--api-key-env`); the
backend that reads one registers it (`register_secret`), and from then on it is masked wherever this process
writes text: server answers and messages as the backend receives them (so neither records nor the call cache
hold it), record lines, manifests and JSON artefacts, the call cache's values, stdout and stderr. A server that
echoes the key into an answer gets `***` in its place. Values shorter than `MIN_SECRET_CHARS` are not keys
(placeholders such as `EMPTY`) and are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "***"
MIN_SECRET_CHARS = 8
_SECRETS: set[str] = set()

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<name>[?&](?:api[_-]?key|key|token|access[_-]?token|secret|password|auth)=)(?P<value>[^&#\s]+)",
    re.IGNORECASE,
)


def register_secret(value: str) -> None:
    """Mask `value` (an API key read from the environment) in every text this process writes from now on."""
    if len(value) >= MIN_SECRET_CHARS:
        _SECRETS.add(value)


def scrub_secrets(text: str) -> str:
    """`text` with every registered secret replaced by `***` (cheap when none is registered or present)."""
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_tree(value: Any) -> Any:
    """A JSON-like value (a parsed server answer) with every registered secret masked in its strings and keys."""
    if isinstance(value, str):
        return scrub_secrets(value)
    if isinstance(value, dict):
        return {scrub_secrets(k) if isinstance(k, str) else k: scrub_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_tree(v) for v in value]
    return value


def holds_secret(data: bytes) -> bool:
    """Whether raw bytes may hold a registered secret: written plainly, or behind JSON's `\\u` escapes."""
    return bool(_SECRETS) and (b"\\u" in data or any(s.encode() in data for s in _SECRETS))


class RedactingStream:
    """A text stream (stdout, stderr) that masks the registered secrets in everything written to it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub_secrets(text) if _SECRETS else text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def redact_text(text: str) -> str:
    """`text` with registered secrets, URL credentials and secret-looking query values replaced by `***`."""
    text = scrub_secrets(text)
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
