"""ARCHITECTURE.md's words stay true: every file + name pair it states (`train/build/objective.py` `training_loss`, or
`parallel/distributed.teardown`) names a definition in that file."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "dlx"
FILE_THEN_NAME = re.compile(r"`([\w/]+\.py)`\s+`([A-Za-z_][\w.]*)(?:\(\))?`")
"""`path.py` `name`: a file and, right after it, a name defined there."""
DOTTED = re.compile(r"`((?:\w+/)*\w+)\.([A-Za-z_]\w*)(?:\(\))?`")
"""`dir/module.name` or `module.name`: a module of the package and a name defined there."""
RECIPE_SECTIONS = {"model", "data", "train", "eval", "checkpoint", "log", "profile", "parallel"}
"""`data.mix` is a recipe key, not a module's name."""
FILE_ENDINGS = {"json", "jsonl", "lock", "yaml", "md", "png", "pt", "npy", "bin", "safetensors", "py"}


def stated_pairs(text: str) -> list[tuple[str, str]]:
    pairs = [(path, name) for path, name in FILE_THEN_NAME.findall(text)]
    for module, name in DOTTED.findall(text):
        if name not in FILE_ENDINGS and module not in RECIPE_SECTIONS:
            pairs.append((module + ".py", name))
    return pairs


def find_file(path: str) -> Path | None:
    """The file `path` names: from src/dlx (or the repository), else the one package file whose path ends with it."""
    for root in (PACKAGE, ROOT):
        if (root / path).is_file():
            return root / path
    found = [p for p in PACKAGE.rglob("*.py") if p.as_posix().endswith("/" + path)]
    return found[0] if len(found) == 1 else None


@cache
def defined_names(path: Path) -> set[str]:
    """Functions, classes and methods anywhere in the file, and names assigned at its top level or in a class."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def untrue_pairs(text: str) -> list[str]:
    wrong = []
    for path, name in stated_pairs(text):
        file = find_file(path)
        if file is None:
            if "/" in path:
                wrong.append(f"{path}: no such file in src/dlx")
            continue  # `x.y` that is no module path of the package (a method call such as `timer.window`)
        if name.split(".")[-1] not in defined_names(file):
            wrong.append(f"{path} has no {name}")
    return wrong


def test_every_file_and_name_pair_in_architecture_md_is_a_definition():
    assert untrue_pairs((ROOT / "ARCHITECTURE.md").read_text()) == []


def test_the_check_sees_a_name_in_the_wrong_file():
    text = "loss (`train/loop/eval.py` `training_loss`), teardown (`parallel/distributed.teardown`)"
    assert untrue_pairs(text) == ["train/loop/eval.py has no training_loss"]
