"""procrastinate on PostgreSQL, in the configuration its docs give for throughput.

``App.run_worker_async(wait=False, concurrency=...)`` (burst mode: the worker stops once a fetch finds no job)
on the async ``PsycopgConnector``, the connector its docs name for running workers, with an async no-op task.
A procrastinate worker fetches one job per query (``procrastinate_fetch_job_v2``: ``LIMIT 1 ... FOR UPDATE
SKIP LOCKED``) from a single fetch loop, so every setting has batch 1. Its documented lever for throughput
is ``concurrency``, the number of jobs a worker runs at once ("Execute multiple jobs at the same time");
the settings are its default (1) and two concurrent ones. The pool has ``concurrency + 1`` connections, as
its discussion "Mind the size of your PostgreSQL pool" advises for short jobs, all opened before the start;
that is also why the settings stop at 10 rather than the docs' example of 30: 31 connections per process
leave a default ``max_connections = 100`` server short from 4 processes on. ``listen_notify`` is off (the
docs' way to save a connection per worker): the queue is filled before the start, nothing is deferred
during a drain and the notifications only wake a waiting worker, which ``wait=False`` never is, so the
listener would only open a connection inside the timed window. ``fetch_job_polling_interval`` plays no
part for the same reason. ``delete_jobs`` stays at its default, ``never``, so finished jobs keep their
status, attempts and events for ``verify``. The schema comes from ``schema_manager.apply_schema()``, the
jobs from ``batch_defer``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import sqlalchemy as sa

from benchmarks import payload

NAME = "procrastinate"
BACKENDS = ("postgresql",)
PACKAGES = ("procrastinate", "psycopg", "psycopg-pool")
#: Concurrency 1 is its default, 4 was its best here; 10 was slower than 1 or 4 in trials and, at 8 processes,
#: needs 88 of the server's 100 connections.
SETTINGS = [{"concurrency": 1, "batch": 1}, {"concurrency": 4, "batch": 1}]
DATABASE = "dibs_bench_procrastinate"
TASK = "noop"
ENQUEUE_CHUNK = 5_000
TABLES = "procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, procrastinate_workers"


def label(setting: dict[str, Any]) -> str:
    return f"c{setting['concurrency']}"


def parse(text: str) -> list[dict[str, Any]]:
    """``1,4,10``: worker concurrencies (each process opens concurrency + 1 connections)."""
    return [{"concurrency": int(item), "batch": 1} for item in text.split(",")]


def drain(address: str, setting: dict[str, Any], start: Any) -> tuple[int, float, dict[str, Any]]:
    import procrastinate

    concurrency = setting["concurrency"]
    pool_size = concurrency + 1
    connector = procrastinate.PsycopgConnector(conninfo=address, min_size=pool_size, max_size=pool_size)
    app = procrastinate.App(connector=connector)
    done = 0

    @app.task(name=TASK)
    async def noop(**_: Any) -> None:
        nonlocal done
        done += 1

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(app.open_async())  # opens the pool and waits for its min_size connections
    start.wait()
    loop.run_until_complete(
        app.run_worker_async(wait=False, concurrency=concurrency, listen_notify=False, delete_jobs="never")
    )
    end = time.monotonic()
    loop.run_until_complete(app.close_async())
    loop.close()
    return done, end, {}


class Database:
    """procrastinate's schema in a database of its own: installed once, emptied and filled before each trial."""

    def __init__(self, backend: str, server_url: str) -> None:
        import procrastinate
        import psycopg

        server = sa.make_url(server_url).set(drivername="postgresql")
        self.dsn = server.set(database=DATABASE).render_as_string(hide_password=False)
        self.admin = psycopg.connect(server.set(database="postgres").render_as_string(hide_password=False))
        self.admin.autocommit = True
        self.admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        self.admin.execute(f"CREATE DATABASE {DATABASE}")
        self.connection = psycopg.connect(self.dsn, autocommit=True)
        self.app = procrastinate.App(
            connector=procrastinate.SyncPsycopgConnector(conninfo=self.dsn, min_size=1, max_size=1)
        )
        self.app.open()
        self.app.schema_manager.apply_schema()

    def address(self) -> str:
        return self.dsn

    def refill(self, jobs: int) -> None:
        self.connection.execute(f"TRUNCATE {TABLES} RESTART IDENTITY")
        deferrer = self.app.configure_task(TASK)
        for first in range(0, jobs, ENQUEUE_CHUNK):
            size = min(ENQUEUE_CHUNK, jobs - first)
            deferrer.batch_defer(*(payload.args(n) for n in range(first, first + size)))
        self.connection.execute(f"VACUUM ANALYZE {TABLES}")

    def verify(self, jobs: int) -> float:
        # With delete_jobs="never" a finished job stays in procrastinate_jobs as 'succeeded' with attempts 1,
        # and its triggers log one 'deferred', one 'started' and one 'succeeded' event.
        statuses = {
            f"{status}/{attempts}": count
            for status, attempts, count in self.connection.execute(
                "SELECT status::text, attempts, count(*) FROM procrastinate_jobs GROUP BY status, attempts"
            )
        }
        events = {
            kind: (count, distinct)
            for kind, count, distinct in self.connection.execute(
                "SELECT type::text, count(*), count(DISTINCT job_id) FROM procrastinate_events GROUP BY type"
            )
        }
        expected = dict.fromkeys(("deferred", "started", "succeeded"), (jobs, jobs))
        if statuses != {"succeeded/1": jobs} or events != expected:
            raise RuntimeError(
                f"procrastinate: expected {jobs} jobs succeeded once, found jobs by status/attempts {statuses}, "
                f"events (count, distinct jobs) {events}"
            )
        row = self.connection.execute(
            "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') "
            "- min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events"
        ).fetchone()
        return float("nan") if row is None or row[0] is None else float(row[0])

    def close(self) -> None:
        self.app.close()
        self.connection.close()
        self.admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        self.admin.close()
