"""A training output bound to its settings: the run store's binding rule for checkpoint directories.

A checkpoint directory holds one training job's result, and `dr_manifest.json` in it records the job's
*settings*: everything that changes what it trains (the trainer's kind, its resolved config less the output dir and
the backend's runtime knobs, the identities of the models it starts from and is rewarded by, the data's
fingerprint). The manifest is written with status `running` before training starts and `finished` once the
checkpoint is saved, so an interrupted job is bound too.

Checking a directory against a job's settings (`check`) gives one of four states: `new` (no directory, or an empty
one), `unfinished` or `finished` (the same settings), or `other` (other settings, a manifest that cannot be read or
was written by another version, files that are no harness checkpoint). The caller refuses `other` before any model
call, naming every difference (`refusal`), unless `--overwrite` discards the directory (`discard`); a directory
that holds files but no manifest is never discarded, since nothing says it is a checkpoint of ours.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.errors import ConfigError
from harness.redact import redact
from harness.runstore import (
    canonical_settings,
    git_commit,
    package_versions,
    settings_diff,
    utc_now,
    write_json_atomic,
)

MANIFEST = "dr_manifest.json"
FORMAT = 1
"""Bumped when the manifest's layout changes; checkpoints written under another format are not reused."""


@dataclass(frozen=True, slots=True)
class Binding:
    """How a checkpoint directory stands against a job's settings."""

    path: Path
    state: Literal["new", "unfinished", "finished", "other"]
    changes: tuple[str, ...] = ()
    """`other`: every differing setting (`name: old -> new`), or why the directory cannot be reused."""
    foreign: bool = False
    """`other`: the directory holds files but no manifest, so `--overwrite` may not discard it."""


def digest(settings: Mapping[str, Any]) -> str:
    """A short hash of the canonical settings: the identity of a checkpoint that is not trained yet."""
    text = json.dumps(canonical_settings(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check(path: Path, settings: Mapping[str, Any]) -> Binding:
    """Compare the checkpoint directory `path` with the settings of the job that would train into it."""
    path = Path(path)
    manifest = path / MANIFEST
    if not path.exists():
        return Binding(path, "new")
    if not path.is_dir():
        return Binding(path, "other", ("it exists and is not a directory",), foreign=True)
    if not manifest.is_file():
        if any(path.iterdir()):
            return Binding(path, "other", (f"it holds files but no {MANIFEST}, so it is no harness checkpoint",),
                           foreign=True)
        return Binding(path, "new")
    previous = _read(manifest)
    if isinstance(previous, str):
        return Binding(path, "other", (previous,))
    changes = settings_diff(previous["settings"], canonical_settings(settings))
    if changes:
        return Binding(path, "other", tuple(changes))
    return Binding(path, "finished" if previous.get("status") == "finished" else "unfinished")


def _read(manifest: Path) -> dict[str, Any] | str:
    """The manifest, or why it cannot be compared."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST} cannot be read ({exc})"
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("settings"), dict):
        found = data.get("format", "none") if isinstance(data, dict) else "none"
        return f"it was trained by another version of the harness (manifest format {found}, this one writes {FORMAT})"
    return data


def read(path: Path) -> dict[str, Any]:
    """The manifest of the finished checkpoint in `path` (`check` found it so)."""
    found = _read(Path(path) / MANIFEST)
    if isinstance(found, str):
        raise ConfigError(f"{path}: {found}")
    return found


def refusal(bindings: Sequence[Binding]) -> ConfigError:
    """One error line for the directories that hold other settings, naming every difference."""
    parts = []
    for b in bindings:
        shown = "; ".join(b.changes[:6]) + (f"; and {len(b.changes) - 6} more" if len(b.changes) > 6 else "")
        parts.append(f"{b.path} holds a checkpoint trained with other settings ({shown})" if not b.foreign
                     else f"{b.path} cannot take a checkpoint ({shown})")
    if any(b.foreign for b in bindings):
        how = "choose a new or empty --output-dir"
    else:
        how = "train into a new --output-dir, or pass --overwrite to discard " + ("it" if len(parts) == 1 else "them")
    return ConfigError("; ".join(parts) + f"; {how}")


def discard(binding: Binding) -> None:
    """Delete the checkpoint directory (`--overwrite`); a foreign directory is refused instead.

    Raises:
        ConfigError: for a directory that holds no harness checkpoint, or one that cannot be deleted.
    """
    if binding.foreign:
        raise refusal([binding])
    try:
        shutil.rmtree(binding.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot discard {binding.path}: {exc.strerror or exc}") from None


def start(path: Path, *, kind: str, settings: Mapping[str, Any], config: Mapping[str, Any],
          parents: Mapping[str, Any]) -> dict[str, Any]:
    """Write the manifest of a job about to train into `path` (status `running`); returns it."""
    data = {
        "format": FORMAT,
        "kind": kind,
        "checkpoint": str(path),
        "status": "running",
        "argv": redact(sys.argv[1:]),
        "settings": canonical_settings(settings),
        "parents": redact(dict(parents)),
        "config": redact(dict(config)),
        "versions": package_versions(),
        "git": git_commit(),
        "started": utc_now(),
        "ended": None,
    }
    Path(path).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(path) / MANIFEST, data)
    return data


def finish(path: Path, manifest: dict[str, Any], *, status: str, **fields: Any) -> dict[str, Any]:
    """Write the manifest's end: `status` (`finished`, `failed`, `interrupted`) and more `fields`; returns it."""
    data = {**manifest, **redact(fields), "status": status, "ended": utc_now()}
    write_json_atomic(Path(path) / MANIFEST, data)
    return data
