"""The items a run was evaluated on (prompts, candidate responses, policy conversations), read back from the
benchmark's data for the page, and the size bound every embedded text keeps.

Records hold scores and traces, not the prompts and responses: those are loaded again with the settings the run
recorded (data dir, limit, seed, loader options) and shown only when their fingerprint equals the run's (the same
items, presented the same way); otherwise the page says why they are missing. Nothing here calls a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.base import fingerprint
from harness.errors import ConfigError
from reports.results import benchmark

TEXT_CHARS = 20_000
"""A prompt, response, answer or reference longer than this is cut, with a note (the record keeps it whole)."""
RAW_CHARS = 4_000
"""A raw model output in a trace (a generator's rubric text, a verifier's or judge's answer) is cut beyond this."""
CUT_NOTE = "records.jsonl and the data files hold the whole text"


def cut(value: Any, limit: int) -> Any:
    """`value` with every string in it (inside lists and mappings too) cut to `limit` characters, each cut
    string ending in a note that says how much was left out."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return value[:limit] + f"\n\u2026 [{len(value) - limit:,} more characters cut: {CUT_NOTE}]"
    if isinstance(value, Mapping):
        return {str(k): cut(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [cut(v, limit) for v in value]
    return value


def item_json(item: Any) -> dict[str, Any]:
    """One item as the page shows it: pairwise and listwise `prompt` and `responses`; policy `messages`
    ([role, content] turns) and the `meta` its judge reads (reference, baseline answer, checklist, criteria,
    gold answer)."""
    if hasattr(item, "messages"):
        return {"messages": [[m.role, cut(m.content, TEXT_CHARS)] for m in item.messages],
                "meta": cut(dict(item.meta), TEXT_CHARS)}
    return {"prompt": cut(item.prompt, TEXT_CHARS), "responses": [cut(r, TEXT_CHARS) for r in item.responses],
            "meta": cut(dict(item.meta), TEXT_CHARS)}


def _options(manifest: Mapping[str, Any], name: str) -> dict[str, Any]:
    settings, config = manifest.get("settings") or {}, manifest.get("config") or {}
    options = settings.get("bench_options") or config.get("bench_options") or {}
    return dict(options.get(name) or {})


def load_items(manifest: Mapping[str, Any], *, data_dir: Path | None = None
               ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The items of every benchmark the run loaded, keyed by the dataset fingerprint the run recorded.

    Args:
        manifest: The run's manifest (its settings name the benchmarks, fingerprints, limit and seed).
        data_dir: Where the benchmark files are; default the run's own `data_dir` (else the Hugging Face Hub).

    Returns:
        (fingerprint -> item id -> `item_json`, benchmark -> why its items are not shown).
    """
    settings = manifest.get("settings") or {}
    config = manifest.get("config") or {}
    folder = data_dir or config.get("data_dir")
    found: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for name, expected in (settings.get("data") or {}).items():
        source = f"--data-dir {folder}" if folder else "the Hugging Face Hub"
        try:
            items = benchmark(name).load(data_dir=Path(folder) if folder else None, limit=settings.get("limit"),
                                         seed=int(settings.get("seed") or 0), **_options(manifest, name))
        except (ConfigError, OSError, ValueError, TypeError) as exc:
            missing[name] = f"the items could not be loaded from {source}: {exc}"
            continue
        if fingerprint(items) != expected:
            missing[name] = (f"the items under {source} are not the ones the run saw (fingerprint "
                             f"{fingerprint(items)}, the run's {expected}); pass --data-dir with the run's data")
            continue
        found[expected] = {item.id: item_json(item) for item in items}
    return found, missing
