"""Where the harness keeps its files: one user cache dir, overridable by `HARNESS_CACHE_DIR`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The user cache dir (`$HARNESS_CACHE_DIR`, else the platform's cache dir), created on demand."""
    override = os.environ.get("HARNESS_CACHE_DIR")
    if override:
        path = Path(override).expanduser()
    else:
        from platformdirs import user_cache_dir

        path = Path(user_cache_dir("dynamicrubric-harness"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Converted local checkpoints (one folder per alias)."""
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def call_cache_path() -> Path:
    """The SQLite call cache (`$HARNESS_CALL_CACHE` overrides the file)."""
    override = os.environ.get("HARNESS_CALL_CACHE")
    return Path(override).expanduser() if override else cache_dir() / "calls.sqlite"
