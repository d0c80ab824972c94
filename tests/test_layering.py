"""The layers of ARCHITECTURE.md hold: a module of src/dlx imports (at the top, inside a function or for typing only)
from its own layer or below, never up."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dlx"
LAYERS = {
    "__main__": 5,
    "cli": 4,
    "train": 3,
    "metrics": 2,
    "parallel": 2,
    "bench": 2,
    "evals": 2,
    "model": 1,
    "data": 1,
    "device": 0,
    "precision": 0,
    "atomic": 0,
    "errors": 0,
    "faults": 0,
    "__init__": 0,
}


def top_part(module: str) -> str:
    """dlx.train.config → train; dlx.device → device; dlx → __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] if node.module != "dlx" else [f"dlx.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [name for name in names if name == "dlx" or name.startswith("dlx.")]


def upward_imports(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        owner = path.relative_to(package).parts[0].removesuffix(".py")
        for module in imported_modules(path):
            if LAYERS[top_part(module)] > LAYERS[owner]:
                found.append(f"{path.relative_to(package)} imports {module}")
    return found


def test_every_package_has_a_layer():
    owners = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in PACKAGE.rglob("*.py")}
    assert owners <= set(LAYERS), owners - set(LAYERS)


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path):
    """parallel → train is the arrow the layering forbids; the scan reports it, also from inside a function."""
    (tmp_path / "parallel").mkdir()
    (tmp_path / "parallel" / "strategy.py").write_text("def f():\n    from dlx.train.config import RunConfig\n")
    (tmp_path / "model.py").write_text("from dlx import device, parallel\n")
    expected = ["model.py imports dlx.parallel", "parallel/strategy.py imports dlx.train.config"]
    assert upward_imports(tmp_path) == expected
