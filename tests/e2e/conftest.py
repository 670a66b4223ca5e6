"""The browser both e2e modules drive: headless Debian Chromium through Playwright, one per module.

When Playwright or the browser is missing the tests fail under `make test` (which installs both and sets
SPECDEC_REQUIRE_BROWSER=1) and in CI (`CI` set); a developer running pytest by hand sees them skipped.
"""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def missing(reason: str) -> None:
    """Fail where the browser must be there; skip elsewhere."""
    required = os.environ.get("CI") or os.environ.get("SPECDEC_REQUIRE_BROWSER") == "1"
    (pytest.fail if required else pytest.skip)(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed; run `pip install -r requirements-test.txt` (make test does)")
    if not os.path.exists(CHROMIUM):
        missing(f"{CHROMIUM} is missing; run scripts/ensure_chromium.sh (make test does)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()
