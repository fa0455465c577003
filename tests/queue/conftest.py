"""Fixtures: each queue test runs on PostgreSQL, SQLite and MariaDB, in tables made fresh for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from tests.helpers import BACKENDS
from tests.queue.support import FAST, SYNC_DRIVERS, WorkerThread, drop_everything, family_of
from tests.targets import database_url


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.URL]:
    """A database without dibs tables (a file in tmp_path on SQLite; the session's database on the servers)."""
    family: str = request.param
    url = database_url(request, family, SYNC_DRIVERS[family], tmp_path / "queue.sqlite")
    drop_everything(url)
    yield url
    drop_everything(url)


@pytest.fixture
def queue_url(empty_url: sa.URL) -> sa.URL:
    """A database with a fresh, current dibs schema."""
    engine = dibs.create_engine(empty_url)
    try:
        dibs.migrate(engine)
    finally:
        engine.dispose()
    return empty_url


class QueueDatabase:
    """One test's database: apps and workers on it, all closed when the test ends."""

    def __init__(self, url: sa.URL) -> None:
        self.url = url
        self.family = family_of(url)
        self._engines: list[Engine] = []
        self._workers: list[WorkerThread] = []
        self.engine = self.new_engine()

    def new_engine(self) -> Engine:
        engine = dibs.create_engine(self.url)
        self._engines.append(engine)
        return engine

    def app(self, **options: Any) -> dibs.App:
        """An App on an engine of its own."""
        return dibs.App(self.new_engine(), **options)

    def worker(self, app: dibs.App, **options: Any) -> dibs.Worker:
        """A worker with the test timings, unless overridden."""
        return dibs.Worker(app, **{**FAST, **options})

    def start(self, app: dibs.App, **options: Any) -> WorkerThread:
        """A worker running in a thread until stopped (or, with burst=True, until nothing is left)."""
        running = WorkerThread(self.worker(app, **options)).start()
        self._workers.append(running)
        return running

    def drain(self, app: dibs.App, timeout: float = 30.0, **options: Any) -> dibs.WorkerStats:
        """Run a burst worker until no job of its queues is queued, scheduled or running."""
        return self.start(app, burst=True, **options).join(timeout)

    def close(self) -> None:
        for running in self._workers:
            running.stop()
        for engine in self._engines:
            engine.dispose()


@pytest.fixture
def qdb(queue_url: sa.URL) -> Iterator[QueueDatabase]:
    database = QueueDatabase(queue_url)
    try:
        yield database
    finally:
        database.close()
