"""`dlx view` reads runs without torch: the server, the page and its live bottleneck verdict import no module that
imports torch when it is loaded (torch costs seconds and most of the server's memory). Read from the source's
top-level imports (what loading a module runs), following dlx's own modules and their parent packages."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_path(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def loaded_imports(path: Path) -> set[str]:
    """The modules a module's body imports when it is loaded: not those inside functions or `if TYPE_CHECKING:`."""
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)

    visit(ast.parse(path.read_text(), str(path)).body)
    return names


def torch_importers(start: str) -> list[str]:
    """Chains `start → … → torch` of loaded imports, one per dlx module that imports torch itself."""
    chains, seen, queue = [], set(), [(start, [start])]
    while queue:
        name, chain = queue.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # a module's parent packages load first
            module = ".".join(parts[:depth])
            path = module_path(module)
            if path is None or module in seen:
                continue
            seen.add(module)
            for imported in loaded_imports(path):
                if imported == "torch" or imported.startswith("torch."):
                    chains.append(" → ".join([*chain, module, imported]))
                elif imported.startswith("dlx"):
                    queue.append((imported, [*chain, module]))
    return chains


def test_the_view_server_and_its_live_verdict_load_without_torch():
    assert torch_importers("dlx.view.server") == []
    assert torch_importers("dlx.metrics.verdict") == []  # what `dlx.view.summary.verdict` imports when it runs


def test_the_check_sees_torch_behind_an_import():
    assert any(chain.endswith("torch") for chain in torch_importers("dlx.metrics.meter"))
