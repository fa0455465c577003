"""A job's page in Debian's Chromium, on SQLite and PostgreSQL: the jobs it waits for and those waiting for
it, and its state and progress kept up to date while it is not finished, without a reload."""

from __future__ import annotations

from typing import Any

import pytest

import dibs
from tests.browser.support import serve
from tests.helpers import wait_until


def test_a_jobs_page_links_the_jobs_it_waits_for_and_those_waiting_for_it(export_app: dibs.App, page: Any) -> None:
    export = export_app.tasks["shop.export"]
    first, second = export_app.enqueue(export, {}), export_app.enqueue(export, {})
    child = export_app.enqueue(export, {}, after=[second, first])
    served = serve(export_app)
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


def test_a_running_jobs_page_follows_its_progress_and_end_without_a_reload(export_app: dibs.App, page: Any) -> None:
    export_app.enqueue(export_app.tasks["shop.export"], {})
    where = {"queues": ["default"], "tasks": ["shop.export"], "tags": []}
    [lease] = export_app.store.claim(export_app.engine, owner="w", lease_seconds=30, limit=1, **where)
    served = serve(export_app)
    try:
        page.goto(f"{served.url}/jobs/{lease.key[0]}")
        assert page.locator("#job-live .status").inner_text() == "running"
        assert page.locator("#progress progress").count() == 0
        page.evaluate("window.notReloaded = true")
        export_app.store.write_progress(export_app.engine, [(lease, 0.5, "halfway")])
        page.locator("#progress .message").wait_for(timeout=10_000)
        assert page.locator("#progress .percent").inner_text() == "50%"
        # An action drawn by the live part returns to the job's page, not to the part.
        page.click('[data-action="cancel"]')
        page.wait_for_load_state()
        assert page.url == f"{served.url}/jobs/{lease.key[0]}"
        assert export_app.get(lease.key[0]).cancel_requested
        page.evaluate("window.notReloaded = true")
        assert export_app.store.succeed(export_app.engine, [lease]) == []
        page.locator("#job-live .status.succeeded").wait_for(timeout=10_000)
        assert page.evaluate("window.notReloaded") is True
        # Finished: the page stops asking.
        assert page.locator("#job-live").get_attribute("hx-get") is None
        wait_until(lambda: page.locator('[data-action="delete"]').count() == 1, what="the finished job's actions")
    finally:
        served.stop()


def test_deleting_a_finished_job_first_queues_the_jobs_still_waiting_for_it(export_app: dibs.App, page: Any) -> None:
    """Children a parent gained while it ran are settled by upkeep after it; deleted before that, nothing
    would ever queue them."""
    export = export_app.tasks["shop.export"]
    parent = export_app.enqueue(export, {})
    where = {"queues": ["default"], "tasks": ["shop.export"], "tags": []}
    [lease] = export_app.store.claim(export_app.engine, owner="w", lease_seconds=30, limit=1, **where)
    child = export_app.enqueue(export, {}, after=[parent])  # while it runs
    assert export_app.store.succeed(export_app.engine, [lease]) == []
    assert export_app.get(child.id).status == "waiting"  # left for upkeep
    served = serve(export_app)
    try:
        page.goto(f"{served.url}/jobs/{parent.id}")
        page.click('[data-action="delete"]')
        page.wait_for_load_state()
        wait_until(lambda: export_app.get(child.id).status == "queued", what="the waiting child to be queued")
        with pytest.raises(dibs.JobNotFound):
            export_app.get(parent.id)
    finally:
        served.stop()


def test_deleting_a_job_retried_since_its_page_was_shown_keeps_it_and_says_why(export_app: dibs.App, page: Any) -> None:
    job = export_app.enqueue(export_app.tasks["shop.export"], {})
    export_app.cancel(job.id)
    served = serve(export_app)
    try:
        page.goto(f"{served.url}/jobs/{job.id}")
        export_app.retry(job.id)  # queued again while the page still offers Delete
        page.click('[data-action="delete"]')
        page.wait_for_load_state()
        alert = page.locator("p.error[role=alert]")
        alert.wait_for(timeout=10_000)
        assert f"job {job.id} was not deleted: it is queued now" in alert.inner_text()
        assert export_app.get(job.id).status == "queued"
    finally:
        served.stop()
