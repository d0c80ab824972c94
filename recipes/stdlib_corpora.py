"""Two corpora of different kinds from the Python standard library on this machine, for recipes/mixture.yaml.

    python recipes/stdlib_corpora.py data/stdlib-text

writes, offline and in seconds:
    code.jsonl    one document per module: its source with every docstring taken out (comments stay)
    prose.jsonl   one document per module: its docstrings (module, classes, functions) as plain text, and one per
                  topic of the language reference that ships with pydoc (`pydoc_data.topics`)
Both as JSON lines {"text": ...}, which `dlx prepare` reads. Modules that do not parse are left out.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SKIP = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"})


def stdlib_modules() -> Iterator[Path]:
    """The standard library's .py files, test suites and installed packages left out, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if not SKIP.intersection(path.relative_to(root).parts):
            yield path


def docstring_nodes(tree: ast.Module) -> Iterator[ast.Expr]:
    """The docstring statement of the module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                yield first


def split_module(source: str) -> tuple[str, str]:
    """(the code without its docstrings, the docstrings as text); SyntaxError when the module does not parse."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    docstrings, dropped = [], set()
    for node in sorted(docstring_nodes(tree), key=lambda n: n.lineno):
        docstrings.append(inspect.cleandoc(node.value.value))
        dropped.update(range(node.lineno - 1, node.end_lineno))
    # A function that held only its docstring is left with an empty body: the corpus is for training, not for running.
    code = "".join(line for i, line in enumerate(lines) if i not in dropped)
    return code, "\n\n".join(d for d in docstrings if d)


def reference_topics() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [text for _, text in sorted(topics.items())]


def write_corpora(out: Path) -> tuple[int, int]:
    """Write out/code.jsonl and out/prose.jsonl; the number of documents in each."""
    out.mkdir(parents=True, exist_ok=True)
    n_code = n_prose = 0
    with (
        open(out / "code.jsonl", "w", encoding="utf-8") as code,
        open(out / "prose.jsonl", "w", encoding="utf-8") as prose,
    ):
        for path in stdlib_modules():
            try:
                program, text = split_module(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            if program.strip():
                code.write(json.dumps({"text": program}, ensure_ascii=False) + "\n")
                n_code += 1
            if text.strip():
                prose.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                n_prose += 1
        for topic in reference_topics():
            prose.write(json.dumps({"text": topic}, ensure_ascii=False) + "\n")
            n_prose += 1
    return n_code, n_prose


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    n_code, n_prose = write_corpora(out)
    print(f"{out / 'code.jsonl'}: {n_code:,} documents; {out / 'prose.jsonl'}: {n_prose:,} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
