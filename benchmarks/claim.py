"""Claim + complete throughput: dibs beside the same cycle written as raw SQL on the raw driver.

One cycle is a fenced lease claim of up to ``batch`` rows (ready rows, or running rows whose lease
expired; owner, expiry on the database clock, token + 1, attempts + 1) and one batched, token-fenced
completion of the rows it got. The raw floor runs the same statements, written by hand, on the bare
driver (psycopg, sqlite3, PyMySQL), in the same run, on the same freshly filled table. Trials
alternate between dibs and raw so that drift on a noisy machine hits both; medians are reported.

    python -m benchmarks.claim                       # every backend, batch 1/10/100/1000, 1 and 2 processes
    python -m benchmarks.claim --backends sqlite --batches 10,100 --repeats 5

dibs runs twice: with every call on the engine (a pool checkout per call, the simplest use), and with
every call on one connection the loop holds (as the floor holds its one driver connection).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs

POSTGRES_URL = os.environ.get("DIBS_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get("DIBS_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
TABLE = "dibs_bench_claim"
ROWS_FOR_BATCH = {1: 3_000, 10: 20_000, 100: 60_000, 1000: 100_000}
RESULTS = Path(__file__).parent / "results"


def bench_table() -> sa.Table:
    return sa.Table(
        TABLE,
        sa.MetaData(),
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=False),
        sa.Column("payload", sa.String(100), nullable=True),
        *dibs.lease_columns(),
        # Claimable rows only: finished ones never slow the claim down.
        sa.Index(
            f"{TABLE}_claimable",
            "id",
            postgresql_where=sa.text("status IN ('ready', 'running')"),
            sqlite_where=sa.text("status IN ('ready', 'running')"),
        ),
    )


# -- filling ---------------------------------------------------------------------------------------


def fill(backend: str, url: str, rows: int) -> None:
    """A fresh table of ``rows`` ready rows."""
    engine = sa.create_engine(url)
    table = bench_table()
    table.drop(engine, checkfirst=True)
    table.create(engine)
    with engine.begin() as conn:
        if backend == "postgresql":
            conn.exec_driver_sql(f"INSERT INTO {TABLE} (id) SELECT generate_series(1, {rows})")
        elif backend == "sqlite":
            conn.exec_driver_sql(
                f"WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < {rows}) "
                f"INSERT INTO {TABLE} (id) SELECT x FROM n"
            )
        else:
            conn.exec_driver_sql(f"INSERT INTO {TABLE} (id) SELECT seq FROM seq_1_to_{rows}")
    if backend == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"VACUUM ANALYZE {TABLE}")
    engine.dispose()


# -- the cycle through dibs ------------------------------------------------------------------------


def dibs_worker(url: str, batch: int, owner: str) -> int:
    """Every call on the engine: each checks a connection out of the pool and back in."""
    engine = dibs.create_engine(url)
    leases = dibs.Leases(bench_table())
    order = leases.table.c.id
    done = 0
    while held := leases.claim(engine, owner=owner, duration=30, limit=batch, order_by=order):
        leases.complete_many(engine, held)
        done += len(held)
    engine.dispose()
    return done


def dibs_connection_worker(url: str, batch: int, owner: str) -> int:
    """Every call on one connection the loop holds, as the raw floor holds its one driver connection."""
    engine = dibs.create_engine(url)
    leases = dibs.Leases(bench_table())
    order = leases.table.c.id
    done = 0
    with engine.connect() as conn:
        while held := leases.claim(conn, owner=owner, duration=30, limit=batch, order_by=order):
            leases.complete_many(conn, held)
            done += len(held)
    engine.dispose()
    return done


# -- the same cycle in raw SQL on the raw driver ---------------------------------------------------

PG_CLAIM = f"""
WITH picked AS MATERIALIZED (
    SELECT id FROM {TABLE}
    WHERE status = 'ready' OR (status = 'running' AND lease_expires_at < now())
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
UPDATE {TABLE} AS t SET status = 'running', lease_owner = %(owner)s,
    lease_expires_at = now() + interval '30 seconds', lease_token = t.lease_token + 1, attempts = t.attempts + 1
WHERE t.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING t.*
"""
# The held tokens as one JSON object from id to token, read per row by key (as dibs does).
PG_COMPLETE = f"""
UPDATE {TABLE} SET status = 'done', lease_expires_at = NULL
WHERE id = ANY(%(ids)s::bigint[])
    AND lease_token = ((SELECT %(tokens)s::jsonb) ->> id::text)::bigint
    AND status = 'running'
RETURNING id, lease_token
"""
SQLITE_COMPLETE = f"""
UPDATE {TABLE} SET status = 'done', lease_expires_at = NULL
FROM json_each(?) AS held
WHERE {TABLE}.id = CAST(held.key AS INTEGER) AND {TABLE}.lease_token = held.value AND {TABLE}.status = 'running'
RETURNING id
"""


def held_tokens(ids: list[int], tokens: list[int]) -> str:
    """The tokens of a fenced completion: a JSON object from each id to its token."""
    return json.dumps(dict(zip(ids, tokens, strict=True)))


def raw_postgresql_worker(url: str, batch: int, owner: str) -> int:
    import psycopg

    address = sa.make_url(url)
    # Each statement is atomic on its own: autocommit spares the BEGIN and COMMIT round trips.
    with psycopg.connect(
        host=address.host, port=address.port, user=address.username, dbname=address.database, autocommit=True
    ) as conn:
        done = 0
        while True:
            rows = conn.execute(PG_CLAIM, {"batch": batch, "owner": owner}).fetchall()
            if not rows:
                return done
            ids = [row[0] for row in rows]
            tokens = held_tokens(ids, [row[5] for row in rows])
            conn.execute(PG_COMPLETE, {"ids": ids, "tokens": tokens}).fetchall()
            done += len(rows)


SQLITE_CLAIM = f"""
UPDATE {TABLE} SET status = 'running', lease_owner = ?, lease_expires_at = ?,
    lease_token = lease_token + 1, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM {TABLE} WHERE status = 'ready' OR (status = 'running' AND lease_expires_at < ?)
    ORDER BY id LIMIT ?)
