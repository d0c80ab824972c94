"""What `dlx view RUN [RUN…]` was given, as places to read: run folders and `dlx tune` outputs, local or in a bucket.

A run folder is one that holds `config.yaml`, `metrics.jsonl` or `events.jsonl`. A folder that is none of those but
holds run folders (up to two levels down, as `runs/NAME-DATE/`) means all of them; a `dlx tune` output is its JSON
(`OUT.json`, or the tuned recipe `OUT.yaml` beside it), given as a file or found in a given folder. An argument that
resolves to nothing is one line (`Problems`), and the rest is shown.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from dlx.data import storage
from dlx.errors import UserError

RUN_MARKERS = ("config.yaml", "metrics.jsonl", "events.jsonl")
"""Any of these makes a folder a run folder."""
SEARCH_DEPTH = 2
"""Levels below a given folder searched for run folders."""


@dataclass(frozen=True)
class Place:
    """One run folder or tune output: `where` is a local path or a URL, `name` its label on the page."""

    where: str
    name: str
    kind: str = "run"
    """run or tune."""

    @property
    def is_url(self) -> bool:
        return storage.is_url(self.where)

    def file(self, name: str) -> str:
        return storage.join(self.where, name) if self.is_url else str(Path(self.where) / name)


@dataclass
class Problems:
    """Lines for the console and the page, each said once however often the folders are read again."""

    lines: list[str] = field(default_factory=list)
    printed: set[str] = field(default_factory=set)

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)

    def discard(self, line: str) -> None:
        """A line no longer true (a run that had logged no step has now)."""
        if line in self.lines:
            self.lines.remove(line)

    def unprinted(self) -> list[str]:
        new = [line for line in self.lines if line not in self.printed]
        self.printed.update(new)
        return new


def resolve(arguments: list[str], problems: Problems) -> list[Place]:
    """Every run folder and tune output the arguments name, in the order given (a folder's runs by name), each once;
    an argument that names none is a line in `problems`."""
    places: list[Place] = []
    for argument in arguments:
        try:
            found = _resolve_url(argument) if storage.is_url(argument) else _resolve_local(Path(argument))
        except UserError as e:
            problems.add(f"{argument}: {e}; it is left out")
            continue
        if not found:
            problems.add(
                f"{argument}: no run folder (config.yaml or metrics.jsonl) and no `dlx tune` output there; it is "
                "left out (pass a run folder, a folder of runs or a tune OUT.json)"
            )
        places += [p for p in found if p.where not in {q.where for q in places}]
    return _unique_names(places)


def _resolve_local(path: Path) -> list[Place]:
    if path.is_file():
        tune = _tune_json(path)
        return [Place(str(tune), tune.stem, "tune")] if tune else []
    if not path.is_dir():
        return []
    if _is_run_dir(path):
        return [Place(str(path), path.resolve().name)]
    runs, level = [], [path]
    for _ in range(SEARCH_DEPTH):
        level = sorted(child for folder in level for child in folder.iterdir() if child.is_dir())
        runs += [p for p in level if _is_run_dir(p)]
        level = [p for p in level if not _is_run_dir(p)]
    tunes = sorted(p for p in path.glob("*.json") if _tune_json(p))
    return [Place(str(p), p.name) for p in sorted(runs)] + [Place(str(p), p.stem, "tune") for p in tunes]


def _is_run_dir(path: Path) -> bool:
    return any((path / marker).is_file() for marker in RUN_MARKERS)


def _tune_json(path: Path) -> Path | None:
    """The tune JSON a file stands for (itself, or OUT.json beside a tuned OUT.yaml), when it is one."""
    candidate = path if path.suffix == ".json" else path.with_suffix(".json")
    try:
        data = json.loads(candidate.read_text())
    except (OSError, ValueError):
        return None
    return candidate if isinstance(data, dict) and "candidates" in data and "winner" in data else None


def _resolve_url(url: str) -> list[Place]:
    url = url.rstrip("/")
    if url.endswith(".json"):
        if not storage.exists(url):
            raise UserError(f"{url} does not exist")
        return [Place(url, storage.basename(url).removesuffix(".json"), "tune")]
    storage.check_access(url, key="run")
    names = storage.listdir(url)
    if not names:
        raise UserError("nothing is stored there (check the URL)")
    if set(names) & set(RUN_MARKERS):
        return [Place(url, storage.basename(url))]
    runs = [storage.join(url, n) for n in names if set(storage.listdir(storage.join(url, n))) & set(RUN_MARKERS)]
    return [Place(r, storage.basename(r)) for r in runs]


def _unique_names(places: list[Place]) -> list[Place]:
    """Labels made unique by adding the parent folder's name where two places share one."""
    names = [p.name for p in places]
    out = []
    for place, name in zip(places, names, strict=True):
        if names.count(name) > 1:
            parent = os.path.basename(os.path.dirname(place.where.rstrip("/")))
            name = f"{parent}/{name}"
        out.append(Place(place.where, name, place.kind))
    return out
