"""The dashboard's pages on a table of 1,000,000 jobs: the server time of each (median of several requests).

    python -m benchmarks.dashboard [--jobs 1000000] [--backends sqlite,postgresql] [--repeat 7]

The jobs are written by one INSERT ... SELECT (a series on PostgreSQL, a recursive CTE on SQLite): most
succeeded over the last two hours, some dead, a backlog queued on three queues, some scheduled. Each page is
requested through the ASGI app in this process (httpx's ASGI transport), so the time is the server's:
its queries and the rendering, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

import dibs
import dibs.dashboard
from dibs.schema import metadata

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

#: Per job number n: its state, queue and age, as SQL over n (portable arithmetic).
_FILL = """
INSERT INTO dibs_jobs (task, queue, args, priority, status, run_at, attempts, max_attempts, lease_token,
                       cancel_requested, enqueued_at, finished_at, last_error, dedupe_key)
SELECT 'shop.task' || (n % 7), 'queue' || (n % 3), '{{"order": ' || n || '}}', 0,
       CASE WHEN n % 100 < 90 THEN 'succeeded' WHEN n % 100 < 95 THEN 'dead'
            WHEN n % 100 < 99 THEN 'queued' ELSE 'scheduled' END,
       {now}, 1, 3, 1, {false}, {now},
       CASE WHEN n % 100 < 95 THEN {ago} END,
       CASE WHEN n % 100 BETWEEN 90 AND 94 THEN 'ValueError: boom' END,
       CASE WHEN n % 1000 = 995 THEN 'key' || n END
FROM {series}
"""


def fill(engine: sa.Engine, count: int) -> None:
    """``count`` jobs in a fresh dibs schema."""
    metadata.drop_all(engine)
    dibs.migrate(engine)
    if engine.dialect.name == "postgresql":
        statement = _FILL.format(
            now="now()",
            false="false",
            ago="now() - (n % 7200) * interval '1 second'",
            series=f"generate_series(1, {count}) AS n",
        )
    else:
        statement = _FILL.format(
            now="strftime('%Y-%m-%d %H:%M:%f', 'now')",
            false="0",
            ago="strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || (n % 7200) || ' seconds')",
            series=f"(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {count}) "
            "SELECT n FROM s)",
        )
    with engine.begin() as conn:
        conn.execute(sa.text(statement))
    # As autovacuum leaves a table that has settled (PostgreSQL then reads its indexes without the table).
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE" if engine.dialect.name == "sqlite" else "VACUUM ANALYZE dibs_jobs"))


def pages(engine: sa.Engine) -> dict[str, str]:
    """The pages to time, by name."""
    with engine.connect() as conn:
        some_job = conn.execute(sa.text("SELECT max(id) FROM dibs_jobs WHERE status = 'dead'")).scalar_one()
    return {
        "overview": "/",
        "overview (live part)": "/live/overview",
        "workers": "/workers",
        "jobs": "/jobs",
        "jobs, dead": "/jobs?status=dead",
        "jobs, queue and task": "/jobs?queue=queue1&task=shop.task3",
        "jobs, next page": "/jobs?before=500000",
        "jobs, key": "/jobs?key=key998995",
        "jobs, text in arguments": "/jobs?text=order%22%3A%20999999",
        "jobs, text found nowhere": "/jobs?text=nowhere",
        "jobs, text, an older window": "/jobs?text=nowhere&before=500000",
        "job": f"/jobs/{some_job}",
        "schedules": "/schedules",
        "outbox": "/outbox",
    }


async def measure(engine: sa.Engine, repeat: int) -> dict[str, float]:
    """The median server time of each page, in milliseconds."""
    app = dibs.dashboard.create_app(dibs.App(engine))
    transport = httpx.ASGITransport(app=app)
    timings: dict[str, float] = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://dashboard") as client:
        for name, path in pages(engine).items():
            samples = []
            for _ in range(repeat + 1):
                started = time.perf_counter()
                response = await client.get(path)
                samples.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (path, response.status_code)
            timings[name] = statistics.median(samples[1:])  # the first warms the caches
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here too.")
    parser.add_argument(
        "--postgres", default=POSTGRES, help="The PostgreSQL database to fill (its dibs tables are dropped)."
    )
    options = parser.parse_args()
    results: dict[str, Any] = {"jobs": options.jobs, "milliseconds": {}}
    with tempfile.TemporaryDirectory() as directory:
        for backend in options.backends.split(","):
            url = options.postgres if backend == "postgresql" else f"sqlite:///{directory}/dashboard.sqlite"
            engine = dibs.create_engine(url)
            started = time.perf_counter()
            fill(engine, options.jobs)
            print(f"{backend}: {options.jobs:,} jobs written in {time.perf_counter() - started:.0f} s", flush=True)
            timings = asyncio.run(measure(engine, options.repeat))
            results["milliseconds"][backend] = timings
            for name, milliseconds in timings.items():
                print(f"  {name:<28} {milliseconds:8.1f} ms", flush=True)
            metadata.drop_all(engine)
            engine.dispose()
    if options.out is not None:
        options.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