RETURNING *
"""


def raw_sqlite_worker(url: str, batch: int, owner: str) -> int:
    from datetime import datetime, timedelta, timezone

    conn = sqlite3.connect(sa.make_url(url).database or "", isolation_level=None, timeout=10)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    done = 0
    while True:
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(SQLITE_CLAIM, (owner, str(now + timedelta(seconds=30)), str(now), batch)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            conn.close()
            return done
        tokens = held_tokens([row[0] for row in rows], [row[5] for row in rows])
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(SQLITE_COMPLETE, (tokens,)).fetchall()
        conn.execute("COMMIT")
        done += len(rows)


def raw_mariadb_worker(url: str, batch: int, owner: str) -> int:
    import pymysql

    address = sa.make_url(url)
    conn = pymysql.connect(
        host=address.host, port=address.port or 3306, user=address.username, database=address.database
    )
    cursor = conn.cursor()
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    done = 0
    while True:
        cursor.execute(
            f"SELECT id FROM {TABLE} WHERE status = 'ready' "
            "OR (status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6)) "
            "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
            (batch,),
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            conn.commit()
            conn.close()
            return done
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"UPDATE {TABLE} SET status = 'running', lease_owner = %s, "
            "lease_expires_at = TIMESTAMPADD(MICROSECOND, 30000000, UTC_TIMESTAMP(6)), "
            f"lease_token = lease_token + 1, attempts = attempts + 1 WHERE id IN ({marks})",
            (owner, *ids),
        )
        cursor.execute(f"SELECT * FROM {TABLE} WHERE id IN ({marks})", ids)
        rows = cursor.fetchall()
        conn.commit()
        pairs = ", ".join(["(%s, %s)"] * len(rows))
        cursor.execute(
            f"UPDATE {TABLE} SET status = 'done', lease_expires_at = NULL "
            f"WHERE id IN ({marks}) AND (id, lease_token) IN ({pairs}) AND status = 'running'",
            [row[0] for row in rows] + [value for row in rows for value in (row[0], row[5])],
        )
        conn.commit()
        done += len(rows)


RAW_WORKERS: dict[str, Callable[[str, int, str], int]] = {
    "postgresql": raw_postgresql_worker,
    "sqlite": raw_sqlite_worker,
    "mariadb": raw_mariadb_worker,
}


# -- running trials --------------------------------------------------------------------------------


DIBS_WORKERS: dict[str, Callable[[str, int, str], int]] = {"dibs": dibs_worker, "dibs-conn": dibs_connection_worker}
KINDS = ("raw", *DIBS_WORKERS)


def _timed(kind: str, backend: str, url: str, batch: int, owner: str, start: Any) -> tuple[int, float]:
    worker = DIBS_WORKERS.get(kind) or RAW_WORKERS[backend]
    start.wait()
    done = worker(url, batch, owner)
    return done, time.monotonic()


@dataclass
class Trial:
    backend: str
    kind: str
    batch: int
    processes: int
    rows: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds


def trial(kind: str, backend: str, url: str, batch: int, processes: int) -> Trial:
    rows = ROWS_FOR_BATCH.get(batch, 50_000)
    fill(backend, url, rows)
    context = multiprocessing.get_context("spawn")
    start = context.Manager().Barrier(processes + 1)
    with context.Pool(processes) as pool:
        pending = pool.starmap_async(
            _timed, [(kind, backend, url, batch, f"{kind}-{n}", start) for n in range(processes)]
        )
        start.wait()
        began = time.monotonic()
        results = pending.get()
    claimed = sum(done for done, _ in results)
    if claimed != rows:
        raise RuntimeError(f"{kind} on {backend} finished {claimed} of {rows} rows")
    return Trial(backend, kind, batch, processes, rows, max(end for _, end in results) - began)


def urls(tmp: Path) -> dict[str, str]:
    return {"postgresql": POSTGRES_URL, "sqlite": f"sqlite:///{tmp / 'bench.sqlite'}", "mariadb": MARIADB_URL}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="postgresql,sqlite,mariadb")
    parser.add_argument("--batches", default="1,10,100,1000")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args(argv)
    backends = options.backends.split(",")
    batches = [int(b) for b in options.batches.split(",")]
    process_counts = [int(p) for p in options.processes.split(",")]

    trials: list[Trial] = []
    with tempfile.TemporaryDirectory() as tmp:
        where = urls(Path(tmp))
        for backend in backends:
            for batch in batches:
                for processes in process_counts:
                    for _ in range(options.repeats):
                        for kind in KINDS:
                            result = trial(kind, backend, where[backend], batch, processes)
                            trials.append(result)
                            print(
                                f"  {backend:<10} batch {batch:>4}  x{processes}  {kind:<9} "
                                f"{result.rows_per_second:>10,.0f} rows/s",
                                flush=True,
                            )
    report(trials)


def report(trials: list[Trial]) -> None:
    print(
        "\nmedian rows/s (claim + fenced complete); ratio = dibs / raw floor, same run\n"
        "dibs: each call on the engine (a pool checkout per call); dibs-conn: each call on one held connection"
    )
    print(f"{'backend':<11}{'batch':>6}{'procs':>6}{'raw':>12}{'dibs':>12}{'ratio':>8}{'dibs-conn':>12}{'ratio':>8}")
    summary = []
    keys = sorted({(t.backend, t.batch, t.processes) for t in trials}, key=lambda k: (k[0], k[1], k[2]))
    for backend, batch, processes in keys:
        medians = {
            kind: statistics.median(
                t.rows_per_second
                for t in trials
                if (t.backend, t.batch, t.processes, t.kind) == (backend, batch, processes, kind)
            )
            for kind in KINDS
        }
        ratio = medians["dibs"] / medians["raw"]
        held_ratio = medians["dibs-conn"] / medians["raw"]
        summary.append(
            {
                "backend": backend,
                "batch": batch,
                "processes": processes,
                **medians,
                "ratio": ratio,
                "ratio_conn": held_ratio,
            }
        )
        print(
            f"{backend:<11}{batch:>6}{processes:>6}{medians['raw']:>12,.0f}{medians['dibs']:>12,.0f}{ratio:>8.2f}"
            f"{medians['dibs-conn']:>12,.0f}{held_ratio:>8.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"claim-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "claim",
                "machine": {
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                },
                "versions": {"dibs": dibs.__version__, "sqlalchemy": sa.__version__, "sqlite": sqlite3.sqlite_version},
                "summary": summary,
                "trials": [asdict(t) | {"rows_per_second": t.rows_per_second} for t in trials],
            },
            indent=2,
        )
    )
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
