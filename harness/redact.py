"""Credentials never reach a file or a log: redaction of URLs, argv, manifest values and every text we write.

A URL is shown or stored only as `mask_url` writes it: its `user:password@` part and the value of every query
parameter and fragment parameter become `***` (`http://user:key@host/v1?api_key=sk-1` ->
`http://***@host/v1?api_key=***`). `redact_text` masks every URL in a text that way, and the value of a parameter
that names a key or token outside a URL (`&token=...`). API keys themselves live only in the environment (see
`--api-key-env`); the backend that reads one registers it (`register_secret`), as it registers the password and
the key-like query values of its server's URL (`register_url_secrets`), and from then on they are masked wherever
this process writes text: server answers and messages as the backend receives them (so neither records nor the
call cache hold them), record lines, manifests and JSON artefacts, the call cache's values, stdout and stderr. A
server that echoes a key into an answer gets `***` in its place. Values shorter than `MIN_SECRET_CHARS` are not
keys (placeholders such as `EMPTY`) and are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"
MIN_SECRET_CHARS = 8
_SECRETS: set[str] = set()

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>\\]*[^\s'\"<>\\.,;:!?)\]}]")
"""A URL in running text (trailing punctuation left out)."""
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<name>[?&](?:api[_-]?key|key|token|access[_-]?token|secret|password|auth)=)(?P<value>[^&#\s'\"<>\\]+)",
    re.IGNORECASE,
)
_SECRET_NAME = re.compile(r"key|token|secret|pass|auth|sig|cred|session", re.IGNORECASE)
"""A query parameter whose name holds one of these carries a credential (`api_key`, `X-Api-Key`, `sig`, ...)."""


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


def register_url_secrets(url: str) -> None:
    """Mask, from now on, the password of `url`'s `user:password@` part and the values of its query parameters
    whose names say they hold a credential (`_SECRET_NAME`), wherever this process writes text."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return
    if password:
        register_secret(password)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_NAME.search(name):
            register_secret(value)


def mask_url(url: str) -> str:
    """`url` as it may be shown or stored: the `user:password@` part and the value of every query (and fragment)
    parameter replaced by `***`; names, host, port and path kept. A string that does not parse as a URL is
    masked as text is (`redact_text`)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a malformed port
    except ValueError:
        return _redact_fragments(scrub_secrets(url))
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    return scrub_secrets(urlunsplit((parts.scheme, netloc, parts.path, _masked_pairs(parts.query),
                                     _masked_pairs(parts.fragment))))


def _masked_pairs(query: str) -> str:
    """A query string with every value replaced by `***` (`a=1&b` -> `a=***&b`)."""
    if not query:
        return ""
    pairs = (part.partition("=") for part in query.split("&"))
    return "&".join(f"{name}={MASK}" if sep else name for name, sep, _ in pairs)


def _redact_fragments(text: str) -> str:
    """Credentials in URL-like fragments that `mask_url` cannot parse, and key-like `name=value` pairs."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['name']}{MASK}", text)


def redact_text(text: str) -> str:
    """`text` with registered secrets replaced by `***`, every URL in it masked (`mask_url`) and key-like query
    values outside a URL (`&token=...`) masked."""
    text = _URL.sub(lambda m: mask_url(m.group()), scrub_secrets(text))
    return _redact_fragments(text)


def redact(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings, scalars) with every string redacted, mapping keys
    included (a server URL can be a key: requests per replica)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {redact_text(k) if isinstance(k, str) else k: redact(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [redact(v) for v in value]
    return value
