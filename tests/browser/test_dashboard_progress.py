"""A running job's progress on its page in Debian's Chromium, on SQLite and PostgreSQL: a bar at the reported
fraction and the message as text (escaped)."""

from __future__ import annotations

from typing import Any

import pytest

import dibs
from tests.browser.support import serve


def test_a_jobs_page_shows_its_progress_as_a_bar_and_its_message(export_app: dibs.App, page: Any) -> None:
    job = export_app.enqueue(export_app.tasks["shop.export"], {})
    quiet = export_app.enqueue(export_app.tasks["shop.export"], {})
    where = {"queues": ["default"], "tasks": ["shop.export"], "tags": []}
    lease, _ = export_app.store.claim(export_app.engine, owner="w", lease_seconds=30, limit=2, **where)
    export_app.store.write_progress(export_app.engine, [(lease, 0.42, "3 of 7 files <b>now</b>")])
    served = serve(export_app)
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
