"""Idle workers wake on PostgreSQL notifications; elsewhere they poll, backing off to the poll period."""

from __future__ import annotations

import threading
import time

from dibs.queue.enqueue import CHANNEL
from tests.queue.database import QueueDatabase


def test_an_idle_worker_starts_a_new_job_promptly(qdb: QueueDatabase) -> None:
    app = qdb.app()
    started = threading.Event()

    @app.task(name="ping")
    async def ping() -> None:
        started.set()

    listener = app.store.backend.listen(app.engine, CHANNEL, lambda payload: None)
    notifies = listener is not None
    if listener is not None:
        listener.close()
    # With notifications the poll period is far longer than the wait we allow: only a wake-up can pass.
    poll = 30.0 if notifies else 0.5
    qdb.start(app, poll=poll)
    time.sleep(3.0)  # idle long enough for the poll backoff to grow past a second
    enqueued = time.monotonic()
    app.enqueue("ping")
    assert started.wait(10.0)
    waited = time.monotonic() - enqueued
    assert waited < (0.5 if notifies else poll + 0.5), f"the worker took {waited:.2f}s to start the job"
