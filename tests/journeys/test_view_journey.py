"""`dlx pretrain` twice (one run resumed) and `dlx tune`, then `dlx view` of their outputs as one file, opened in
headless chromium: both runs, their charts, the mixture, the resume, the config difference and the tune's predicted
against measured step times are on the page; a folder with no steps, a torn last line and a missing path are one line
each; the page requests nothing and logs no error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from browser_helpers import chromium, console_errors, require_browser, wait_for
from train_helpers import TINY, make_dataset

ROOT = Path(__file__).resolve().parents[2]

SCREENSHOT_ENV = "DLX_VIEW_SCREENSHOT"
"""A path: the test saves its page there as PNG (the README's picture)."""


def dlx(*args: object) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "dlx", *map(str, args)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_two_real_runs_side_by_side_in_a_browser(tmp_path):
    require_browser()
    runs = tmp_path / "runs"
    mix = f"{make_dataset(tmp_path / 'prose')}=1,{make_dataset(tmp_path / 'code')}=3"
    common = [*TINY, "--data.mix", mix, "--eval.every", "4", "--checkpoint.every", "4"]
    dlx("pretrain", *common, "--train.max_steps", "12", "--run-dir", runs / "a")
    dlx("pretrain", *common, "--train.lr", "1e-3", "--train.max_steps", "8", "--run-dir", runs / "b")
    dlx("pretrain", *common, "--train.lr", "1e-3", "--train.max_steps", "12", "--run-dir", runs / "b", "--resume")
    (runs / "waiting").mkdir()
    shutil.copy(runs / "a" / "config.yaml", runs / "waiting")  # a run that has logged no step yet
    with open(runs / "b" / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "lo')  # a crash mid-write
    # only the micro-batch searched (4 layouts): tune ends when they are measured, the budget only bounds it (a small
    # budget is refused on a busy machine: the check predicts a measurement from this machine's speed)
    kept = ("train.compile", "train.attention", "parallel.activation_checkpointing", "parallel.strategy")
    tune = ["--data.seq_len", "32", "--train.global_batch_size", "8", "--budget-min", "5"]
    tune += [arg for key in kept for arg in ("--keep", key)]
    dlx("tune", ROOT / "recipes" / "debug.yaml", *tune, "--out", tmp_path / "tune" / "tuned.yaml")
    page = tmp_path / "page.html"
    result = dlx("view", runs, tmp_path / "tune" / "tuned.yaml", tmp_path / "nothing", "--out", page)
    b, waiting = runs / "b", runs / "waiting"
    assert sorted(result.stderr.splitlines()) == sorted(
        [
            f"dlx view: {b}/metrics.jsonl: its last line is cut short (a crash mid-write); the lines before it "
            "are shown",
            f"dlx view: {waiting}: no metrics.jsonl (no step logged yet, or not a run folder); its other files "
            "are shown",
            f"dlx view: {tmp_path / 'nothing'}: no run folder (config.yaml or metrics.jsonl) and no `dlx tune` output "
            "there; it is left out (pass a run folder, a folder of runs or a tune OUT.json)",
        ]
    )
    with chromium() as browser:
        browser.get(page.as_uri())
        wait_for(browser, "document.body.dataset.ready")
        names = browser.execute_script("return [...document.querySelectorAll('[data-run]')].map(e => e.dataset.run)")
        assert names == ["a", "b", "waiting"]
        assert browser.execute_script("return window.dlxView.lastSteps") == {"a": 12, "b": 12, "waiting": None}
        charts = browser.execute_script("return window.dlxView.charts")
        assert charts >= 9 and browser.execute_script("return window.dlxView.drawn") >= charts
        tune_chart = "window.dlxView.plots.find(p => p.root.parentNode.dataset.title === 'tune tuned')"
        measured = browser.execute_script(f"return {tune_chart}.data[3].filter(v => v > 0).length")
        assert measured >= 1  # measured step times beside the predicted ones
        assert console_errors(browser) == []
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        text = browser.find_element("tag name", "body").text
        assert "train.lr" in text and "Config differences against the first run" in text
        assert "25.0 %" in text and "75.0 %" in text  # the mixture's requested shares
        browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
        assert "resume" in browser.find_element("tag name", "body").text
        if os.environ.get(SCREENSHOT_ENV):
            browser.set_window_size(1280, 1000)
            wait_for(browser, "window.dlxView.renders >= 2")  # drawn again at the new width
            browser.save_screenshot(str(Path(os.environ[SCREENSHOT_ENV])))
