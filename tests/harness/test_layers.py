"""The low layer of `harness/` imports nothing above it; only `harness.commands` reaches up.

Checked twice: statically (every import statement in every low-layer module, function-level imports included) and
at run time (importing every low-layer module in a fresh interpreter loads none of the upper packages).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UPPER = ("judges", "benchmarks", "reports", "training", "harness.commands")


def _modules(package: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _low_layer() -> dict[str, Path]:
    # `python -m harness` (harness/__main__.py) is an entry point onto the CLI, not part of the layer.
    return {
        n: p
        for n, p in _modules(ROOT / "harness").items()
        if not n.startswith("harness.commands") and n != "harness.__main__"
    }


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from harness import commands` names the package through its alias
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _is_upper(module: str) -> bool:
    return any(module == u or module.startswith(u + ".") for u in UPPER)


def test_low_layer_modules_import_nothing_above_them() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for name, path in _low_layer().items()
        for line, module in _imports(path)
        if _is_upper(module)
    ]
    assert len(_low_layer()) > 15  # the scan sees the layer (errors, registry, backends, cache, ...)
    assert offenders == []


def test_importing_the_low_layer_loads_no_upper_package() -> None:
    names = sorted(_low_layer())
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"upper = {UPPER!r}\n"
        "print(sorted(m for m in sys.modules if any(m == u or m.startswith(u + '.') for u in upper)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_upper_packages_never_import_the_commands() -> None:
    """judges/, benchmarks/, reports/ and training/ build on the low layer, never on the CLI and its verbs."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for package in ("judges", "benchmarks", "reports", "training")
        for path in _modules(ROOT / package).values()
        for line, module in _imports(path)
        if module == "harness.commands" or module.startswith("harness.commands.")
    ]
    assert offenders == []


def test_the_scan_catches_a_function_level_import(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from judges import load_evaluator\n    return load_evaluator\n")
    assert [m for _, m in _imports(module) if _is_upper(m)] == ["judges", "judges.load_evaluator"]


PACKAGES = ("harness", "harness.commands", "benchmarks", "judges", "reports", "training")


def _package_of(module: str) -> str | None:
    """The package a module belongs to (`harness.commands` apart from the low layer), or None (third party)."""
    for package in sorted(PACKAGES, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def _package_graph() -> dict[str, dict[str, list[str]]]:
    """Package -> the packages its modules import (function-level imports included) -> where."""
    graph: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for top in ("harness", "benchmarks", "judges", "reports", "training"):
        for name, path in _modules(ROOT / top).items():
            if name == "harness.__main__":  # the entry point onto the CLI, not part of the low layer
                continue
            source = _package_of(name)
            for line, module in _imports(path):
                target = _package_of(module)
                if target is not None and target != source and source is not None:
                    graph[source].setdefault(target, []).append(f"{path.relative_to(ROOT)}:{line}")
    return graph


def test_benchmarks_never_import_judges() -> None:
    """A benchmark owns its data and its scoring; judges (what calls a model) build on benchmarks, not back."""
    assert _package_graph()["benchmarks"].get("judges", []) == []


def test_no_package_forms_an_import_circle() -> None:
    graph = _package_graph()
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(package: str, path: list[str]) -> None:
        if state.get(package) == "done":
            return
        assert state.get(package) != "open", f"import circle: {' -> '.join([*path, package])}: " + "; ".join(
            graph[a][b][0] for a, b in zip([*path, package], [*path, package][1:]) if b in graph[a])
        state[package] = "open"
        for target in graph[package]:
            visit(target, [*path, package])
        state[package] = "done"
        order.append(package)

    for package in PACKAGES:
        visit(package, [])
    assert order.index("benchmarks") < order.index("judges") < order.index("harness.commands")
