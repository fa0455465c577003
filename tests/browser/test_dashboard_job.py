"""A job's page in Debian's Chromium, on SQLite and PostgreSQL: the jobs it waits for and those waiting for
it, and its state and progress kept up to date while it is not finished, without a reload."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.browser.support import serve
from tests.helpers import wait_until


@pytest.fixture
def app(dashboard_url: sa.URL) -> Iterator[dibs.App]:
    app = dibs.App(dibs.create_engine(dashboard_url))

    @app.task(name="shop.export")
    def export() -> None: ...

    yield app
    app.engine.dispose()


def test_a_jobs_page_links_the_jobs_it_waits_for_and_those_waiting_for_it(app: dibs.App, page: Any) -> None:
    export = app.tasks["shop.export"]
    first, second = app.enqueue(export, {}), app.enqueue(export, {})
    child = app.enqueue(export, {}, after=[second, first])
    served = serve(app)
    try:
        page.goto(f"{served.url}/jobs/{child.id}")
        rows = page.locator("#parents tbody tr")
        assert rows.all_inner_texts() == [f"{second.id}\tshop.export\tqueued", f"{first.id}\tshop.export\tqueued"]
        assert page.locator("#children").count() == 0
        assert page.locator('[data-action="cancel"]').count() == 1  # a waiting job can be cancelled
        page.click(f"#parents a:text-is('{first.id}')")
        page.wait_for_url(f"**/jobs/{first.id}")
        assert page.locator("#children tbody tr").all_inner_texts() == [f"{child.id}\tshop.export\twaiting"]
        assert page.locator("#parents").count() == 0
    finally:
        served.stop()


def test_a_running_jobs_page_follows_its_progress_and_end_without_a_reload(app: dibs.App, page: Any) -> None:
    app.enqueue(app.tasks["shop.export"], {})
    where = {"queues": ["default"], "tasks": ["shop.export"], "tags": []}
    [lease] = app.store.claim(app.engine, owner="w", lease_seconds=30, limit=1, **where)
    served = serve(app)
    try:
        page.goto(f"{served.url}/jobs/{lease.key[0]}")
        assert page.locator("#job-live .status").inner_text() == "running"
        assert page.locator("#progress progress").count() == 0
        page.evaluate("window.notReloaded = true")
        app.store.write_progress(app.engine, [(lease, 0.5, "halfway")])
        page.locator("#progress .message").wait_for(timeout=10_000)
        assert page.locator("#progress .percent").inner_text() == "50%"
        # An action drawn by the live part returns to the job's page, not to the part.
        page.click('[data-action="cancel"]')
        page.wait_for_load_state()
        assert page.url == f"{served.url}/jobs/{lease.key[0]}"
        assert app.get(lease.key[0]).cancel_requested
        page.evaluate("window.notReloaded = true")
        assert app.store.succeed(app.engine, [lease]) == []
        page.locator("#job-live .status.succeeded").wait_for(timeout=10_000)
        assert page.evaluate("window.notReloaded") is True
        # Finished: the page stops asking.
        assert page.locator("#job-live").get_attribute("hx-get") is None
        wait_until(lambda: page.locator('[data-action="delete"]').count() == 1, what="the finished job's actions")
    finally:
        served.stop()
