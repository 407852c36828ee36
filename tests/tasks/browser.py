"""A headless Chromium for the console's browser tests (tests/tasks/test_console.py), driven
through Playwright for Python.

Playwright's own browser download (`playwright install`) is not reachable here, so the fixtures
launch Debian's Chromium (the `chromium` package; .ci/run installs it) by its path:
$AGENTJOBS_TEST_CHROMIUM, else `chromium` on PATH, else /usr/bin/chromium. Without it the tests
skip, or fail with CI set.

A test module takes the fixtures with `pytest_plugins = ["tests.tasks.browser"]` at its top (or
the run loads this module with `pytest -p tests.tasks.browser`); importing `browser` and `page`
into the module instead makes ruff see each test's `page` argument as a redefinition (F811).
Playwright's sync API cannot run inside a running asyncio loop, so the tests using it are plain
(not async) functions.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = (
    os.environ.get("AGENTJOBS_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
INSTALL = "apt-get install -y chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for a test module (Playwright's loop lives no longer than the
    module's tests); each test gets its own context (`page`)."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing = f"no Chromium at {CHROMIUM} for the browser tests (install it: {INSTALL})"
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; .ci/run installs it", pytrace=False)
        pytest.skip(missing)
    with sync_playwright() as p:
        # --no-sandbox: the tests run as root, and Chromium's sandbox refuses root.
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh browser context (no cookies or storage from other tests)."""
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()
