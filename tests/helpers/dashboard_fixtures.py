"""The dashboard tests' fixtures, as a pytest plugin (registered by the root conftest): Debian's Chromium
driven by Playwright (never a downloaded browser), and a dashboard served on loopback for one test."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers.targets import IN_CI

CHROMIUM = os.environ.get("DIBS_TEST_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless Chromium; skipped (failing in CI) when Debian's chromium or playwright is missing.

    One per module, not per session: Playwright's sync API keeps an event loop running on the main thread
    while it is open, and every later test that calls asyncio.run() would fail.
    """
    missing = None
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        missing = f"no Chromium at {CHROMIUM}: apt-get install chromium (scripts/test installs it)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package is missing: pip install -e '.[dev]'"
    if missing is not None:
        if IN_CI:
            pytest.fail(f"CI needs the browser tests: {missing}", pytrace=False)
        pytest.skip(missing)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh browser page (its own cookies), confirming every dialog as a user clicking OK would."""
    context = chromium.new_context()
    tab = context.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())
    yield tab
    context.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def dashboard_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.URL]:
    """A database with a current dibs schema for the dashboard: SQLite, and PostgreSQL."""
    from tests.browser.support import fresh_database

    if request.param == "sqlite":
        url = sa.make_url(f"sqlite:///{tmp_path / 'dashboard.sqlite'}")
    else:
        url = request.getfixturevalue("postgres_database")
    yield from fresh_database(url)


@pytest.fixture
def export_app(dashboard_url: sa.URL) -> Iterator[Any]:
    """An App on the dashboard's database with one task, ``shop.export``, that does nothing."""
    import dibs

    app = dibs.App(dibs.create_engine(dashboard_url))

    @app.task(name="shop.export")
    def export() -> None: ...

    yield app
    app.engine.dispose()
