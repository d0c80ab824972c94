"""The layers of ARCHITECTURE.md hold: a module of src/dlx imports (at the top, inside a function or for typing only)
from its own layer or below, never up; and no two modules import each other, directly or round a loop."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dlx"
LAYERS = {
    "__main__": 6,
    "cli": 5,
    "bench": 4,
    "train": 3,
    "metrics": 2,
    "parallel": 2,
    "evals": 2,
    "view": 2,
    "model": 1,
    "data": 1,
    "device": 0,
    "precision": 0,
    "atomic": 0,
    "errors": 0,
    "faults": 0,
    "yamlfile": 0,
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
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "trainer.py").write_text("from dlx.bench.measure import measure_point\n")
    expected = [
        "model.py imports dlx.parallel",
        "parallel/strategy.py imports dlx.train.config",
        "train/trainer.py imports dlx.bench.measure",
    ]
    assert upward_imports(tmp_path) == expected


def module_names(root: Path) -> dict[str, Path]:
    """Every module below `root` by dotted name (a package by its own name, not `.__init__`)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_edges(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `module` imports anywhere in its text (relative imports resolved; `from a import
    b` counts b when b is a module, else a). A package importing its own submodule is no edge of a loop here."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" if base else alias.name for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                targets.add(name)
    return targets


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of modules that import each other round a loop (strongly connected components of two or more),
    each sorted, in order of their first member."""
    known = module_names(root)
    edges = {module: import_edges(module, path, known) for module, path in known.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(edges[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(known) + 100))
    try:
        for module in sorted(known):
            if module not in order:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(groups)


def test_no_import_cycle_in_src():
    assert import_cycles(PACKAGE.parent) == []


def test_no_import_cycle_among_the_test_helpers():
    assert import_cycles(Path(__file__).parents[1]) == []


def test_the_check_sees_a_cycle(tmp_path):
    """A loop through a lazy import and a relative one is found; a package importing its own submodule is not one."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from .c import g\n")
    (package / "sub" / "c.py").write_text("from ..a import x\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert import_cycles(tmp_path) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]


TRAIN_LAYERS = ["config", "rundir", "init", "recipe", "build", "observers", "start", "run", "loop", "launch", "demo"]
"""The floors inside `train/`, from the ground: the recipe's schema, the run folder, continued-pretraining init, the
recipe, the pieces a run is built from, observers, the checks before start, `build_run`, the loop, the doors."""


def upward_imports_in_train(train: Path = PACKAGE / "train") -> list[str]:
    """Imports inside `train/` that run up its floors (`TRAIN_LAYERS`)."""
    found = []
    for path in sorted(train.rglob("*.py")):
        owner = path.relative_to(train).parts[0].removesuffix(".py")
        if owner == "__init__":
            continue
        for module in imported_modules(path):
            parts = module.split(".")
            if len(parts) > 2 and parts[1] == "train" and TRAIN_LAYERS.index(parts[2]) > TRAIN_LAYERS.index(owner):
                found.append(f"train/{path.relative_to(train).as_posix()} imports {module}")
    return found


def test_every_part_of_train_has_a_floor():
    parts = {
        path.relative_to(PACKAGE / "train").parts[0].removesuffix(".py") for path in (PACKAGE / "train").rglob("*.py")
    }
    assert parts - {"__init__"} <= set(TRAIN_LAYERS), parts - set(TRAIN_LAYERS)


def test_no_module_of_train_imports_a_floor_above_its_own():
    assert upward_imports_in_train() == []


def test_at_most_twelve_modules_stand_directly_in_train():
    assert len(list((PACKAGE / "train").glob("*.py"))) <= 12


def test_the_check_sees_an_upward_import_inside_train(tmp_path):
    (tmp_path / "rundir").mkdir()
    (tmp_path / "rundir" / "checkpoint.py").write_text("def f():\n    from dlx.train.loop.trainer import pretrain\n")
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "trainer.py").write_text("from dlx.train.rundir.checkpoint import save\n")
    assert upward_imports_in_train(tmp_path) == ["train/rundir/checkpoint.py imports dlx.train.loop.trainer"]
