"""Debian's chromium, headless, driven through chromium-driver (Selenium): for the tests and the benchmark of
`dlx view`. The browser and its driver end with the `with` block, however it ends."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1800",
)
"""What works on a closed network with no display: nothing is fetched in the background."""


def browser_missing() -> str | None:
    """Why no browser test can run here (None when chromium, its driver and selenium are all present)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing: apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing: pip install 'dlx[test]'"
    return None


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium with a fresh profile, its console kept (`console_errors`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dlx-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[str]:
    """The page's console messages at level SEVERE since the last call (script errors, failed requests)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(driver: Any, script: str, timeout_s: float = 60.0) -> Any:
    """Poll `return <script>` until it is truthy; its value. The bound is generous: a busy machine is slow, not
    wrong."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = driver.execute_script(f"return {script}")
        if value or time.monotonic() > deadline:
            assert value, f"{script!r} still false after {timeout_s:.0f} s; console: {console_errors(driver)}"
            return value
        time.sleep(0.1)


def require_browser() -> None:
    """Skip where no browser is installed; under CI (which installs one) its absence fails instead."""
    import os

    import pytest

    missing = browser_missing()
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI must install the browser: {missing}")
    if missing:
        pytest.skip(missing)
