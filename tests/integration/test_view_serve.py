"""`dlx view` served on 127.0.0.1 and followed live in headless chromium, runs in a bucket, and the 10 × 100k-step
case (file size and a page that opens and draws every spike; its time is benchmarks/bench_view.py's figure)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from browser_helpers import chromium, console_errors, require_browser, wait_for
from dlx.metrics.logger import MetricsLogger, read_jsonl
from s3_helpers import make_bucket, s3_server
from train_helpers import TINY, run_cli, train_quietly
from view_helpers import SPIKES, view_server, write_long_run

REFRESH_S = 1.0


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("view") / "run"
    return train_quietly([*TINY, "--train.max_steps", "6", "--eval.every", "3", "--checkpoint.every", "3"], run_dir)


def embedded_payload(page: Path) -> dict:
    text = page.read_text()
    found = re.search(r'<script id="dlx-data" type="application/json">(.*?)</script>', text, re.S)
    return json.loads(found.group(1))


def test_a_live_page_shows_a_new_step_within_its_refresh_period(finished_run, tmp_path):
    """The server follows the folder: a record appended by dlx's own logger reaches the open page."""
    require_browser()
    with view_server(str(finished_run), "--refresh", str(REFRESH_S)) as (server, url), chromium() as browser:
        browser.get(url)
        wait_for(browser, "window.dlxView.lastSteps.run === 6")
        assert browser.execute_script("return window.dlxView.drawn") >= browser.execute_script(
            "return window.dlxView.charts"
        )
        last = read_jsonl(finished_run / "metrics.jsonl")[-1]
        with MetricsLogger(finished_run) as logger:  # what the trainer writes at its next logged step
            logger.log({**last, "step": 7, "time": time.time()})
        seen = time.monotonic()
        wait_for(browser, "window.dlxView.lastSteps.run === 7")  # within the refresh period on a quiet machine
        assert time.monotonic() - seen < 60
        assert console_errors(browser) == []
        assert browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)") == [
            url + "data.json"
        ] * browser.execute_script("return performance.getEntriesByType('resource').length")
    assert server.returncode == 0  # SIGTERM stops it cleanly


def test_a_taken_port_is_one_line_and_exit_2(finished_run, tmp_path):
    with view_server(str(finished_run)) as (_, url):
        port = url.rsplit(":", 1)[1].strip("/")
        result = run_cli(["view", str(finished_run), "--port", port], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use); pick another --port, or "
        "leave it out for a free one"
    ]


def test_nothing_to_show_is_one_line_and_exit_2(tmp_path):
    result = run_cli(["view", str(tmp_path / "none"), "--out", str(tmp_path / "p.html")], tmp_path)
    assert result.returncode == 2 and not (tmp_path / "p.html").exists()
    assert result.stderr.splitlines()[-1].startswith("error: nothing to show: no RUN given is a run folder")


def test_runs_in_a_bucket_are_shown_and_a_missing_bucket_is_one_line(tmp_path, monkeypatch):
    """`dlx pretrain --run-dir s3://…` writes the folder; `dlx view` of the bucket's folder of runs reads it."""
    with s3_server() as endpoint:
        make_bucket(endpoint, "runs")
        for key, value in endpoint.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("DLX_STAGING_DIR", str(tmp_path / "staging"))
        trained = run_cli(["pretrain", *TINY, "--train.max_steps", "4", "--run-dir", "s3://runs/all/r1"], tmp_path)
        assert trained.returncode == 0, trained.stderr
        page = tmp_path / "page.html"
        args = ["view", "s3://runs/all", "s3://no-such-bucket/x", "--out", str(page)]
        result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "dlx view: s3://no-such-bucket/x: run s3://no-such-bucket/x: bucket no-such-bucket does not exist; create it "
        "or fix the URL; it is left out"
    ]
    runs = embedded_payload(page)["runs"]
    assert [(r["name"], r["status"]["last_step"]) for r in runs] == [("r1", 4)]
    assert [e["event"] for e in runs[0]["events"]][:2] == ["start", "checkpoint"]


@pytest.fixture(scope="module")
def ten_long_runs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("long")
    for i in range(10):
        write_long_run(folder / f"run{i}", 100_000, seed=i)
    return folder


@pytest.mark.slow
def test_ten_runs_of_100k_steps_make_a_small_file_that_draws_every_spike(ten_long_runs, tmp_path):
    require_browser()
    page = tmp_path / "long.html"
    result = subprocess.run(
        [sys.executable, "-m", "dlx", "view", str(ten_long_runs), "--out", str(page)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert page.stat().st_size <= 5_000_000
    with chromium() as browser:
        browser.get(page.as_uri())
        wait_for(browser, "window.dlxView.paintMs", timeout_s=60)  # the time itself: benchmarks/bench_view.py
        assert len(browser.execute_script("return Object.keys(window.dlxView.lastSteps)")) == 10
        assert console_errors(browser) == []
        loss_chart = "window.dlxView.plots.find(p => p.root.parentNode.dataset.title.startsWith('loss'))"
        highest = browser.execute_script(
            f"return {loss_chart}.data.slice(1).flat().reduce((m, v) => (typeof v === 'number' && v > m ? v : m), 0)"
        )
    spike = min(json.loads(line)["loss"] for run in ten_long_runs.iterdir() for line in spike_lines(run))
    assert highest >= round(spike, 1)  # the spikes, 1 step in 100,000, are on the chart
    assert min(SPIKES) < 100_000


def spike_lines(run: Path) -> list[str]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [lines[s - 1] for s in SPIKES]
