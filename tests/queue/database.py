"""One queue test's database: apps and workers on it, all closed when the test ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from tests.helpers.processes import ROOT
from tests.queue.support import FAST, WorkerThread, family_of


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


def start_worker(qdb: QueueDatabase, spawned: list[subprocess.Popen[bytes]], log: Path, *options: str) -> None:
    command = [sys.executable, "-m", "tests.queue.worker_process", qdb.url.render_as_string(False), *options]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("wb") as output:
        spawned.append(subprocess.Popen(command, cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT))
