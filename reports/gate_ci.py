"""The regression gate's verdicts for CI: JUnit XML for a test report, and a short Markdown summary.

Both read the dict `Comparison.to_json()` gives (what `compare.json` holds), so a stored comparison renders too.
Values print in points (x 100, the scale the gate's margins use; nDCG x 100 as well). Fields that a comparison may
lack (`half_width`, `items_needed`) are shown where present.

JUnit: one testcase per cell, classname the row label and name `BENCHMARK.METRIC`. A regression is a failure, an
incomplete or unscored cell an error, an underpowered one skipped; an improvement or no significant change passes,
and any other verdict is an error. Runs that are not comparable add a testcase `comparability` in error that lists
the differences. `write_ci_reports` writes both for `harness compare --junit FILE --summary FILE`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.runstore import write_text_atomic
from reports.compare import UNGATED

PASSING = ("improvement", "no significant change")
UNDERPOWERED = "underpowered"
SUMMARY_CELLS = 10
"""Cells the Markdown summary shows at most; compare.md has all of them."""

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_WHY = {
    "regression": "the whole interval lies beyond the margin on the worse side",
    "incomplete": "a run holds failures of the backend that a rerun of its command retries",
    "unscored": "no item was scored on both sides",
    UNDERPOWERED: "the interval is wider than twice the margin",
}


def _xml(text: str) -> str:
    """`text` with the characters XML 1.0 cannot hold replaced (ElementTree would write them as they are)."""
    return _NOT_XML.sub("\ufffd", text)


def _points(value: float | None, sign: str = "") -> str:
    return "-" if value is None else f"{value * 100:{sign}.2f}"


def _level(result: Mapping[str, Any]) -> str:
    """The interval's coverage as a label (`95%`)."""
    return f"{1 - result.get('config', {}).get('alpha', 0.05):.0%}"


def cell_numbers(cell: Mapping[str, Any], level: str = "95%") -> str:
    """One line with a cell's numbers: values, difference and interval (points), margin, items, failures."""
    parts = [f"base {_points(cell['base'])}", f"candidate {_points(cell['candidate'])}",
             f"diff {_points(cell['diff'], '+')}"]
    if cell.get("ci_low") is not None and cell.get("ci_high") is not None:
        parts.append(f"{level} CI [{_points(cell['ci_low'], '+')}, {_points(cell['ci_high'], '+')}]")
    parts += [f"margin {cell['margin']:g} (points)", f"items paired {cell['paired']}/{cell['n_items']}",
              f"failed B/C {cell['base_failed']}/{cell['candidate_failed']}"]
    to_retry = (cell.get("base_to_retry", 0), cell.get("candidate_to_retry", 0))
    if any(to_retry):
        parts.append(f"to retry B/C {to_retry[0]}/{to_retry[1]}")
    if cell.get("half_width") is not None:
        parts.append(f"half-width {_points(cell['half_width'])}")
    if cell.get("items_needed") is not None:
        parts.append(f"items needed {cell['items_needed']}")
    return ", ".join(parts)


def junit_xml(result: Mapping[str, Any]) -> str:
    """The comparison as a JUnit XML document (see the module docstring)."""
    level = _level(result)
    suite = ET.Element("testsuite", name="harness compare")
    props = ET.SubElement(suite, "properties")
    for name in ("base", "candidate", "exit_code"):
        ET.SubElement(props, "property", name=name, value=_xml(str(result.get(name, ""))))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    differences = list(result.get("differences") or [])
    if differences:
        case = ET.SubElement(suite, "testcase", classname="harness compare", name="comparability")
        error = ET.SubElement(case, "error", type="not comparable", message=_xml(
            f"runs are not comparable ({len(differences)} difference(s)): " + "; ".join(differences)))
        error.text = _xml("\n".join(differences))
        counts["tests"] += 1
        counts["errors"] += 1
    for cell in result.get("cells", []):
        verdict = cell["verdict"]
        case = ET.SubElement(suite, "testcase", classname=_xml(cell["row"]),
                             name=_xml(f"{cell['benchmark']}.{cell['metric']}"))
        numbers = _xml(cell_numbers(cell, level))
        counts["tests"] += 1
        if verdict in PASSING:
            ET.SubElement(case, "system-out").text = f"{verdict}: {numbers}"
            continue
        tag, count = (("failure", "failures") if verdict == "regression"
                      else ("skipped", "skipped") if verdict == UNDERPOWERED else ("error", "errors"))
        why = _WHY.get(verdict, "not a verdict the gate passes")
        message = _xml(f"{verdict} ({why}): {numbers}")
        child = ET.SubElement(case, tag, message=message)
        if tag != "skipped":
            child.set("type", _xml(verdict))
        child.text = message
        counts[count] += 1
    suite.attrib.update({k: str(v) for k, v in counts.items()})
    root = ET.Element("testsuites", {k: str(v) for k, v in counts.items() if k != "skipped"})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _beyond(cell: Mapping[str, Any]) -> float:
    """Points by which the interval's nearer bound lies past the margin on either side (for a regression, on its
    worse side: the interval cannot lie past both)."""
    if cell.get("ci_low") is None or cell.get("ci_high") is None:
        return 0.0
    return max(-cell["margin"] - cell["ci_high"] * 100, cell["ci_low"] * 100 - cell["margin"])


