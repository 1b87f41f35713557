"""A figure of panels on disk: the folder that holds one run per panel (fig2: OUT/fig2a, OUT/fig2b) and the
panels.json that marks it as such.

`harness run FIGURE` writes panels.json before its panels run (`mark_panels`), so a partial figure still reports;
`harness report`, `compare`, `view` and `--explain` ask `panels_of` whether a folder is a figure before reading it
as a run. Nothing here reads records or renders a table (`reports.report.write_panel_reports` does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError
from harness.runstore import write_json_atomic

if TYPE_CHECKING:
    from reports.tables import TableSpec

PANELS_FILE = "panels.json"
"""Marks a folder as a figure of panels: {"table": NAME, "panels": [panel table names]}."""


def panels_of(folder: Path) -> dict[str, Any] | None:
    """A figure folder's panels.json ({"table", "panels"}), or None for any other folder.

    Raises:
        ConfigError: for a panels.json that cannot be read as one.
    """
    path = Path(folder) / PANELS_FILE
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        return {"table": str(found["table"]), "panels": [str(p) for p in found["panels"]]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a figure's panels file ({exc!r})") from None


def mark_panels(folder: Path, spec: TableSpec) -> None:
    """Write `folder`/panels.json for the figure `spec` (before its panels run, so a partial figure reports)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(folder) / PANELS_FILE, {"table": spec.name, "panels": list(spec.panels)})


def panel_of_row(folder: Path, row: str) -> Path:
    """The panel run of a figure folder that holds row `row`.

    Raises:
        ConfigError: when `folder` is no figure, or no panel has the row (listing the rows they have).
    """
    found = panels_of(folder)
    if found is None:
        raise ConfigError(f"{folder}: not a figure of panels (no {PANELS_FILE})")
    labels = {}
    for name in found["panels"]:
        manifest = Path(folder) / name / "manifest.json"
        rows = json.loads(manifest.read_text(encoding="utf-8")).get("rows", {}) if manifest.is_file() else {}
        labels.update(dict.fromkeys(rows, name))
    if row not in labels:
        raise ConfigError(f"{folder}: no row {row!r} in its panels; rows: {', '.join(labels) or '(none yet)'}")
    return Path(folder) / labels[row]
