"""What each contender needs installed beyond torch: the distributions its training path imports (found by importing
it in a fresh process), and those its package declares (the closure of `Requires-Dist`, without extras), each with its
installed size from the distribution's RECORD."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBES = {
    "dlx": "import dlx.train.run, dlx.train.loop.trainer",
    "torchtitan": (
        "import sys; sys.path.insert(0, 'benchmarks'); sys.modules['datasets'] = sys.modules['tensorboard'] = None; "
        "from peers.titan_setup import prepare_imports; prepare_imports(); "
        "import torchtitan.trainer, torchtitan.models.llama3"
    ),
}
"""What each contender's run imports (peers/side_by_side.py's two paths, without dlx's part in torchtitan's);
torchtitan's with Hugging Face Datasets and TensorBoard hidden, as on a machine without them (prepare_imports stands
in for them), so that its figure is what the harness needs."""
INSTALLERS = {"pip", "setuptools", "wheel"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_distributions(probe: str) -> set[str]:
    """Distributions owning a module imported by `probe` in a fresh interpreter (modules with a file: a stand-in
    registered under a distribution's name is none of its)."""
    code = f"{probe}\nimport importlib.metadata as m, json, sys\nnames = m.packages_distributions()\n"
    code += "files = [x for x, module in list(sys.modules.items()) if getattr(module, '__file__', None)]\n"
    code += "print(json.dumps(sorted({d for x in files for d in names.get(x.split('.')[0], [])})))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {normalize(name) for name in json.loads(done.stdout.splitlines()[-1])}


def declared_closure(root: str) -> tuple[set[str], set[str]]:
    """(installed, missing): `root` and every distribution its requirements name, recursively, without extras."""
    seen, missing, todo = set(), set(), [root]
    while todo:
        name = normalize(todo.pop())
        if name in seen or name in missing:
            continue
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            missing.add(name)
            continue
        seen.add(name)
        todo += [re.split(r"[<>=!~ \[;(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return seen, missing


def installed_mb(name: str) -> float:
    """The distribution's files on disk, from its RECORD."""
    distribution = importlib.metadata.distribution(name)
    total = 0
    for file in distribution.files or []:
        path = Path(distribution.locate_file(file))
        if path.is_file():
            total += path.stat().st_size
    return total / 1e6


def left_out() -> set[str]:
    """torch with its own requirements (both contenders need them), dlx itself, installers."""
    return declared_closure("torch")[0] | {"dlx"} | INSTALLERS


def summary(names: set[str]) -> str:
    names = sorted(names - left_out())
    return f"{len(names)} packages, {sum(installed_mb(n) for n in names):,.0f} MB"


def install_lines() -> list[str]:
    """One line per contender: its own package, what its run imports, and what `pip install` of it brings."""
    lines = [
        "Installation beyond torch and its own requirements (installed sizes on this machine, from each "
        "distribution's RECORD):"
    ]
    for kind, probe in PROBES.items():
        own = "dlx (editable: src/dlx)" if kind == "dlx" else f"torchtitan {installed_mb('torchtitan'):.1f} MB"
        imported = imported_distributions(probe) - {normalize(kind)}
        names = ", ".join(sorted(imported - left_out()))
        line = f"- {kind}: {own}; its training path imports {summary(imported)} ({names})"
        if kind == "torchtitan":
            declared, missing = declared_closure(kind)
            line += f"; `pip install torchtitan` declares {summary(declared - {'torchtitan'})} installed here"
            line += f", and {', '.join(sorted(missing))} not installed here" if missing else ""
        lines.append(line)
    return lines


if __name__ == "__main__":
    print("\n".join(install_lines()))
