"""pgqueuer on PostgreSQL, in the configuration its docs give for throughput.

``PgQueuer.run(mode=drain, batch_size=...)`` on one asyncpg connection per process (its performance guide
advises a direct asyncpg connection for the QueueManager), on uvloop (as ``pgq run`` does), its schema
from ``Queries.install()`` plus the ``pgq autovac`` settings, durability ``durable`` (its default: every
table logged, as ``dibs_jobs`` is), no ``max_concurrent_tasks`` cap.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import sqlalchemy as sa

from benchmarks import payload

NAME = "pgqueuer"
BACKENDS = ("postgresql",)
PACKAGES = ("pgqueuer", "asyncpg", "uvloop")
#: batch_size 10 is its default; in earlier runs it drained at a third of the rate of 100 and 500, and
#: 1000 was no faster than 500.
SETTINGS = [{"driver": "apg", "batch": 100}, {"driver": "apg", "batch": 500}]
DATABASE = "dibs_bench_pgqueuer"
ENQUEUE_CHUNK = 5_000


def label(setting: dict[str, Any]) -> str:
    return f"{setting['driver']}/b{setting['batch']}"


def parse(text: str) -> list[dict[str, Any]]:
    """``apg/10,apgpool/500``: driver/batch_size pairs."""
    settings = []
    for item in text.split(","):
        driver, batch = item.split("/")
        settings.append({"driver": driver, "batch": int(batch)})
    return settings


async def _driver(dsn: str, kind: str) -> Any:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver

    if kind == "apgpool":
        return AsyncpgPoolDriver(await asyncpg.create_pool(dsn, min_size=2, max_size=10))
    return AsyncpgDriver(await asyncpg.connect(dsn))


def drain(address: str, setting: dict[str, Any], start: Any) -> tuple[int, float, dict[str, Any]]:
    import uvloop
    from pgqueuer import PgQueuer
    from pgqueuer.types import QueueExecutionMode

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    driver = loop.run_until_complete(_driver(address, setting["driver"]))
    pgq = PgQueuer(driver)
    done = 0

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        # pgqueuer hands over the payload as bytes; a real handler decodes it, as dibs decodes its arguments.
        nonlocal done
        done += 1 if json.loads(job.payload) else 0

    options: dict[str, Any] = {"batch_size": setting["batch"], "mode": QueueExecutionMode.drain}
    if setting.get("max_concurrent_tasks"):
        options["max_concurrent_tasks"] = setting["max_concurrent_tasks"]
    start.wait()
    loop.run_until_complete(pgq.run(**options))
    end = time.monotonic()
    loop.close()
    return done, end, {}


class Database:
    """pgqueuer's schema in a database of its own: installed once, emptied and filled before each trial."""

    def __init__(self, backend: str, server_url: str) -> None:
        import psycopg

        server = sa.make_url(server_url).set(drivername="postgresql")
        self.dsn = server.set(database=DATABASE).render_as_string(hide_password=False)
        self.admin = psycopg.connect(server.set(database="postgres").render_as_string(hide_password=False))
        self.admin.autocommit = True
        self.admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        self.admin.execute(f"CREATE DATABASE {DATABASE}")
        self._run(self._install())

    def address(self) -> str:
        return self.dsn

    def _run(self, work: Any) -> Any:
        import uvloop

        return uvloop.run(work)

    async def _queries(self) -> tuple[Any, Any]:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        connection = await asyncpg.connect(self.dsn)
        return Queries(AsyncpgDriver(connection)), connection

    async def _install(self) -> None:
        queries, connection = await self._queries()
        await queries.install()
        await queries.optimize_autovacuum()  # `pgq autovac`, on the docs' checklist
        await connection.close()

    async def _fill(self, jobs: int) -> None:
        queries, connection = await self._queries()
        await queries.clear_queue()
        await queries.clear_queue_log()
        await queries.clear_statistics_log()
        for first in range(0, jobs, ENQUEUE_CHUNK):
            size = min(ENQUEUE_CHUNK, jobs - first)
            encoded = [json.dumps(payload.args(n)).encode() for n in range(first, first + size)]
            await queries.enqueue(["noop"] * size, encoded, [0] * size)
        await connection.execute("VACUUM ANALYZE pgqueuer")
        await connection.close()

    async def _finished(self) -> tuple[int, dict[str, int], float]:
        _, connection = await self._queries()
        left = await connection.fetchval("SELECT count(*) FROM pgqueuer")
        logged = dict(await connection.fetch("SELECT status::text, count(*) FROM pgqueuer_log GROUP BY status"))
        span = await connection.fetchval(
            "SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful') "
            "- min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log"
        )
        await connection.close()
        return left, logged, float(span)

    def refill(self, jobs: int) -> None:
        self._run(self._fill(jobs))

    def verify(self, jobs: int) -> float:
        left, logged, span = self._run(self._finished())
        # pgqueuer deletes a finished job from its queue and logs it queued, picked and successful.
        if left or logged != {"queued": jobs, "picked": jobs, "successful": jobs}:
            raise RuntimeError(
                f"pgqueuer: expected {jobs} jobs successful, found {left} left in the queue, log {logged}"
            )
        return float(span)

    def close(self) -> None:
        self.admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        self.admin.close()
