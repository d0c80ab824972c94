"""What every benchmark writes beside its figures (command, git SHA, versions, hardware), how it appends them to its
section of BENCHMARKS.md, and how it updates its row of the headline table at the top (`publish(..., headline=)`)."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dlx.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
PEERS_SECTION = ("Peers", "Measured by `benchmarks/peers/bench_peers.py`; see its docstring.")
"""The section and intro of dlx against its peers (bench_peers.py, bench_titan.py): `publish(*PEERS_SECTION, ...)`."""


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def versions() -> str:
    """python and torch, and transformers/accelerate where installed (HF Trainer's figures depend on them)."""
    text = f"python {platform.python_version()}, torch {torch.__version__}"
    with contextlib.suppress(ImportError):
        import accelerate
        import transformers

        text += f", transformers {transformers.__version__}, accelerate {accelerate.__version__}"
    return text


def package_versions(*names: str) -> str:
    """ "name version" of each installed package, comma-separated (the libraries a benchmark's figures depend on)."""
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in names)


def environment(watched: list[str]) -> list[str]:
    """The exact command, code version (flagged when files under `watched` differ from it), versions and hardware."""
    # DLX_GIT_SHA first: a device machine's copy of the tree can carry a .git of an older commit than the files.
    given = os.environ.get("DLX_GIT_SHA", "")[:7]
    sha = given or _git("rev-parse", "--short", "HEAD") or "unknown (no git; set DLX_GIT_SHA)"
    dirty = "" if given else _git("status", "--porcelain", "--", *watched)
    executable = Path(sys.executable)
    python = str(executable.relative_to(ROOT)) if executable.is_relative_to(ROOT) else executable.name
    threads = os.environ.get("OMP_NUM_THREADS")
    modified = f" ({', '.join(watched)}: modified)" if dirty.strip() else ""
    return [
        f"- command: `{shlex.join([python, *sys.argv])}` (from the repository root"
        f"{f', OMP_NUM_THREADS={threads}' if threads else ''})",
        f"- git: {sha}{modified}; {versions()}",
        f"- hardware: {cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}; "
        f"{machine_load()}",
    ]


def machine_load() -> str:
    """The load average before the run, called busy when the 1-minute figure is above half the logical CPUs (then
    other processes share the CPUs, and only ratios measured within one round mean much)."""
    one, five, fifteen = os.getloadavg()
    busy = one > (os.cpu_count() or 1) / 2
    remark = "busy: other processes share the CPUs; compare ratios within a round" if busy else "quiet"
    return f"load average before the run {one:.2f}, {five:.2f}, {fifteen:.2f} ({remark})"


def _git(*args: str) -> str:
    """git's output in the repository, or "" where git is missing or the tree is not a repository (a device copy)."""
    try:
        result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except OSError:
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def record_section(section: str, intro: str, lines: list[str], path: Path = BENCHMARKS_MD) -> None:
    """Append `lines` at the end of the `## section` of BENCHMARKS.md (created, with `intro`, at the end if missing);
    other sections are left as they are."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    entry = "\n".join(lines) + "\n"
    start = text.find(f"\n## {section}\n")
    if start < 0:
        text = text.rstrip("\n") + f"\n\n## {section}\n\n{intro}\n\n" + entry
    else:
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end + 1
        text = text[:end].rstrip("\n") + "\n\n" + entry + ("\n" + text[end:] if end < len(text) else "")
    atomic_write_text(path, text)


@dataclass(frozen=True)
class Headline:
    """A benchmark's row in BENCHMARKS.md's headline table: its latest figure, the peer it is measured against and the
    ratio (dlx ÷ peer, or what the figure is against its target)."""

    figure: str
    peer: str = "—"
    ratio: str = "—"


HEADLINE_START = "<!-- headline: every benchmark's publish step rewrites its row -->"
HEADLINE_END = "<!-- /headline -->"
HEADLINE_HEADER = "| benchmark | latest figure | peer | ratio | machine | date | command |\n" + "|---" * 7 + "|"


def headline_row(section: str, headline: Headline) -> str:
    """The row of `section` for a result measured now, on this machine, by this command."""
    remark = "busy" if "(busy" in machine_load() else "quiet"
    machine = f"{cpu_name().split('(')[0].strip()}, {os.cpu_count()} CPUs, {remark}"
    command = shlex.join([Path(sys.argv[0]).as_posix().split("benchmarks/", 1)[-1], *sys.argv[1:]])
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    cells = [section, headline.figure, headline.peer, headline.ratio, machine, date, f"`benchmarks/{command}`"]
    return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"


def update_headline(section: str, row: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the row of `section` in the headline table (added in section order when missing)."""
    text = path.read_text()
    start, end = text.index(HEADLINE_START), text.index(HEADLINE_END)
    rows = [
        line for line in text[start:end].splitlines() if line.startswith("| ") and not line.startswith("| benchmark")
    ]
    rows = [line for line in rows if line.split(" | ")[0] != f"| {section}"] + [row]
    order = [m.group(1) for m in re.finditer(r"^## (.+)$", text, flags=re.M)]
    rows.sort(key=lambda line: order.index(name) if (name := line.split(" | ")[0][2:]) in order else len(order))
    table = f"{HEADLINE_START}\n{HEADLINE_HEADER}\n" + "\n".join(rows) + "\n"
    atomic_write_text(path, text[:start] + table + text[end:])


def publish(section: str, intro: str, lines: list[str], record: bool = True, headline: Headline | None = None) -> None:
    """Print an entry, and append it to the `## section` of BENCHMARKS.md (`record_section`) unless `record` is False
    (a benchmark's --no-record); with `headline`, its row of the headline table too."""
    print("\n".join(lines))
    if record:
        record_section(section, intro, lines)
        if headline is not None:
            update_headline(section, headline_row(section, headline))
