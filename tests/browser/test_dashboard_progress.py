"""A running job's progress on its page in Debian's Chromium, on SQLite and PostgreSQL: a bar at the reported
fraction and the message as text (escaped)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.browser.support import serve


@pytest.fixture
def app(dashboard_url: sa.URL) -> Iterator[dibs.App]:
    app = dibs.App(dibs.create_engine(dashboard_url))

    @app.task(name="shop.export")
    def export() -> None: ...

    yield app
    app.engine.dispose()


def test_a_jobs_page_shows_its_progress_as_a_bar_and_its_message(app: dibs.App, page: Any) -> None:
    job = app.enqueue(app.tasks["shop.export"], {})
    quiet = app.enqueue(app.tasks["shop.export"], {})
    where = {"queues": ["default"], "tasks": ["shop.export"], "tags": []}
    lease, _ = app.store.claim(app.engine, owner="w", lease_seconds=30, limit=2, **where)
    app.store.write_progress(app.engine, [(lease, 0.42, "3 of 7 files <b>now</b>")])
    served = serve(app)
    try:
        page.goto(f"{served.url}/jobs/{lease.key[0]}")
        bar = page.locator("#progress progress")
        assert float(bar.get_attribute("value")) == pytest.approx(0.42)
        assert page.locator("#progress .percent").inner_text() == "42%"
        assert page.locator("#progress .message").inner_text() == "3 of 7 files <b>now</b>"
        assert page.locator("#progress b").count() == 0
        other = quiet.id if lease.key[0] == job.id else job.id
        page.goto(f"{served.url}/jobs/{other}")
        assert page.locator("#progress progress").count() == 0
    finally:
        served.stop()
