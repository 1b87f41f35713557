"""Derived seeds: every seed in a run comes from (run seed, item id, repeat index, ...), never from global state."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any printable parts, e.g. `derive_seed(run_seed, item_id, repeat)`.

    The same parts give the same seed on every machine and Python version (no `hash()` randomisation).
    """
    text = "\x1f".join(repr(p) if not isinstance(p, str) else p for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF
