"""Words that stay true: every CUDA call goes through `dlx.device` (the one named exception aside), and
ARCHITECTURE.md names every module of src/dlx."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dlx"
ARCHITECTURE = PACKAGE.parents[1] / "ARCHITECTURE.md"
CUDA_MODULES = {
    "device.py": "every CUDA call of dlx",
    "metrics/cuda_memory.py": "the allocator's history (private torch.cuda.memory calls), imported only on CUDA",
}


def cuda_uses(path: Path) -> list[int]:
    """Lines of `path` that name `torch.cuda` in code (an attribute, an import), docstrings and comments aside."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "cuda":
            if isinstance(node.value, ast.Name) and node.value.id == "torch":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.cuda"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            lines += [node.lineno for alias in node.names if alias.name == "cuda"]
        elif isinstance(node, ast.Import):
            lines += [node.lineno for alias in node.names if alias.name.startswith("torch.cuda")]
    return sorted(lines)


def cuda_outside_device(package: Path = PACKAGE, allowed: frozenset[str] = frozenset(CUDA_MODULES)) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if name not in allowed:
            found += [f"{name}:{line}" for line in cuda_uses(path)]
    return found


def test_torch_cuda_is_called_only_behind_device_py():
    assert cuda_outside_device() == []


def test_the_scan_sees_torch_cuda_in_code_not_in_words(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "llama.py").write_text(
        '"""torch.cuda in a docstring is words."""\nimport torch\n\n\ndef f(x):\n'
        "    return torch.cuda.get_device_properties(x).major  # torch.cuda\n"
    )
    (tmp_path / "timing.py").write_text("from torch.cuda import Event\nfrom torch import cuda\n")
    (tmp_path / "device.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    expected = ["model/llama.py:6", "timing.py:1", "timing.py:2"]
    assert cuda_outside_device(tmp_path, frozenset({"device.py"})) == expected


def unnamed_modules(package: Path, text: str) -> list[str]:
    """Modules (package `__init__`s aside) that `text` does not name: by their path below the package, by
    `folder/name.py`, or, for a file name no other module has, by `name.py` or `` `name` ``."""
    modules = [path.relative_to(package) for path in sorted(package.rglob("*.py")) if path.name != "__init__.py"]
    names = collections.Counter(module.name for module in modules)
    missing = []
    for module in modules:
        qualified = f"{module.parent.name}/{module.name}" if module.parent.name else module.name
        unique = names[module.name] == 1 and (module.name in text or f"`{module.stem}`" in text)
        if not (module.as_posix() in text or qualified in text or unique):
            missing.append(module.as_posix())
    return missing


def test_architecture_names_every_module():
    assert unnamed_modules(PACKAGE, ARCHITECTURE.read_text()) == []


def test_the_check_sees_an_unnamed_module(tmp_path):
    for name in ("data/loader/plan.py", "data/mixture/plan.py", "train/run.py", "train/loop/eval.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    text = "`run.py` builds; `loader/plan.py` and plan.py; eval"
    assert unnamed_modules(tmp_path, text) == ["data/mixture/plan.py", "train/loop/eval.py"]
