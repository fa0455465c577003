"""Idle workers wake on PostgreSQL notifications; elsewhere they poll, backing off to the poll period."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import dibs
from dibs.queue import fetch
from dibs.queue.enqueue import CHANNEL
from tests.helpers import wait_until
from tests.queue.database import QueueDatabase
from tests.queue.support import kill_listeners, kill_other_sessions, sends_notifications


def notifies(app: dibs.App) -> bool:
    """Whether this database and driver send workers notifications."""
    return sends_notifications(app, CHANNEL)


def only_woken(monkeypatch: pytest.MonkeyPatch) -> float:
    """An idle worker's first wait as long as its poll: a job started sooner was found by a wake-up."""
    poll = 30.0
    monkeypatch.setattr(fetch, "IDLE_FIRST_WAIT", poll)
    return poll


def ping_task(app: dibs.App) -> threading.Event:
    started = threading.Event()

    @app.task(name="ping")
    async def ping() -> None:
        started.set()

    return started


def listening_worker(qdb: QueueDatabase, app: dibs.App, poll: float) -> dibs.Worker:
    """A worker of ``app`` started and listening."""
    worker = qdb.start(app, poll=poll).worker
    deadline = time.monotonic() + 10.0
    while not worker.wakeup.listening and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.wakeup.listening, "the worker did not listen within 10 s"
    time.sleep(1.2)  # a while: a connection that drops as soon as it listens is retried as a failure
    return worker


def test_an_idle_worker_starts_a_new_job_promptly(qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    app = qdb.app()
    started = ping_task(app)
    if notifies(app):
        # Only a wake-up can start the job before the poll; how soon it does is the machine's to say.
        poll = only_woken(monkeypatch)
        listening_worker(qdb, app, poll)
        enqueued = time.monotonic()
        app.enqueue("ping")
        assert started.wait(poll / 3), "the notification did not wake the idle worker"
        assert time.monotonic() - enqueued < poll / 3
        return
    poll = 0.5
    qdb.start(app, poll=poll)
    time.sleep(3.0)  # idle long enough for the poll backoff to grow to the poll period
    enqueued = time.monotonic()
    app.enqueue("ping")
    assert started.wait(10.0)
    waited = time.monotonic() - enqueued
    # An uncapped backoff would be waiting 2.56 s by now; the margin is for a slow machine.
    assert waited < poll + 1.0, f"the worker took {waited:.2f}s to start the job"


def kill_listener(qdb: QueueDatabase) -> None:
    """End, from the server, the session that listens for new jobs."""
    assert kill_listeners(qdb.engine, CHANNEL) == 1


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(level, message) of what the listeners for new jobs logged."""
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.name == "dibs.postgresql" and f" {CHANNEL} " in record.getMessage()
    ]


def wait_for(caplog: pytest.LogCaptureFixture, message: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not any(text.startswith(message) for _, text in said(caplog)) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def notifying(qdb: QueueDatabase) -> dibs.App:
    app = qdb.app()
    if not notifies(app):
        pytest.skip("this database sends no notifications; workers poll")
    return app


def kill_every_session(qdb: QueueDatabase) -> None:
    """End every other session of the database from the server, as a restart would (the pool's idle ones too)."""
    assert kill_other_sessions(qdb.url) >= 2


def woken_again(app: dibs.App, started: threading.Event, poll: float) -> None:
    """The next job wakes the worker (past the look it takes as it listens again)."""
    time.sleep(0.5)
    app.enqueue("ping")
    assert started.wait(poll / 3), "the notification did not wake the worker once it listened again"


@pytest.mark.parametrize("drop", [kill_listener, kill_every_session], ids=["listener", "every session"])
def test_a_listener_whose_connection_dropped_listens_again_at_once(
    qdb: QueueDatabase,
    notifying: dibs.App,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    drop: Callable[[QueueDatabase], None],
) -> None:
    started = ping_task(notifying)
    poll = only_woken(monkeypatch)
    caplog.set_level(logging.INFO, logger="dibs.postgresql")
    with notifying.engine.connect() as conn:  # an idle connection in the pool, for the server to kill too
        conn.execute(sa.select(1))
    listening_worker(qdb, notifying, poll)
    drop(qdb)
    back = f"listening on {CHANNEL} again after its connection dropped: "
    wait_for(caplog, back)
    assert [level for level, _ in said(caplog)] == ["INFO"], said(caplog)
    assert said(caplog)[0][1].startswith(back)
    woken_again(notifying, started, poll)


def test_a_listener_that_cannot_reconnect_says_so_once_and_again_when_it_does(
    qdb: QueueDatabase, notifying: dibs.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    started = ping_task(notifying)
    poll = only_woken(monkeypatch)
    caplog.set_level(logging.INFO, logger="dibs.postgresql")
    refusing = threading.Event()
    refused: list[float] = []

    def refuse(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if refusing.is_set() and threading.current_thread().name == f"dibs-listen-{CHANNEL}":
            refused.append(time.monotonic())
            raise ConnectionRefusedError("no connection for the listener")

    sa.event.listen(notifying.engine.pool, "checkout", refuse)
    listening_worker(qdb, notifying, poll)
    refusing.set()
    killed = time.monotonic()
    kill_listener(qdb)
    deadline = time.monotonic() + 15.0
    while len(refused) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(refused) >= 3, "the listener did not keep trying"
    # A try at once, then one a second later.
    assert refused[0] - killed < 0.9 <= refused[1] - refused[0]
    refusing.clear()
    wait_for(caplog, f"listening on {CHANNEL} again")
    assert said(caplog) == [
        (
            "WARNING",
            f"listening on {CHANNEL} failed, polling until it listens again: no connection for the listener",
        ),
        ("INFO", f"listening on {CHANNEL} again"),
    ]
    woken_again(notifying, started, poll)


def test_a_listener_that_stops_says_nothing_to_the_other_listeners(qdb: QueueDatabase, notifying: dibs.App) -> None:
    heard: list[str] = []
    listener = notifying.store.backend.listen(notifying.engine, CHANNEL, heard.append)
    assert listener is not None
    wait_until(lambda: listener.listening, timeout=10.0)
    url = qdb.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute(f'LISTEN "{CHANNEL}"')
        listener.close()
        assert not listener.listening
        # Every worker of the database listens on this channel: a stopping one has nothing to tell them.
        assert list(other.notifies(timeout=0.5)) == []
    # What it heard: only the look it is told to take once it listens.
    assert heard == [""]
