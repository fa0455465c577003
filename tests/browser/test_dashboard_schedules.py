"""The Schedules page in Debian's Chromium, on SQLite and PostgreSQL: a schedule is paused and resumed after a
confirmation, and a read-only dashboard offers neither and refuses both."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

import dibs
from tests.browser.support import serve


@pytest.fixture
def app(dashboard_url: sa.URL) -> Iterator[dibs.App]:
    """An App with one hourly schedule, recorded as a worker records it."""
    app = dibs.App(dibs.create_engine(dashboard_url))

    @app.periodic(every=timedelta(hours=1), name="hourly-report")
    @app.task(name="shop.report")
    def report() -> None: ...

    app.sync_periodic()
    yield app
    app.engine.dispose()


def _paused(app: dibs.App) -> list[bool]:
    return [schedule.paused for schedule in app.periodic_status()]


def test_a_schedule_is_paused_and_resumed_from_its_page_after_a_confirmation(app: dibs.App, page: Any) -> None:
    served = serve(app)
    try:
        page.goto(served.url + "/schedules")
        row = page.locator("tr[data-schedule=hourly-report]")
        assert row.locator("td.paused").inner_text() == "no"
        shown: list[str] = []
        page.on("dialog", lambda dialog: shown.append(dialog.message))  # the fixture's handler clicks OK
        row.locator("button[data-action=pause-periodic]").click()
        page.wait_for_url(served.url + "/schedules")
        assert "Pause schedule hourly-report?" in shown[0]
        assert _paused(app) == [True]
        assert page.locator("tr[data-schedule=hourly-report] td.paused").inner_text() == "paused"
        page.locator("tr[data-schedule=hourly-report] button[data-action=resume-periodic]").click()
        page.wait_for_url(served.url + "/schedules")
        assert _paused(app) == [False]
        declining = page.context.new_page()
        declining.on("dialog", lambda dialog: dialog.dismiss())
        declining.goto(served.url + "/schedules")
        declining.locator("button[data-action=pause-periodic]").click()
        declining.wait_for_timeout(300)
        assert _paused(app) == [False]
    finally:
        served.stop()


def test_a_read_only_dashboard_neither_offers_nor_takes_a_schedules_pause(app: dibs.App, page: Any) -> None:
    served = serve(app, read_only=True)
    try:
        page.goto(served.url + "/schedules")
        assert page.locator("tr[data-schedule=hourly-report] td.paused").inner_text() == "no"
        assert page.locator("form.action").count() == 0
        token = page.context.cookies()[0]["value"]
        form = {"action": "pause-periodic", "target": "hourly-report", "csrf": token}
        refused = httpx.post(served.url + "/actions", data=form, cookies={"dibs_csrf": token})
        assert refused.status_code == 403
    finally:
        served.stop()
    assert _paused(app) == [False]
