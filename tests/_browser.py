"""The browser of the tests (Debian's chromium under Playwright), the Memory tab opened in it, and waiting on a
page's state without Playwright's ``wait_for_function``.

``wait_for_function`` polls by compiling its predicate with ``eval`` inside the page, which a
Content-Security-Policy without ``'unsafe-eval'`` (the snapshot viewer's, the Memory tab's) refuses
whenever the predicate is not already true at the first check. ``evaluate`` runs through the
DevTools protocol, which the page's policy does not govern.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator

import pytest

__all__ = ["CHROMIUM", "chromium", "frame", "open_tab", "wait_until"]

#: Debian's chromium: ``playwright install`` cannot download browsers here, so the tests use this one.
CHROMIUM = "/usr/bin/chromium"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian chromium under Playwright, for a module's ``browser`` fixture.

    Without it the test is skipped, except under ``TBMEM_REQUIRE_BROWSER=1`` (CI), where it fails.
    """
    if not os.path.exists(CHROMIUM):
        if os.environ.get("TBMEM_REQUIRE_BROWSER"):
            pytest.fail("Debian's chromium is required (TBMEM_REQUIRE_BROWSER=1)")
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def wait_until(target: Any, expression: str, *, timeout_s: float = 60.0, interval_s: float = 0.05) -> Any:
    """Poll ``target.evaluate(expression)`` (a page or a frame) until it is truthy; return that value.

    Raises:
        TimeoutError: still falsy after ``timeout_s``, with the last value in the message.
    """
    deadline = time.monotonic() + timeout_s
    value: Any = None
    while True:
        try:
            value = target.evaluate(expression)
        except Exception as exc:  # noqa: BLE001 - a navigation in progress: look again
            value = exc
        if value and not isinstance(value, Exception):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still not true after {timeout_s} s (last: {value!r})")
        time.sleep(interval_s)


def frame(page: Any, part: str, timeout_s: float = 60) -> Any:
    """The frame of ``page`` whose address contains ``part`` (the Memory tab's ``plugin_entry.html``, a
    snapshot page), once TensorBoard has made it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for f in page.frames:
            if part in f.url:
                return f
        page.wait_for_timeout(200)
    raise AssertionError(f"no frame with {part!r}: {[f.url for f in page.frames]}")


def open_tab(browser: Any, url: str, *, width: int = 1400, height: int = 1000,
             only_from: str | None = None) -> tuple[Any, Any, list[str]]:
    """``url`` (TensorBoard's, ending ``#tbmem...``) in a new context of ``browser``: the context, the
    Memory tab's frame and the list the page's uncaught errors go to. ``only_from``: requests to any other
    address are refused (the tab must work offline)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    if only_from is not None:
        context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(only_from) else r.abort())
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    return context, frame(page, "plugin_entry.html"), errors