def _rank(cell: Mapping[str, Any]) -> tuple[int, float]:
    """Worst first: regressions by how far they clear the margin, then cells not gated, underpowered ones (widest
    first), the rest in the comparison's order."""
    verdict = cell["verdict"]
    if verdict == "regression":
        return 0, -_beyond(cell)
    if verdict == UNDERPOWERED:
        return 2, -(cell.get("half_width") or 0.0)
    return (3, 0.0) if verdict in PASSING else (1, 0.0)


def _md(text: object) -> str:
    """`text` safe in a Markdown table cell: no HTML, no column breaks, one line."""
    shown = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return " ".join(shown.splitlines())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _outcome(code: int) -> str:
    """The first line's verdict for an exit code (see `reports.compare`)."""
    why = {1: "regression", 2: "runs not comparable", 3: "cells not gated"}.get(code, "")
    return "**Regression gate: passed**" if code == 0 else f"**Regression gate: FAILED** ({why or 'error'})"


def summary_markdown(result: Mapping[str, Any]) -> str:
    """A few lines for a CI step summary or a PR comment: the outcome and exit code, a count per failure class
    present, and the worst cells (at most `SUMMARY_CELLS`; compare.md has them all)."""
    cells = list(result.get("cells", []))
    differences = list(result.get("differences") or [])
    code = int(result["exit_code"])
    power_gated = bool(result.get("config", {}).get("require_power"))
    lines = [f"{_outcome(code)}, exit code {code}: {_plural(len(cells), 'cell')}, "
             f"{_md(result.get('candidate', 'CAND'))} against {_md(result.get('base', 'BASE'))}"]
    if differences:
        lines.append(f"- Not comparable: {_plural(len(differences), 'difference')}")
        lines += [f"  - {_md(d)}" for d in differences[:5]]
        if len(differences) > 5:
            lines.append(f"  - {len(differences) - 5} more in compare.md")
    for verdict, label in (("regression", "Regressions"), ("incomplete", "Incomplete"),
                           ("unscored", "Unscored"), (UNDERPOWERED, "Underpowered")):
        count = sum(c["verdict"] == verdict for c in cells)
        if count:
            gated = "; exit 3 with --require-power" if verdict == UNDERPOWERED and power_gated else ""
            lines.append(f"- {label}: {_plural(count, 'cell')} ({_WHY[verdict]}{gated})")
    other = sorted({c["verdict"] for c in cells} - {*PASSING, *UNGATED, UNDERPOWERED, "regression"})
    for verdict in other:
        lines.append(f"- {_md(verdict)}: {_plural(sum(c['verdict'] == verdict for c in cells), 'cell')}")
    if len(lines) > 1:
        lines.insert(1, "")
    if not cells:
        return "\n".join(lines) + "\n"
    shown = sorted(cells, key=_rank)[:SUMMARY_CELLS]
    power = any(c.get("half_width") is not None for c in shown)
    head = ["Verdict", "Row", "Cell", "Base", "Cand", f"Diff [{_level(result)} CI] (points)", "Margin", "Paired",
            "Failed B/C"] + (["Half-width", "Items needed"] if power else [])
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in shown:
        interval = ("" if c.get("ci_low") is None or c.get("ci_high") is None
                    else f" [{_points(c['ci_low'], '+')}, {_points(c['ci_high'], '+')}]")
        verdict = c["verdict"] if c["verdict"] in PASSING else f"**{c['verdict']}**"
        row = [_md(verdict), _md(c["row"]), _md(f"{c['benchmark']}.{c['metric']}"), _points(c["base"]),
               _points(c["candidate"]), _points(c["diff"], "+") + interval, f"{c['margin']:g}",
               f"{c['paired']}/{c['n_items']}", f"{c['base_failed']}/{c['candidate_failed']}"]
        if power:
            needed = c.get("items_needed")
            row += [_points(c.get("half_width")), "-" if needed is None else str(needed)]
        lines.append("| " + " | ".join(row) + " |")
    if len(cells) > len(shown):
        lines += ["", f"{_plural(len(cells) - len(shown), 'more cell')} in compare.md"]
    return "\n".join(lines) + "\n"


def write_ci_reports(result: Mapping[str, Any], *, junit: Path | None = None, summary: Path | None = None) -> None:
    """Write `junit_xml` to `junit` and `summary_markdown` to `summary` (each where given), atomically, making
    the parent folder where it is missing."""
    for path, render in ((junit, junit_xml), (summary, summary_markdown)):
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, render(result))
