"""The workers table: live workers are listed, dead ones age out, and queued jobs no live worker can take are shown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import dibs
from dibs.schema import DEAD_AFTER_LEASES, workers
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase, start_worker
from tests.queue.support import runs


def worker_rows(qdb: QueueDatabase) -> list[str]:
    """The names in dibs_workers, dead or alive."""
    with qdb.engine.connect() as conn:
        return list(conn.execute(sa.select(workers.c.name).order_by(workers.c.name)).scalars())


def live_names(app: dibs.App) -> list[str]:
    return [worker.name for worker in app.workers()]


def test_a_running_worker_is_listed_with_what_it_serves_and_gone_once_it_stops(qdb: QueueDatabase) -> None:
    app = qdb.app(queues=["mail"])

    @app.task(name="shop.ship")
    def ship() -> None: ...

    @app.task(name="shop.mail", queue="mail")
    def mail() -> None: ...

    assert app.workers() == []
    running = qdb.start(app, name="w-1", queues=["mail"], tags=["v2"], concurrency=3, lease=1.5)
    (listed,) = wait_until(app.workers, what="the worker to be listed")
    assert (listed.name, listed.host, listed.pid) == ("w-1", socket.gethostname(), os.getpid())
    assert (listed.queues, listed.tasks, listed.tags) == (("mail",), ("shop.mail", "shop.ship"), ("v2",))
    assert (listed.concurrency, listed.lease_seconds) == (3, 1.5)
    assert 0 <= listed.heartbeat_age_seconds < DEAD_AFTER_LEASES * 1.5
    # Its heartbeat moves on while it runs (every half second: a third of its lease).
    wait_until(
        lambda: app.workers() and app.workers()[0].last_heartbeat > listed.last_heartbeat,
        timeout=10,
        what="a heartbeat",
    )
    assert app.workers()[0].started_at == listed.started_at
    running.stop()
    assert app.workers() == []
    assert worker_rows(qdb) == []


def test_a_burst_worker_leaves_no_row_behind(qdb: QueueDatabase) -> None:
    app = qdb.app()

    @app.task(name="shop.ship")
    def ship() -> None:
        time.sleep(0.2)

    app.enqueue_many(ship, [{}] * 3)
    qdb.drain(app, concurrency=1)
    assert worker_rows(qdb) == []


@pytest.fixture
def spawn(qdb: QueueDatabase) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes (tests.queue.worker_process) on the test's database; all killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    runs.create(qdb.engine)
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_a_killed_workers_row_ages_out_and_is_swept_by_a_running_worker(
    qdb: QueueDatabase, spawn: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    lease = 1.0
    start_worker(qdb, spawn, tmp_path / "worker.log", "--lease", str(lease))
    (process,) = spawn
    app = qdb.app()

    @app.task(name="tests.nap")
    def nap(seconds: float) -> None: ...

    (killed,) = wait_until(
        lambda: app.workers() or process.poll() is not None, timeout=30, what="the process to register"
    )
    assert process.poll() is None, (tmp_path / "worker.log").read_text()
    assert killed.pid == process.pid
    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL
    # The row stays, but counts as dead once its heartbeat is a few leases old.
    assert worker_rows(qdb) == [killed.name]
    wait_until(lambda: app.workers() == [], timeout=DEAD_AFTER_LEASES * lease + 10, what="the row to age out")
    assert worker_rows(qdb) == [killed.name]
    assert [group.task for group in app.stranded_jobs()] == []
    # A running worker sweeps it.
    running = qdb.start(app, name="sweeper", lease=lease)
    wait_until(lambda: worker_rows(qdb) == ["sweeper"], timeout=10, what="the dead row to be swept")
    running.stop()


def test_queued_jobs_that_no_live_worker_can_take_are_listed_with_the_reason(qdb: QueueDatabase) -> None:
    release = threading.Event()
    app = qdb.app(queues=["reports"])

    @app.task(name="shop.ship")
    def ship() -> None:
        release.wait(20)

    # The same function, enqueued from a script: named after __main__, where no worker has it.
    script = qdb.app()

    @script.task(name="__main__.ship")
    def ship_from_script() -> None: ...

    script.enqueue_many(ship_from_script, [{}] * 2)
    app.enqueue(ship, queue="reports")
    app.enqueue(ship, tag="v2")
    app.enqueue_many(ship, [{}] * 10)
    before = {(group.queue, group.task, group.tag): group for group in app.stranded_jobs()}
    assert {key: group.count for key, group in before.items()} == {
        ("default", "__main__.ship", None): 2,
        ("reports", "shop.ship", None): 1,
        ("default", "shop.ship", "v2"): 1,
        ("default", "shop.ship", None): 10,
    }
    assert {group.reason for group in before.values()} == {"no worker is running"}
    assert all(0 <= group.oldest_seconds < 60 for group in before.values())

    running = qdb.start(app, queues=["default"], concurrency=1, batch=1)
    try:
        wait_until(lambda: live_names(app), what="the worker to be listed")
        stranded = {(group.queue, group.task, group.tag): group.reason for group in app.stranded_jobs()}
        assert stranded == {
            ("default", "__main__.ship", None): (
                "no live worker of queue 'default' has task '__main__.ship' (a task registered under another name?)"
            ),
            ("reports", "shop.ship", None): "no live worker takes queue 'reports'",
            ("default", "shop.ship", "v2"): "no live worker of queue 'default' with task 'shop.ship' has tag 'v2'",
        }
        # The jobs the worker takes are not listed, though most of them are still queued behind the one it runs.
        queued = [job for job in app.jobs(status="queued", task="shop.ship", queue="default") if job.tag is None]
        assert queued
        tagged = qdb.start(app, queues=["default", "reports"], tags=["v2"], concurrency=1, batch=1)
        wait_until(lambda: len(app.workers()) == 2, what="the second worker to be listed")
        assert [(group.task, group.reason) for group in app.stranded_jobs()] == [
            (
                "__main__.ship",
                "no live worker of queue 'default' has task '__main__.ship' (a task registered under another name?)",
            )
        ]
        release.set()
        tagged.stop()
    finally:
        release.set()
        running.stop()
