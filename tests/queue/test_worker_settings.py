"""A worker's settings: refused clearly when out of range, and the database connections it holds."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from tests.queue.database import QueueDatabase

BAD_SETTINGS = [
    ({"concurrency": 0}, "concurrency must be a whole number >= 1"),
    ({"batch": 2.5}, "batch must be a whole number >= 1"),
    ({"lease": 0}, "lease must be a positive number of seconds"),
    ({"poll": -1}, "poll must be a positive number of seconds"),
    ({"grace": -1}, "grace must not be negative"),
    ({"lease": 3, "heartbeat": 3}, "heartbeat must be a positive number of seconds below the lease"),
    ({"lease": timedelta(seconds=3), "heartbeat": 4}, r"below the lease \(3\), got 4"),
    ({"connections": 3}, "connections must be 1 or 2"),
    ({"connections": 0}, "connections must be 1 or 2"),
    ({"connections": True}, "connections must be 1 or 2"),
    ({"connections": 1.0}, "connections must be 1 or 2"),
    ({"queues": ["mail"]}, "no task is on queue"),
    ({"queues": []}, r"queues= \(--queues\) names no queue; name some of this app's: default"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS, ids=[repr(s) for s, _ in BAD_SETTINGS])
def test_a_setting_out_of_range_is_refused_saying_what_fits(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    app = dibs.App(f"sqlite:///{tmp_path / 'jobs.sqlite'}")

    @app.task(name="report.build")
    def build() -> None:
        return None

    with pytest.raises(dibs.InvalidArgument, match=message):
        app.worker(**settings)
    app.engine.dispose()


def test_a_worker_holds_one_connection_on_sqlite_and_two_elsewhere_unless_told(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="report.build")
    def build() -> None:
        return None

    expected = 1 if qdb.family == "sqlite" else 2
    assert qdb.worker(app).connections == expected
    assert qdb.worker(app, connections=1).connections == 1


@pytest.mark.parametrize("connections", [1, 2])
def test_a_worker_never_holds_more_connections_than_it_was_given(qdb: QueueDatabase, connections: int) -> None:
    app = qdb.app()

    @app.task(name="image.resize")
    async def resize(n: int) -> None:
        return None

    app.enqueue_many(resize, [{"n": n} for n in range(300)])
    lock = threading.Lock()
    held = [0]
    most = [0]

    def checked_out(*_: Any) -> None:
        with lock:
            held[0] += 1
            most[0] = max(most[0], held[0])

    def checked_in(*_: Any) -> None:
        with lock:
            held[0] -= 1

    sa.event.listen(app.engine.pool, "checkout", checked_out)
    sa.event.listen(app.engine.pool, "checkin", checked_in)
    try:
        stats = qdb.drain(app, concurrency=20, batch=40, connections=connections)
    finally:
        sa.event.remove(app.engine.pool, "checkout", checked_out)
        sa.event.remove(app.engine.pool, "checkin", checked_in)

    assert stats.succeeded == 300
    assert len(app.jobs(status="succeeded", limit=1000)) == 300
    assert 1 <= most[0] <= connections
