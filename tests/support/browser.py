"""A real headless Chromium (Debian's ``chromium`` package) driven by Playwright, for the
console's browser tests; Playwright's own browser download is never used."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import REPO

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = REPO / "docs" / "console"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A browser context with a fresh profile (``--user-data-dir``), closed afterwards."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="outboxkit-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=FLAGS,
                viewport={"width": 1360, "height": 900},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def sign_in(page: Any, base: str, token: str) -> None:
    """Sign in through the login form, as a person would."""
    page.goto(f"{base}/login")
    page.fill("#token", token)
    page.click("#sign-in")
    page.wait_for_url(f"{base}/")


def screenshot(page: Any, name: str) -> Path:
    """Save the whole page as ``docs/console/NAME.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def run_async(coroutine: Any) -> Any:
    """``asyncio.run(coroutine)`` in a thread of its own: Playwright's sync API keeps an event
    loop running in the test's thread."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
