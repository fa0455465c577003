"""Workers ride out database faults: connections killed under them, a job's outcome written late."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import jobs
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import job_rows, kill_other_sessions


def test_a_worker_finishes_every_job_while_its_connections_are_killed(qdb: QueueDatabase) -> None:
    if qdb.family == "sqlite":
        pytest.skip("an embedded database has no server that could kill a connection")
    app = qdb.app(notify=False)
    ran: list[int] = []
    lock = threading.Lock()

    @app.task(name="work")
    def work(n: int) -> None:
        time.sleep(0.002)
        with lock:
            ran.append(n)

    app.enqueue_many(work, [{"n": n} for n in range(600)])
    running = qdb.start(app, concurrency=4, batch=20)
    kills = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(set(ran)) < 600:
        time.sleep(0.15)
        kills += kill_other_sessions(qdb.url)
    wait_until(
        lambda: all(row.status == "succeeded" for row in job_rows(qdb.engine)),
        timeout=60,
        what="every job to be recorded succeeded after the kills",
    )
    assert kills > 0
    assert set(ran) == set(range(600))
    assert running.thread.is_alive(), "the worker gave up instead of reconnecting"
    with qdb.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 600


def test_a_sync_job_past_its_timeout_is_not_run_again_while_its_thread_still_runs(qdb: QueueDatabase) -> None:
    app = qdb.app()
    spans: list[tuple[float, float]] = []

    @app.task(name="stubborn", timeout=0.3, max_attempts=2, retry=dibs.Retry(base=0.01, jitter=0))
    def stubborn() -> None:
        began = time.monotonic()
        time.sleep(0.8)  # ignores the request to stop
        spans.append((began, time.monotonic()))

    job = app.enqueue(stubborn)
    qdb.drain(app, concurrency=2)
    (row,) = job_rows(qdb.engine, jobs.c.id == job.id)
    assert (row.status, row.attempts) == ("dead", 2)
    assert "timeout of 0.3 seconds" in row.last_error
    assert len(spans) == 2
    first, second = sorted(spans)
    assert second[0] >= first[1], "the retry started while the timed-out run was still going"


def test_a_worker_starts_when_its_pooled_connection_was_killed_under_it(qdb: QueueDatabase) -> None:
    if qdb.family == "sqlite":
        pytest.skip("an embedded database has no server that could kill a connection")
    app = qdb.app(notify=False)

    @app.task(name="work")
    def work() -> None:
        return None

    app.enqueue(work)
    # The app's engine keeps one connection in its pool; the server kills it, so the worker's first
    # statement (the schema check as it starts) meets a dropped connection.
    with app.engine.connect() as conn:
        conn.execute(sa.select(1))
    assert kill_other_sessions(qdb.url) >= 1
    stats = qdb.drain(app, concurrency=1)
    assert stats.succeeded == 1
