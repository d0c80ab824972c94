"""`dlx view` at scale: 1, 10 and 50 runs of 100,000 logged steps each (log.every 1; `tests/view_helpers.py` writes
them with the trainer's own line format, every key of a step record, two planted spikes per run).

For each count: the seconds `dlx view DIR --out page.html` takes (a fresh process: reading every metrics.jsonl, the
envelopes, the verdicts, the file) and its peak memory; the file's size; the time to first paint of that file in
headless chromium (navigation start to the second animation frame after the page's script has drawn every chart),
median of three loads with the fastest and slowest; and the server: the seconds from its start to its first
`data.json` (the same reading), its resident memory after serving it, and the first paint of the served page.

    .venv/bin/python benchmarks/bench_view.py [--counts 1 10 50] [--steps 100000] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from browser_helpers import browser_missing, chromium, console_errors, wait_for  # noqa: E402
from peers.record import Headline, environment, package_versions, publish  # noqa: E402
from view_helpers import view_server, write_long_run  # noqa: E402

SECTION = "View"
INTRO = (
    "Measured by `benchmarks/bench_view.py`; see its docstring. Targets: ten runs of 100,000 logged steps open in "
    "≤ 2 s in the browser, in a file of ≤ 5 MB."
)
WATCHED = ["src/dlx/view", "benchmarks/bench_view.py", "tests/view_helpers.py"]
LOADS = 3


class PeakMemory:
    """The largest resident set of a process (and its children), sampled every 20 ms while it runs."""

    def __init__(self, pid: int) -> None:
        self.process, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.process.memory_info().rss + sum(c.memory_info().rss for c in self.process.children(True))
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def build_file(folder: Path, page: Path) -> tuple[float, int]:
    """Seconds and peak bytes of `dlx view FOLDER --out PAGE` in a fresh process."""
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dlx", "view", str(folder), "--out", str(page)])
    memory = PeakMemory(proc.pid)
    if proc.wait() != 0:
        raise SystemExit(f"dlx view {folder} failed")
    return time.perf_counter() - began, memory.stop()


def first_paints(browser, url: str, runs: int) -> list[float]:
    """Milliseconds from navigation start to the first paint after every chart is drawn, per load."""
    times = []
    for _ in range(LOADS):
        browser.get("about:blank")
        browser.get(url)
        wait_for(browser, "window.dlxView.paintMs", timeout_s=120)
        assert len(browser.execute_script("return Object.keys(window.dlxView.lastSteps)")) == runs
        assert console_errors(browser) == [], console_errors(browser)
        times.append(browser.execute_script("return window.dlxView.paintMs"))
    return times


def served(folder: Path, runs: int, browser) -> tuple[float, int, list[float]]:
    """Seconds from the server's start to its first data.json (the process's start-up and its reading of every run
    included), its resident bytes after it, and the served page's first paints."""
    began = time.perf_counter()
    with view_server(str(folder), "--refresh", "3600") as (proc, url):
        with urllib.request.urlopen(url + "data.json", timeout=600) as response:
            response.read()
        first_s = time.perf_counter() - began
        rss = psutil.Process(proc.pid).memory_info().rss
        paints = first_paints(browser, url, runs)
    return first_s, rss, paints


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def measure(counts: list[int], steps: int, work: Path) -> list[str]:
    rows = []
    for count in counts:
        folder = work / f"runs-{count}"
        for i in range(count):
            write_long_run(folder / f"run{i:02d}", steps, seed=i)
        jsonl = sum(p.stat().st_size for p in folder.glob("*/metrics.jsonl"))
        page = work / f"view-{count}.html"
        build_s, build_peak = build_file(folder, page)
        with chromium() as browser:
            file_paints = first_paints(browser, page.as_uri(), count)
            server_s, server_rss, served_paints = served(folder, count, browser)
        rows.append(
            f"| {count} × {steps:,} | {jsonl / 1e6:,.0f} | {build_s:.1f} | {build_peak / 1e6:,.0f} | "
            f"{page.stat().st_size / 1e6:.2f} | {spread(file_paints)} | {server_s:.1f} | {server_rss / 1e6:,.0f} | "
            f"{spread(served_paints)} |"
        )
        print(rows[-1], flush=True)
        for path in folder.glob("*/*"):
            path.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 10, 50], help="Runs per measurement.")
    parser.add_argument("--steps", type=int, default=100_000, help="Logged steps per run.")
    parser.add_argument("--no-record", action="store_true", help="Print only; leave BENCHMARKS.md as it is.")
    args = parser.parse_args()
    if browser_missing():
        raise SystemExit(browser_missing())
    header = environment(WATCHED)
    chromium_version = subprocess.run(["/usr/bin/chromium", "--version"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory(prefix="bench-view-") as name:
        rows = measure(args.counts, args.steps, Path(name))
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        f"- browser: {chromium_version.strip()}, headless, {package_versions('selenium')}; uPlot 1.6.32",
        "",
        "| runs × logged steps | metrics.jsonl MB | `--out` build s | build peak MB | file MB | first paint of the "
        "file, ms: median (min–max of 3) | server: start to first data.json, s | server RSS MB "
        "| first paint served, ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    publish(SECTION, INTRO, lines, record=not args.no_record, headline=headline(rows))


def headline(rows: list[str]) -> Headline:
    """The row nearest 10 runs: its file size and first paint against the targets (5 MB, 2 s for 10 × 100k)."""
    cells = [[cell.strip() for cell in row.strip("| ").split(" | ")] for row in rows]
    runs, _, _, _, size, paint, *_ = min(cells, key=lambda c: abs(int(c[0].split(" × ")[0]) - 10))
    median_ms = float(paint.split(" ")[0].replace(",", ""))
    figure = f"{runs} logged steps: a {size} MB file, first paint {paint} ms in headless chromium"
    return Headline(figure, "target 5 MB, 2 s", f"{float(size) / 5:.2f} / {median_ms / 2000:.2f}")


if __name__ == "__main__":
    main()
