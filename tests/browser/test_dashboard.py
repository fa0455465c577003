"""The dashboard in Debian's Chromium, on SQLite and PostgreSQL: every page loads, filters narrow the jobs,
actions change the database, and the XSS, CSRF and read-only cases fail safely."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

import dibs
import dibs.dashboard
from dibs.dashboard.reads import PAGE
from tests.browser.support import Served, serve
from tests.helpers import wait_until
from tests.queue.support import FAST, WorkerThread

SCRIPT = "<script>window.dibsHacked = true</script>"


@pytest.fixture
def app(dashboard_url: sa.URL) -> Iterator[dibs.App]:
    """An App with a task, jobs in several states, and a dead one whose arguments hold a script."""
    app = dibs.App(dibs.create_engine(dashboard_url), queues=["mail", "reports"])

    @app.task(name="shop.send", queue="mail")
    def send(to: str) -> None: ...

    yield app
    app.engine.dispose()


@pytest.fixture
def served(app: dibs.App) -> Iterator[Served]:
    running = serve(app)
    yield running
    running.stop()


def _send(app: dibs.App) -> dibs.Task:
    return app.tasks["shop.send"]


def test_every_page_loads_and_shows_the_database_without_its_password(app: dibs.App, served: Served, page: Any) -> None:
    job = app.enqueue(_send(app), {"to": "ada@example.com"})
    app.pause("reports")
    for path, heading in [
        ("/", "Queues"),
        ("/workers", "Workers"),
        ("/jobs", "Jobs"),
        (f"/jobs/{job.id}", f"Job {job.id}"),
        ("/schedules", "Schedules"),
        ("/outbox", "Outbox"),
    ]:
        response = page.goto(served.url + path)
        assert response.status == 200, path
        assert page.locator("h1").first.inner_text().startswith(heading), path
        assert "password" not in page.content()
    page.goto(served.url + "/")
    assert page.locator("tr[data-queue=mail] td.paused").inner_text() == "no"
    assert page.locator("tr[data-queue=reports] td.paused").inner_text() == "paused"
    assert page.locator("svg.chart").count() == 1


def test_filters_narrow_the_jobs_and_pages_follow_by_keyset(app: dibs.App, served: Served, page: Any) -> None:
    app.enqueue_many(_send(app), [{"to": f"user{number}@example.com"} for number in range(PAGE + 5)])
    special = app.enqueue(_send(app), {"to": "grace@example.com"}, queue="reports", dedupe_key="grace")
    page.goto(served.url + "/jobs")
    assert page.locator("#jobs tbody tr").count() == PAGE
    page.click("#next")
    assert page.locator("#jobs tbody tr").count() == 6  # the rest: no row twice, none left out
    page.goto(served.url + "/jobs")
    page.fill("input[name=text]", "grace@")
    page.click("form.filters button")
    assert [row.get_attribute("data-job") for row in page.locator("#jobs tbody tr").all()] == [str(special.id)]
    for query in ("queue=reports", "key=grace", "status=queued&queue=reports"):
        page.goto(f"{served.url}/jobs?{query}")
        assert [row.get_attribute("data-job") for row in page.locator("#jobs tbody tr").all()] == [str(special.id)]
    page.goto(served.url + "/jobs?status=dead")
    assert page.locator("#jobs tbody tr").inner_text() == "No job matches."


def test_actions_change_the_database_after_a_confirmation(app: dibs.App, served: Served, page: Any) -> None:
    job = app.enqueue(_send(app), {"to": "ada@example.com"})
    page.goto(f"{served.url}/jobs/{job.id}")
    page.click("button[data-action=cancel]")
    page.wait_for_url(f"{served.url}/jobs/{job.id}")
    assert app.get(job.id).status == "cancelled"
    page.click("button[data-action=retry]")
    assert app.get(job.id).status == "queued"
    page.goto(served.url + "/")
    page.click("tr[data-queue=mail] button[data-action=pause]")
    assert app.paused() == ["mail"]
    page.click("tr[data-queue=mail] button[data-action=resume]")
    assert app.paused() == []
    page.goto(served.url + "/jobs?queue=mail")
    page.click("button[data-action=cancel]")  # every waiting job of the filter
    assert app.get(job.id).status == "cancelled"
    page.goto(f"{served.url}/jobs/{job.id}")
    page.click("button[data-action=delete]")
    with pytest.raises(dibs.JobNotFound):
        app.get(job.id)


def test_a_declined_confirmation_changes_nothing(app: dibs.App, served: Served, chromium: Any) -> None:
    job = app.enqueue(_send(app), {"to": "ada@example.com"})
    context = chromium.new_context()
    declining = context.new_page()
    declining.on("dialog", lambda dialog: dialog.dismiss())
    declining.goto(f"{served.url}/jobs/{job.id}")
    declining.click("button[data-action=cancel]")
    declining.wait_for_timeout(300)
    context.close()
    assert app.get(job.id).status == "queued"


def test_a_script_in_a_jobs_arguments_shows_as_text_and_never_runs(app: dibs.App, served: Served, page: Any) -> None:
    job = app.enqueue(_send(app), {"to": SCRIPT}, dedupe_key="<b>bold</b>")
    for path in (f"/jobs/{job.id}", "/jobs?text=script", "/jobs?key=%3Cb%3Ebold%3C%2Fb%3E"):
        page.goto(served.url + path)
        assert page.evaluate("window.dibsHacked === undefined"), path
    page.goto(f"{served.url}/jobs/{job.id}")
    assert SCRIPT.replace('"', '\\"') in page.locator("#arguments").inner_text()
    assert page.locator("b").count() == 0


def test_a_post_without_the_pages_csrf_token_or_from_another_origin_is_refused(
    app: dibs.App, served: Served, page: Any
) -> None:
    job = app.enqueue(_send(app), {"to": "ada@example.com"})
    form = {"action": "cancel", "target": str(job.id), "back": "/"}
    # A forged form posted from another site: no cookie, no token.
    assert httpx.post(served.url + "/actions", data=form).status_code == 403
    # The cookie without the token, a wrong token, and the right one from another origin.
    page.goto(served.url + "/")
    token = page.locator("input[name=csrf]").first.get_attribute("value")
    cookies = {"dibs_csrf": token}
    assert httpx.post(served.url + "/actions", data=form, cookies=cookies).status_code == 403
    assert httpx.post(served.url + "/actions", data={**form, "csrf": "x"}, cookies=cookies).status_code == 403
    elsewhere = {"origin": "https://evil.example"}
    forged = httpx.post(served.url + "/actions", data={**form, "csrf": token}, cookies=cookies, headers=elsewhere)
    assert forged.status_code == 403
    assert httpx.get(f"{served.url}/actions").status_code == 405  # actions are never a GET
    assert app.get(job.id).status == "queued"
    sent = httpx.post(served.url + "/actions", data={**form, "csrf": token}, cookies=cookies)
    assert sent.status_code == 303
    assert app.get(job.id).status == "cancelled"


def test_a_read_only_dashboard_offers_no_action_and_refuses_those_sent(app: dibs.App, page: Any) -> None:
    job = app.enqueue(_send(app), {"to": "ada@example.com"})
    running = serve(app, read_only=True)
    try:
        page.goto(f"{running.url}/jobs/{job.id}")
        assert "read-only" in page.locator("header").inner_text()
        assert page.locator("form.action").count() == 0
        token = page.context.cookies()[0]["value"]
        form = {"action": "cancel", "target": str(job.id), "csrf": token}
        refused = httpx.post(running.url + "/actions", data=form, cookies={"dibs_csrf": token})
        assert refused.status_code == 403
    finally:
        running.stop()
    assert app.get(job.id).status == "queued"


def test_token_and_basic_auth_let_in_only_who_knows_the_secret(app: dibs.App, page: Any) -> None:
    guarded = serve(app, auth=dibs.dashboard.token_auth("s3cret"))
    try:
        assert httpx.get(guarded.url + "/jobs").status_code == 401
        assert httpx.get(guarded.url + "/jobs", headers={"authorization": "Bearer s3cret"}).status_code == 200
        page.goto(guarded.url + "/?token=s3cret")
        assert page.url == guarded.url + "/"  # the token leaves the address bar for a cookie
        assert page.goto(guarded.url + "/jobs").status == 200
    finally:
        guarded.stop()
    basic = serve(app, auth=dibs.dashboard.basic_auth("ops", "pw"))
    try:
        challenged = httpx.get(basic.url + "/")
        assert challenged.status_code == 401
        assert challenged.headers["www-authenticate"].startswith("Basic")
        assert httpx.get(basic.url + "/", auth=("ops", "pw")).status_code == 200
        assert httpx.get(basic.url + "/", auth=("ops", "wrong")).status_code == 401
    finally:
        basic.stop()


def test_the_workers_page_shows_a_live_worker_and_the_jobs_it_runs(app: dibs.App, served: Served, page: Any) -> None:
    release = threading.Event()

    @app.task(name="shop.hold", queue="reports")
    def hold() -> None:
        release.wait(20)

    job = app.enqueue(hold)
    worker = WorkerThread(dibs.Worker(app, queues=["reports"], name="night-shift", **FAST)).start()
    try:
        wait_until(lambda: app.get(job.id).status == "running", timeout=15, what="the job to start")

        def shown() -> list[str]:
            # The registry row and the job's lease are written by the worker in their own time: look again.
            page.goto(served.url + "/workers")
            cells: list[str] = page.locator("#workers tbody tr").first.locator("td").all_inner_texts()
            return [cells[index] for index in (0, 3, 6)] if len(cells) > 6 else cells

        wait_until(lambda: shown() == ["night-shift", "reports", "1"], timeout=10, what="the worker and its job")
    finally:
        release.set()
        worker.stop()
