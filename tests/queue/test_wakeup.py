"""Idle workers wake on PostgreSQL notifications; elsewhere they poll, backing off to the poll period."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import dibs
from dibs.queue import fetch
from dibs.queue.enqueue import CHANNEL
from tests.queue.database import QueueDatabase
from tests.queue.support import kill_other_sessions


def notifies(app: dibs.App) -> bool:
    """Whether this database and driver send workers notifications."""
    listener = app.store.backend.listen(app.engine, CHANNEL, lambda payload: None)
    if listener is None:
        return False
    listener.close()
    return True


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


def test_an_idle_worker_starts_a_new_job_promptly(qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    app = qdb.app()
    started = ping_task(app)
    if notifies(app):
        # Only a wake-up can start the job before the poll; how soon it does is the machine's to say.
        poll = only_woken(monkeypatch)
        qdb.start(app, poll=poll)
        time.sleep(1.0)  # idle, past the first claim
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
    assert waited < poll + 0.5, f"the worker took {waited:.2f}s to start the job"


def test_a_worker_whose_listening_connection_dropped_says_so_once_and_is_woken_again(
    qdb: QueueDatabase, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = qdb.app()
    if not notifies(app):
        pytest.skip("this database sends no notifications; workers poll")
    started = ping_task(app)
    poll = only_woken(monkeypatch)
    caplog.set_level(logging.INFO, logger="dibs.postgresql")
    running = qdb.start(app, poll=poll)
    deadline = time.monotonic() + 10.0
    while not running.worker.wakeup.listening and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kill_other_sessions(qdb.url) >= 1
    back = f"listening on {CHANNEL} again"
    while back not in caplog.messages and time.monotonic() < deadline + 10.0:
        time.sleep(0.05)
    said = [record.getMessage() for record in caplog.records if record.name == "dibs.postgresql"]
    assert len(said) == 2, said
    assert said[0].startswith(f"listening on {CHANNEL} failed, polling until it listens again: ")
    assert said[1] == back
    app.enqueue("ping")
    assert started.wait(poll / 3), "the notification did not wake the worker once it listened again"
