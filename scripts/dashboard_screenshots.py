"""Screenshots of the dashboard's main pages into docs/dashboard/, taken in Debian's Chromium.

    .venv/bin/python scripts/dashboard_screenshots.py

A SQLite database in a temporary directory gets a few hundred jobs (succeeded, dead with a traceback,
queued, scheduled, one running with its progress), a paused queue, a periodic schedule and an abandoned
outbox event.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402
from tests.browser.support import serve  # noqa: E402

import dibs  # noqa: E402
from dibs.schema import outbox  # noqa: E402

OUT = ROOT / "docs" / "dashboard"


def fill(url: str) -> dibs.App:
    app = dibs.App(url, queues=["reports"])
    app.init()

    @app.task(name="shop.send_receipt", queue="mail")
    def send_receipt(order_id: int) -> None:
        if order_id % 9 == 0:
            raise ConnectionError(f"SMTP server refused order {order_id}")

    @app.task(name="shop.nightly_report", queue="reports")
    def nightly_report() -> None: ...

    app.periodic(every=timedelta(hours=1), name="hourly-report")(nightly_report)
    app.enqueue_many(send_receipt, [{"order_id": number} for number in range(1, 240)], max_attempts=1)
    app.worker(burst=True, queues=["mail"]).run()
    app.enqueue_many(send_receipt, [{"order_id": number} for number in range(240, 300)])
    app.enqueue(send_receipt, {"order_id": 301}, delay=600)
    app.enqueue_many(nightly_report, [{}] * 12)
    app.pause("reports")
    app.sync_periodic()
    (running,) = app.store.claim(
        app.engine, owner="worker-1", lease_seconds=600, limit=1, queues=["mail"], tasks=["shop.send_receipt"], tags=[]
    )
    app.store.write_progress(app.engine, [(running, 0.42, "3 of 7 attachments sent")])
    box = dibs.Outbox(app.engine)
    with app.engine.begin() as conn:
        event = box.add(conn, "order", 42, "order.paid", {"total": 99})
    with app.engine.begin() as conn:
        conn.execute(
            outbox.update()
            .where(outbox.c.id == event)
            .values(status="abandoned", retry_count=10, last_error="ConnectionError: broker unreachable")
        )
    return app


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        app = fill(f"sqlite:///{directory}/dibs.sqlite")
        dead = app.jobs(status="dead", limit=1)[0].id
        running = app.jobs(status="running", limit=1)[0].id
        served = serve(app)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1200, "height": 720})
                for name, path in [
                    ("overview", "/"),
                    ("jobs", "/jobs"),
                    ("job", f"/jobs/{dead}"),
                    ("progress", f"/jobs/{running}"),
                    ("schedules", "/schedules"),
                    ("outbox", "/outbox"),
                ]:
                    page.goto(served.url + path)
                    page.screenshot(path=str(OUT / f"{name}.png"))
                    print(f"docs/dashboard/{name}.png")
                browser.close()
        finally:
            served.stop()
            app.engine.dispose()


if __name__ == "__main__":
    main()
