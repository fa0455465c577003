"""How each system puts jobs in, batch and one at a time: dibs, the raw floors and the peers.

An enqueuer is made once per backend (its schema installed, its connections open) and then, per trial,
``empty()`` (not timed), ``enqueue(mode, payloads)`` (timed by the caller) and ``count()`` (the rows it
holds afterwards, checked against the payloads). Modes are ``"batch"`` (every job in one call where the
system has a bulk call) and ``"one"`` (one call per job, each committed on its own, awaited before the next).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

import dibs
from benchmarks.connect import psycopg_connect
from benchmarks.peers import node
from dibs.dialects.batch import Stored
from dibs.queue.batch import drafted_jobs, new_batch, stored_jobs

TASK = "noop"
#: The columns a raw INSERT fills, as dibs's enqueue fills them for a job with default options.
COLUMNS = "task, queue, args, priority, status, run_at, max_attempts, enqueued_at"
#: Rows per multi-row INSERT on SQLite and MariaDB: 8 columns x 500 stays under every bound-variable limit.
VALUES_CHUNK = 500
MAX_ATTEMPTS = 3


def noop_app(url: str) -> dibs.App:
    app = dibs.App(url)

    @app.task(name=TASK)
    async def noop(**_: Any) -> None:
        return None

    return app


class Dibs:
    """``enqueue_many`` / ``enqueue`` on an Engine; ``in_transaction`` passes ``conn=`` of a caller's
    transaction instead (one transaction for the batch, one per job one at a time)."""

    def __init__(self, backend: str, url: str, in_transaction: bool = False) -> None:
        self.backend, self.app, self.in_transaction = backend, noop_app(url), in_transaction
        self.app.init()
        self.engine = self.app.engine

    def empty(self) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM dibs_jobs" if self.backend == "sqlite" else "TRUNCATE TABLE dibs_jobs")

    def enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> None:
        app, engine = self.app, self.engine
        if mode == "batch" and self.in_transaction:
            with engine.begin() as conn:
                app.enqueue_many(TASK, payloads, conn=conn)
        elif mode == "batch":
            app.enqueue_many(TASK, payloads)
        elif self.in_transaction:
            for payload in payloads:
                with engine.begin() as conn:
                    app.enqueue(TASK, payload, conn=conn)
        else:
            for payload in payloads:
                app.enqueue(TASK, payload)

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM dibs_jobs").scalar_one())

    def steps(self, payloads: list[dict[str, Any]]) -> dict[str, float]:
        """CPU microseconds per job of each step of one ``enqueue_many``: checking and encoding the arguments,
        making the returned ``Job`` objects (from ids and times standing for the database's), and the rest,
        the INSERT statements through SQLAlchemy and the driver, as the whole call's CPU time less the two."""
        self.empty()
        began = time.process_time()
        self.app.enqueue_many(TASK, payloads)
        whole = time.process_time() - began
        began = time.process_time()
        batch = new_batch(self.app.tasks[TASK], payloads, known_queues=frozenset(), max_args_bytes=1 << 20)
        checked = time.process_time() - began
        if batch is None:
            raise ValueError("no payloads to time")
        now = datetime.now(timezone.utc)
        began = time.process_time()
        stored_jobs(drafted_jobs(batch), [Stored(list(range(1, len(payloads) + 1)), (now, now))])
        made = time.process_time() - began
        per_job = 1e6 / len(payloads)
        return {"check_and_encode": checked * per_job, "insert": (whole - checked - made) * per_job,
                "make_jobs": made * per_job, "whole": whole * per_job}  # fmt: skip

    def close(self) -> None:
        self.engine.dispose()


class Raw(Dibs):
    """The floor: the bare driver writing the same rows into ``dibs_jobs``. PostgreSQL: a batch is one
    ``INSERT ... SELECT FROM unnest(array)`` (or ``COPY`` with ``copy=True``); elsewhere multi-row VALUES in
    one transaction. One at a time: one autocommitted ``INSERT ... VALUES``."""

    def __init__(self, backend: str, url: str, copy: bool = False) -> None:
        super().__init__(backend, url)
        self.copy = copy
        address = sa.make_url(url)
        if backend == "postgresql":
            self.conn: Any = psycopg_connect(url, autocommit=True)
            self.mark = "%s"
        elif backend == "sqlite":
            self.conn = sqlite3.connect(address.database or "", isolation_level=None, timeout=10)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")  # as dibs sets it
            self.mark = "?"
        else:
            import pymysql

            self.conn = pymysql.connect(
                host=address.host, port=address.port or 3306, user=address.username,
                password=address.password or "", database=address.database, autocommit=True,
            )  # fmt: skip
            self.mark = "%s"

    def _row(self, payload: dict[str, Any], now: Any) -> tuple[Any, ...]:
        return (TASK, "default", json.dumps(payload), 0, "queued", now, MAX_ATTEMPTS, now)

    def _now(self) -> Any:
        now = datetime.now(timezone.utc)
        return now if self.backend == "postgresql" else now.replace(tzinfo=None)

    def enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> None:
        if mode == "batch" and self.backend == "postgresql":
            self._pg_batch(payloads)
            return
        cursor = self.conn.cursor()
        values = "(" + ", ".join([self.mark] * 8) + ")"
        if mode == "one":
            for payload in payloads:
                cursor.execute(f"INSERT INTO dibs_jobs ({COLUMNS}) VALUES {values}", self._row(payload, self._now()))
            return
        now = self._now()
        cursor.execute("BEGIN")
        for first in range(0, len(payloads), VALUES_CHUNK):
            chunk = payloads[first : first + VALUES_CHUNK]
            flat = [value for payload in chunk for value in self._row(payload, now)]
            cursor.execute(f"INSERT INTO dibs_jobs ({COLUMNS}) VALUES {', '.join([values] * len(chunk))}", flat)
        cursor.execute("COMMIT")

    def _pg_batch(self, payloads: list[dict[str, Any]]) -> None:
        if self.copy:
            now = self._now()
            with self.conn.cursor() as cursor, cursor.copy(f"COPY dibs_jobs ({COLUMNS}) FROM STDIN") as copy:
                for payload in payloads:
                    copy.write_row(self._row(payload, now))
            return
        self.conn.execute(
            f"INSERT INTO dibs_jobs ({COLUMNS}) SELECT %s, 'default', a, 0, 'queued', now(), %s, now() "
            "FROM unnest(%s::text[]) AS a",
            (TASK, MAX_ATTEMPTS, [json.dumps(payload) for payload in payloads]),
        )

    def close(self) -> None:
        self.conn.close()
        super().close()


class Pgqueuer:
    """pgqueuer's ``Queries.enqueue`` on asyncpg and uvloop: lists of entrypoints, payload bytes and
    priorities in one call, or one job per call."""

    def __init__(self, backend: str, server_url: str) -> None:
        import uvloop

        from benchmarks.peers import pgqueuer

        self.database = pgqueuer.Database(backend, server_url)
        self.loop = uvloop.new_event_loop()
        self.queries, self.connection = self.loop.run_until_complete(self.database._queries())

    def empty(self) -> None:
        self.loop.run_until_complete(self.queries.clear_queue())
        self.loop.run_until_complete(self.queries.clear_queue_log())

    def enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> None:
        self.loop.run_until_complete(self._enqueue(mode, payloads))

    async def _enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> None:
        if mode == "batch":
            encoded = [json.dumps(payload).encode() for payload in payloads]
            await self.queries.enqueue([TASK] * len(payloads), encoded, [0] * len(payloads))
            return
        for payload in payloads:
            await self.queries.enqueue(TASK, json.dumps(payload).encode(), 0)

    def count(self) -> int:
        return int(self.loop.run_until_complete(self.connection.fetchval("SELECT count(*) FROM pgqueuer")))

    def close(self) -> None:
        self.loop.run_until_complete(self.connection.close())
        self.loop.close()
        self.database.close()


class Procrastinate:
    """procrastinate's ``batch_defer`` / ``defer`` on its sync psycopg connector (what a sync producer uses)."""

    def __init__(self, backend: str, server_url: str) -> None:
        from benchmarks.peers import procrastinate

        self.database = procrastinate.Database(backend, server_url)
        self.deferrer = self.database.app.configure_task(procrastinate.TASK)

    def empty(self) -> None:
        self.database.refill(0)

    def enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> None:
        if mode == "batch":
            self.deferrer.batch_defer(*payloads)
            return
        for payload in payloads:
            self.deferrer.defer(**payload)

    def count(self) -> int:
        return int(self.database.connection.execute("SELECT count(*) FROM procrastinate_jobs").fetchone()[0])

    def close(self) -> None:
        self.database.close()


class Huey:
    """huey's ``enqueue`` of one task per call (it has no bulk call), on ``SqliteHuey``."""

    def __init__(self, backend: str, url: str) -> None:
        from benchmarks.peers import huey

        self.database = huey.Database(backend, url)

    def empty(self) -> None:
        self.database.huey.flush()

    def enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> None:
        if mode == "batch":
            raise ValueError("huey has no bulk enqueue")
        huey, noop = self.database.huey, self.database.noop
        for payload in payloads:
            huey.enqueue(noop.s(**payload))

    def count(self) -> int:
        return int(self.database.huey.pending_count())

    def close(self) -> None:
        self.database.huey.storage.close()


class Node:
    """graphile-worker (``addJobs`` / ``addJob``) or pg-boss (``insert`` / ``send``), timed by its Node driver
    in a fresh database of its own; ``enqueue`` returns the driver's own seconds."""

    def __init__(self, kind: str, server_url: str, payload_file: Callable[[int], str]) -> None:
        self.kind, self.server_url, self.payload_file = kind, server_url, payload_file
        self.database = "dibs_bench_enqueue_" + kind.replace("-", "_")
        self.found = 0
        self.versions: dict[str, str] = {}

    def empty(self) -> None:
        self.dsn = node.fresh_database(self.server_url, self.database)

    def enqueue(self, mode: str, payloads: list[dict[str, Any]]) -> float:
        result = node.run(self.kind, "enqueue", self.dsn, mode, self.payload_file(len(payloads)))
        self.found = int(result["jobs"])
        self.versions = {self.kind: str(result["version"]), "node": str(result["node"])}
        return float(result["seconds"])

    def count(self) -> int:
        return self.found

    def close(self) -> None:
        node.drop_database(self.server_url, self.database)
