"""Drain throughput of the job queue: dibs beside pgqueuer and beside the raw-SQL floor; and pickup latency.

A trial enqueues N no-op jobs up front, then 1 or 2 worker processes drain them; they start together on
a barrier, and throughput is N / the time from the barrier to the last process finishing. After every
trial the database is checked: every job must be finished exactly once, or the run stops.

* ``dibs``: ``app.worker(burst=True, concurrency=C, batch=B)``, an async no-op task, on PostgreSQL
  (psycopg), SQLite (a file in a temp dir) and MariaDB (PyMySQL), at several (C, B) settings.
* ``pgqueuer`` (PostgreSQL only, its own database): ``PgQueuer.run(mode=drain)`` on asyncpg and uvloop,
  the setup its docs recommend for throughput, at several batch sizes.
* ``raw``: the floor. A loop on the bare driver of one claim statement of a batch (the shape dibs
  uses) and, on a second connection and thread, one batched, token-fenced completion of the batch
  before (dibs's worker overlaps them the same way), on the same freshly filled ``dibs_jobs`` table, at
  each batch size the dibs settings use.
* ``graphile-worker`` and ``pg-boss`` (PostgreSQL, where Node is installed): their Node drivers in
  ``benchmarks/peers``, each in a database of its own.

Every job carries the same small arguments (``benchmarks.payload``); every kind drains the same N jobs
with two settings; ``--gc`` tunes the garbage collector of every worker process alike, or none.

Trials alternate between kinds within each round so that drift on a noisy machine hits all of them;
medians are reported. Then, on PostgreSQL, enqueue-to-start latency: a producer process enqueues one job
at a time at a fixed rate to a running (not burst) worker that wakes on LISTEN/NOTIFY.

    python -m benchmarks.drain                                  # everything, about ten minutes
    python -m benchmarks.drain --backends sqlite --processes 1 --repeats 5
    python -m benchmarks.drain --backends postgresql --configs 1000x500 --latency-seconds 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import math
import multiprocessing
import os
import platform
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs
from benchmarks import payload, record
from benchmarks.connect import psycopg_connect
from benchmarks.peers import node
from dibs.runtime.collector import tuned_gc

# The servers (the same variables as benchmarks.claim); the run works in databases of its own on them,
# created at the start and dropped at the end, so that it never touches anyone's dibs tables.
POSTGRES_URL = os.environ.get("DIBS_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get("DIBS_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
#: Its own database; a name of your own (DIBS_BENCH_DATABASE) keeps two runs on one server apart.
DATABASE = os.environ.get("DIBS_BENCH_DATABASE", "dibs_bench_drain")
#: The N jobs, enqueued once through dibs and copied into dibs_jobs before every trial.
TEMPLATE = "dibs_bench_drain_template"
ENQUEUE_CHUNK = 5_000
#: N, the jobs of every trial of every kind on a backend: enough for a few seconds of the fastest drains.
DEFAULT_JOBS = {"postgresql": 20_000, "sqlite": 20_000, "mariadb": 20_000}
#: A trial drains min(N, JOBS_PER_BATCH x batch) jobs, so that small batches do not take minutes.
JOBS_PER_BATCH = 250
BACKENDS = ("postgresql", "sqlite", "mariadb")
#: Where the results go; a test points it elsewhere so that its tiny runs never join the published ones.
GC_VARIABLE = "DIBS_BENCH_GC"
RESULTS = Path(os.environ.get("DIBS_BENCH_RESULTS", Path(__file__).parent / "results"))


def drain_app(url: str) -> dibs.App:
    """The app every dibs process uses: one async no-op task."""
    app = dibs.App(url)

    @app.task(name="noop")
    async def noop(**_: Any) -> None:
        return None

    return app


def trial_jobs(batch: int, jobs: int) -> int:
    return min(jobs, JOBS_PER_BATCH * batch)


# -- the jobs table, filled once and copied before every trial --------------------------------------


def prepare(backend: str, url: str, jobs: int) -> float:
    """A fresh dibs schema and a template of ``jobs`` jobs enqueued through dibs; returns enqueue jobs/s."""
    app = drain_app(url)
    engine = app.engine
    dibs.schema.metadata.drop_all(engine)
    app.init()
    began = time.perf_counter()
    for first in range(0, jobs, ENQUEUE_CHUNK):
        app.enqueue_many("noop", [payload.args(n) for n in range(first, min(first + ENQUEUE_CHUNK, jobs))])
    enqueued = jobs / (time.perf_counter() - began)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TEMPLATE}")
        conn.exec_driver_sql(f"CREATE TABLE {TEMPLATE} AS SELECT * FROM dibs_jobs")
    engine.dispose()
    return enqueued


def refill(backend: str, url: str, jobs: int) -> None:
    """dibs_jobs holds exactly the first ``jobs`` template jobs, all queued, statistics fresh."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM dibs_jobs" if backend == "sqlite" else "TRUNCATE TABLE dibs_jobs")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO dibs_jobs SELECT * FROM {TEMPLATE} ORDER BY id LIMIT {jobs}")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if backend == "postgresql":
            conn.exec_driver_sql("VACUUM ANALYZE dibs_jobs")
        elif backend == "sqlite":
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            conn.exec_driver_sql("ANALYZE TABLE dibs_jobs").all()
    engine.dispose()


SPAN = {
    "postgresql": "extract(epoch FROM max(finished_at) - min(started_at))",
    "sqlite": "(julianday(max(finished_at)) - julianday(min(started_at))) * 86400",
    "mariadb": "TIMESTAMPDIFF(MICROSECOND, min(started_at), max(finished_at)) / 1e6",
}


def verify(backend: str, url: str, jobs: int, kind: str) -> float:
    """Every job succeeded, each claimed exactly once (raise otherwise); returns the seconds from the first
    claim to the last completion on the database clock."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT status, count(*), min(attempts), max(attempts) FROM dibs_jobs GROUP BY status"
        ).all()
        span = conn.exec_driver_sql(f"SELECT {SPAN[backend]} FROM dibs_jobs").scalar_one()
    engine.dispose()
    found = {status: (count, low, high) for status, count, low, high in rows}
    if set(found) != {"succeeded"} or found["succeeded"] != (jobs, 1, 1):
        raise RuntimeError(
            f"{kind} on {backend}: expected {jobs} jobs succeeded after one attempt each, found "
            f"{ {status: f'{count} (attempts {low}..{high})' for status, (count, low, high) in found.items()} }"
        )
    return float(span)


# -- dibs ------------------------------------------------------------------------------------------


def dibs_drain(url: str, setting: dict[str, Any], owner: str, start: Any) -> tuple[int, float, dict[str, Any]]:
    app = drain_app(url)
    worker = app.worker(
        burst=True,
        concurrency=setting["concurrency"],
        batch=setting["batch"],
        poll=setting["poll"],
        connections=setting.get("connections"),
        handle_signals=False,
        name=owner,
        tune_gc=tuned(),  # with --gc, as `dibs worker` runs it; the other kinds get the same (see _process)
    )
    with contextlib.ExitStack() as opened:
        for _ in range(worker.connections):
            opened.enter_context(app.engine.connect())
    # The pool's connections, one per database thread of the worker, are made before the clock starts, as
    # every kind's are.
    start.wait()
    stats = worker.run()
    end = time.monotonic()
    app.engine.dispose()
    return stats.succeeded, end, asdict(stats)


# -- the raw floor: one claim statement and one batched completion, in a loop, on the bare driver ---

PG_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM dibs_jobs
    WHERE status = 'queued' AND queue = 'default'
    ORDER BY priority DESC, run_at, id
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
UPDATE dibs_jobs AS j SET status = 'running', lease_owner = %(owner)s,
    lease_expires_at = statement_timestamp() + interval '30 seconds', lease_token = j.lease_token + 1,
    attempts = j.attempts + 1, started_at = statement_timestamp()
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.*
"""
# The held tokens as one JSON object from id to token, read per row by key (as dibs does).
PG_COMPLETE = """
UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL,
    finished_at = statement_timestamp()
WHERE id = ANY(%(ids)s::bigint[])
    AND lease_token = ((SELECT %(tokens)s::jsonb) ->> id::text)::bigint
    AND status = 'running'
RETURNING id
"""
SQLITE_COMPLETE = """
UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL, finished_at = ?
FROM json_each(?) AS held
WHERE dibs_jobs.id = CAST(held.key AS INTEGER) AND dibs_jobs.lease_token = held.value AND dibs_jobs.status = 'running'
RETURNING id
"""


def held_tokens(ids: list[int], tokens: list[int]) -> str:
    """The tokens of a fenced completion: a JSON object from each id to its token."""
    return json.dumps(dict(zip(ids, tokens, strict=True)))


#: The ids of a claimed batch and their lease tokens.
Held = tuple[list[int], list[int]]


def overlapped(claim: Callable[[], Held], complete: Callable[[list[int], list[int]], int]) -> int:
    """Claim batches on this thread while a second thread completes the previous one on a connection of its
    own, as dibs's worker overlaps them; returns the jobs completed. ``claim`` returns the ids and tokens it
    got, none once the queue is empty."""
    handoff: queue.Queue[Held | None] = queue.Queue(maxsize=1)
    done = 0

    def completer() -> None:
        nonlocal done
        while (held := handoff.get()) is not None:
            done += complete(*held)

    thread = threading.Thread(target=completer, name="raw-completer")
    thread.start()
    try:
        while (held := claim())[0]:
            handoff.put(held)
    finally:
        handoff.put(None)
        thread.join()
    return done


def raw_postgresql(url: str, batch: int, owner: str, start: Any) -> int:
    # Autocommit: each statement is atomic on its own, no BEGIN/COMMIT round trips.
    with psycopg_connect(url, autocommit=True) as claimer, psycopg_connect(url, autocommit=True) as completer:

        def claim() -> tuple[list[int], list[int]]:
            cursor = claimer.execute(PG_CLAIM, {"batch": batch, "owner": owner})
            rows = cursor.fetchall()
            token = [column.name for column in cursor.description or ()].index("lease_token")
            return [row[0] for row in rows], [row[token] for row in rows]

        def complete(ids: list[int], tokens: list[int]) -> int:
            return len(completer.execute(PG_COMPLETE, {"ids": ids, "tokens": held_tokens(ids, tokens)}).fetchall())

        start.wait()
        return overlapped(claim, complete)


SQLITE_CLAIM = """
UPDATE dibs_jobs SET status = 'running', lease_owner = ?, lease_expires_at = ?,
    lease_token = lease_token + 1, attempts = attempts + 1, started_at = ?
WHERE id IN (
    SELECT id FROM dibs_jobs WHERE status = 'queued' AND queue = 'default'
    ORDER BY priority DESC, run_at, id LIMIT ?)
RETURNING *
"""


def _sqlite_now(offset: float = 0.0) -> str:
    """UTC as dibs stores it in SQLite."""
    return str(datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=offset))


def _sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(sa.make_url(url).database or "", isolation_level=None, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def raw_sqlite(url: str, batch: int, owner: str, start: Any) -> int:
    claimer, completer = _sqlite_connect(url), _sqlite_connect(url)

    def claim() -> tuple[list[int], list[int]]:
        claimer.execute("BEGIN IMMEDIATE")
        cursor = claimer.execute(SQLITE_CLAIM, (owner, _sqlite_now(30.0), _sqlite_now(), batch))
        rows = cursor.fetchall()
        claimer.execute("COMMIT")
        token = [column[0] for column in cursor.description].index("lease_token")
        return [row[0] for row in rows], [row[token] for row in rows]

    def complete(ids: list[int], tokens: list[int]) -> int:
        completer.execute("BEGIN IMMEDIATE")
        finished = completer.execute(SQLITE_COMPLETE, (_sqlite_now(), held_tokens(ids, tokens))).fetchall()
        completer.execute("COMMIT")
        return len(finished)

    start.wait()
    done = overlapped(claim, complete)
    claimer.close()
    completer.close()
    return done


def _mariadb_connect(url: str) -> Any:
    import pymysql

    address = sa.make_url(url)
    conn = pymysql.connect(
        host=address.host,
        port=address.port or 3306,
        user=address.username,
        password=address.password or "",
        database=address.database,
    )
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def raw_mariadb(url: str, batch: int, owner: str, start: Any) -> int:
    claimer, completer = _mariadb_connect(url), _mariadb_connect(url)

    def claim() -> tuple[list[int], list[int]]:
        cursor = claimer.cursor()
        cursor.execute(
            "SELECT id FROM dibs_jobs WHERE status = 'queued' AND queue = 'default' "
            "ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
            (batch,),
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            claimer.commit()
            return [], []
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            "UPDATE dibs_jobs SET status = 'running', lease_owner = %s, "
            "lease_expires_at = TIMESTAMPADD(MICROSECOND, 30000000, UTC_TIMESTAMP(6)), "
            "lease_token = lease_token + 1, attempts = attempts + 1, started_at = UTC_TIMESTAMP(6) "
            f"WHERE id IN ({marks})",
            (owner, *ids),
        )
        cursor.execute(f"SELECT * FROM dibs_jobs WHERE id IN ({marks})", ids)
        rows = cursor.fetchall()
        claimer.commit()
        token = [column[0] for column in cursor.description].index("lease_token")
        return [row[0] for row in rows], [row[token] for row in rows]

    def complete(ids: list[int], tokens: list[int]) -> int:
        marks = ", ".join(["%s"] * len(ids))
        pairs = ", ".join(["(%s, %s)"] * len(ids))
        finished = completer.cursor().execute(
            "UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL, "
            f"finished_at = UTC_TIMESTAMP(6) WHERE id IN ({marks}) AND (id, lease_token) IN ({pairs}) "
            "AND status = 'running'",
            [*ids, *(value for pair in zip(ids, tokens, strict=True) for value in pair)],
        )
        completer.commit()
        return int(finished)

    start.wait()
    done = overlapped(claim, complete)
    claimer.close()
    completer.close()
    return done


RAW = {"postgresql": raw_postgresql, "sqlite": raw_sqlite, "mariadb": raw_mariadb}


def raw_drain(
    backend: str, url: str, setting: dict[str, Any], owner: str, start: Any
) -> tuple[int, float, dict[str, Any]]:
    done = RAW[backend](url, setting["batch"], owner, start)
    return done, time.monotonic(), {}


# -- the peers ---------------------------------------------------------------------------------------

#: Every peer module in benchmarks/peers, by kind name; each is imported only when its kind is asked for.
PEERS = ("pgqueuer", "procrastinate", "huey", "graphile-worker", "pg-boss")
KINDS = ("raw", "dibs", *PEERS)


def peer(kind: str) -> Any:
    return importlib.import_module(f"benchmarks.peers.{kind.replace('-', '_')}")


def peer_settings(kind: str, text: str | None) -> list[dict[str, Any]]:
    module = peer(kind)
    return module.parse(text) if text else list(module.SETTINGS)


# -- running trials --------------------------------------------------------------------------------


def tuned() -> bool:
    """Whether the run tunes the garbage collector of every worker process (``--gc``), dibs's and the others'."""
    return os.environ.get(GC_VARIABLE) == "1"


class _Started:
    """The start barrier, noting the process's CPU time when it is passed; with ``--gc`` the objects made
    until then are frozen first, as dibs's tuned worker freezes them."""

    def __init__(self, barrier: Any) -> None:
        self.barrier = barrier
        self.cpu = 0.0

    def wait(self) -> None:
        if tuned():
            gc.freeze()
        self.barrier.wait()
        self.cpu = time.process_time()


def _process(
    kind: str, backend: str, url: str, setting: dict[str, Any], owner: str, start: Any
) -> tuple[int, float, dict[str, Any]]:
    """One worker process of a trial; its stats gain ``cpu_seconds``, the CPU time (every thread) it used
    from the start barrier to its return."""
    started = _Started(start)
    if kind == "dibs":
        done, end, stats = dibs_drain(url, setting, owner, started)
        return done, end, {**stats, "cpu_seconds": time.process_time() - started.cpu}
    with tuned_gc() if tuned() else contextlib.nullcontext():
        if kind == "raw":
            done, end, stats = raw_drain(backend, url, setting, owner, started)
        else:
            done, end, stats = peer(kind).drain(url, setting, started)
    # A Node peer's worker is a child process: its CPU time is its own, reported by its driver.
    cpu = time.process_time() - started.cpu + stats.pop("child_cpu_seconds", 0.0)
    return done, end, {**stats, "cpu_seconds": cpu}


@dataclass
class Trial:
    backend: str
    kind: str
    setting: str
    batch: int
    processes: int
    jobs: int
    seconds: float
    #: From the first claim to the last completion, on the database clock: the drain without worker
    #: start-up and shutdown (NaN where a peer keeps no such record).
    db_seconds: float
    #: When each process finished, in seconds after the barrier.
    ends: list[float] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds

    @property
    def cpu_us_per_job(self) -> float:
        """The worker processes' CPU time per job, in microseconds (the database server's is not counted)."""
        return float(sum(stats["cpu_seconds"] for stats in self.stats)) / self.jobs * 1e6


def label(kind: str, setting: dict[str, Any]) -> str:
    if kind == "dibs":
        connections = f"/k{setting['connections']}" if setting.get("connections") else ""
        return f"c{setting['concurrency']}/b{setting['batch']}{connections}"
    if kind == "raw":
        return f"b{setting['batch']}"
    text: str = peer(kind).label(setting)
    return text


def trial(
    manager: Any,
    kind: str,
    backend: str,
    url: str,
    setting: dict[str, Any],
    processes: int,
    jobs: int,
    database: Any,
) -> Trial:
    """One drain: fill, start ``processes`` workers of ``kind`` together, wait for all, check the result.
    ``database`` is the peer's Database for a peer kind, None for dibs and the floor."""
    if database is not None:
        database.refill(jobs)
        address = database.address()
    else:
        refill(backend, url, jobs)
        address = url
    context = multiprocessing.get_context("spawn")
    start = manager.Barrier(processes + 1)
    with context.Pool(processes) as pool:
        pending = pool.starmap_async(
            _process, [(kind, backend, address, setting, f"{kind}-{n}", start) for n in range(processes)]
        )
        start.wait(timeout=120)
        began = time.monotonic()
        results = pending.get(timeout=900)
    seconds = max(end for _, end, _ in results) - began
    done = sum(count for count, _, _ in results)
    if done != jobs:
        raise RuntimeError(f"{kind} {label(kind, setting)} on {backend}: the workers report {done} of {jobs} jobs")
    span = database.verify(jobs) if database is not None else verify(backend, url, jobs, kind)
    return Trial(
        backend,
        kind,
        label(kind, setting),
        setting["batch"],
        processes,
        jobs,
        seconds,
        span,
        [round(end - began, 4) for _, end, _ in results],
        [stats for *_, stats in results],
    )


def urls(tmp: Path, database: str = DATABASE) -> dict[str, str]:
    return {
        "postgresql": sa.make_url(POSTGRES_URL).set(database=database).render_as_string(hide_password=False),
        "sqlite": f"sqlite:///{tmp / 'drain.sqlite'}",
        "mariadb": sa.make_url(MARIADB_URL).set(database=database).render_as_string(hide_password=False),
    }


def own_database(backend: str, create: bool, database: str = DATABASE) -> None:
    """Create (or drop) the run's database on the PostgreSQL or MariaDB server."""
    if backend == "sqlite":
        return
    server = POSTGRES_URL if backend == "postgresql" else MARIADB_URL
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        force = " WITH (FORCE)" if backend == "postgresql" else ""
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database}{force}")
        if create:
            conn.exec_driver_sql(f"CREATE DATABASE {database}")
    admin.dispose()


# -- enqueue-to-start latency ----------------------------------------------------------------------

#: The worker the latency runs use: enough runners and a batch large enough to keep up with the highest
#: offered rate (the defaults, concurrency 10 and batch 20, drain about 5,000 jobs/s here).
LATENCY_WORKER = {"concurrency": 100, "batch": 200, "poll": 2.0}


def latency_worker(url: str, total: int, setting: dict[str, Any], start: Any) -> list[tuple[float, float]]:
    """Run a worker until ``total`` jobs have started; returns (sent, started) wall-clock times."""
    app = dibs.App(url)
    seen: list[tuple[float, float]] = []
    worker: dibs.Worker | None = None

    @app.task(name="stamp")
    async def stamp(sent: float) -> None:
        seen.append((sent, time.time()))
        if len(seen) == total and worker is not None:
            # Stop once the last successes are written, which is not what this measures.
            asyncio.get_running_loop().call_later(0.5, worker.stop)

    worker = app.worker(
        concurrency=setting["concurrency"],
        batch=setting["batch"],
        poll=setting["poll"],
        handle_signals=False,
        tune_gc=True,
    )
    with app.engine.connect():
        pass
    start.wait()
    worker.run()
    app.engine.dispose()
    return seen


#: One producer process offers at most this many jobs a second; more take a share of the schedule each.
PRODUCER_RATE = 1_000
#: A producer that fell behind catches up in transactions of at most this many jobs.
PRODUCER_CHUNK = 100


def latency_producer(url: str, rate: float, total: int, share: int, shares: int, start: Any) -> dict[str, float]:
    """Offer jobs ``share``, ``share + shares``, ... of ``total`` on a fixed schedule of ``rate`` a second
    (job n is due at n / rate seconds), never sending one before its time.

    Each pass enqueues the jobs whose time has come in one transaction: one ``app.enqueue()`` when one
    is due (at low rates, nearly always), ``app.enqueue_many()`` of up to ``PRODUCER_CHUNK`` when the
    producer's own round trip let several fall due. Each job carries ``time.time()`` taken just before
    its enqueue call."""
    app = dibs.App(url)

    @app.task(name="stamp")
    async def stamp(sent: float) -> None:
        return None

    with app.engine.connect():
        pass
    mine = range(share, total, shares)
    sent = transactions = 0
    start.wait()
    time.sleep(1.0)  # the worker is listening before the first job
    began = time.perf_counter()
    while sent < len(mine):
        wait = mine[sent] / rate - (time.perf_counter() - began)
        if wait > 0:
            time.sleep(wait)
            continue
        due = 1
        while (
            sent + due < len(mine) and due < PRODUCER_CHUNK and mine[sent + due] / rate <= time.perf_counter() - began
        ):
            due += 1
        now = time.time()
        if due == 1:
            app.enqueue("stamp", {"sent": now})
        else:
            app.enqueue_many("stamp", [{"sent": now}] * due)
        sent += due
        transactions += 1
    elapsed = time.perf_counter() - began
    app.engine.dispose()
    return {"jobs": sent, "seconds": elapsed, "transactions": transactions}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency(manager: Any, url: str, rate: float, seconds: float, setting: dict[str, Any]) -> dict[str, Any]:
    """Enqueue-to-start latency of one worker (not burst) fed at ``rate`` jobs a second."""
    app = drain_app(url)
    dibs.schema.metadata.drop_all(app.engine)
    app.init()
    app.engine.dispose()
    total = round(rate * seconds)
    shares = math.ceil(rate / PRODUCER_RATE)
    context = multiprocessing.get_context("spawn")
    start = manager.Barrier(shares + 2)
    with context.Pool(shares + 1) as pool:
        worker = pool.apply_async(latency_worker, (url, total, setting, start))
        senders = [
            pool.apply_async(latency_producer, (url, rate, total, share, shares, start)) for share in range(shares)
        ]
        start.wait(timeout=120)
        sent = [sender.get(timeout=seconds * 5 + 120) for sender in senders]
        seen = worker.get(timeout=120)
    if len(seen) != total:
        raise RuntimeError(f"latency: the worker started {len(seen)} of {total} jobs")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT status, count(*), extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - "
            "enqueued_at)), extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - enqueued_at)) "
            "FROM dibs_jobs GROUP BY status"
        ).all()
    engine.dispose()
    unfinished = {row[0]: row[1] for row in rows if row[0] != "succeeded"}
    if unfinished or sum(row[1] for row in rows) != total:
        raise RuntimeError(f"latency: expected {total} jobs succeeded, found {[(r[0], r[1]) for r in rows]}")
    waits = [started - sent_at for sent_at, started in seen]
    return {
        "offered_rate": rate,
        "jobs": total,
        "producers": shares,
        "achieved_rate": total / max(part["seconds"] for part in sent),
        "jobs_per_transaction": total / sum(part["transactions"] for part in sent),
        "worker": setting,
        "p50_ms": percentile(waits, 0.50) * 1000,
        "p95_ms": percentile(waits, 0.95) * 1000,
        "p99_ms": percentile(waits, 0.99) * 1000,
        "max_ms": max(waits) * 1000,
        # started_at - enqueued_at, both statement times on the database clock.
        "db_p50_ms": float(rows[0][2]) * 1000,
        "db_p99_ms": float(rows[0][3]) * 1000,
    }


# -- the run ---------------------------------------------------------------------------------------


def parse_configs(text: str, poll: float) -> list[dict[str, Any]]:
    """``concurrency x batch`` or ``concurrency x batch x connections``, comma-separated."""
    configs = []
    for item in text.split(","):
        numbers = [int(part) for part in item.lower().split("x")]
        if len(numbers) not in (2, 3):
            raise SystemExit(f"--configs: {item!r} is not concurrency x batch [x connections], as in 2000x1000x1")
        config = {"concurrency": numbers[0], "batch": numbers[1], "poll": poll}
        if len(numbers) == 3:
            config["connections"] = numbers[2]
        configs.append(config)
    return configs


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="jobs per trial (default: 50,000; 25,000 on MariaDB); small batch sizes drain fewer",
    )
    parser.add_argument("--processes", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument(
        "--configs",
        default="2000x1000,2000x1000x1",
        help="dibs worker settings, concurrency x batch [x connections] (default: the worker's)",
    )
    parser.add_argument("--gc", action="store_true", help="tune the GC of every worker process alike (freeze)")
    parser.add_argument("--poll", type=float, default=2.0, help="dibs worker poll seconds (its default: 2)")
    for name in PEERS:
        parser.add_argument(f"--{name}", default=None, help=f"{name} settings (default: its module's SETTINGS)")
    parser.add_argument("--latency-rates", default="1000,5000", help="offered jobs/s; empty skips latency")
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    return parser


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the trials ``argv`` asks for; returns the results (also written to benchmarks/results)."""
    options = arguments().parse_args(argv)
    backends = options.backends.split(",")
    kinds = options.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(KINDS)}")
    process_counts = [int(p) for p in options.processes.split(",")]
    configs = parse_configs(options.configs, options.poll)
    absent = node.missing()
    if absent and set(kinds) & set(node.DRIVERS):
        print(f"  note: {absent}", flush=True)
        kinds = [kind for kind in kinds if kind not in node.DRIVERS]
    os.environ[GC_VARIABLE] = "1" if options.gc else "0"  # the spawned workers inherit it
    peers = {kind: peer_settings(kind, getattr(options, kind.replace("-", "_"))) for kind in PEERS if kind in kinds}
    rates = [float(rate) for rate in options.latency_rates.split(",") if rate]
    began = time.time()
    load_before = os.getloadavg()

    trials: list[Trial] = []
    enqueue_rates: dict[str, float] = {}
    latencies: list[dict[str, Any]] = []
    manager = multiprocessing.get_context("spawn").Manager()
    with tempfile.TemporaryDirectory() as tmp, manager:
        where = urls(Path(tmp))
        try:
            for backend in backends:
                url = where[backend]
                own_database(backend, create=True)
                total = options.jobs or DEFAULT_JOBS[backend]
                enqueue_rates[backend] = prepare(backend, url, total)
                here = {kind: settings for kind, settings in peers.items() if backend in peer(kind).BACKENDS}
                databases = {kind: peer(kind).Database(backend, url) for kind in here}
                try:
                    for processes in process_counts:
                        for _ in range(options.repeats):
                            for kind, setting in round_plan(kinds, configs, here):
                                jobs = total if kind in PEERS else trial_jobs(setting["batch"], total)
                                result = trial(
                                    manager, kind, backend, url, setting, processes, jobs, databases.get(kind)
                                )
                                trials.append(result)
                                print(f"  {describe(result)}", flush=True)
                finally:
                    for database in databases.values():
                        database.close()
            if "postgresql" in backends:
                for rate in rates:
                    measured = latency(manager, where["postgresql"], rate, options.latency_seconds, LATENCY_WORKER)
                    latencies.append({"kind": "dibs", **measured})
                    print(f"  latency, {describe_latency(latencies[-1])}", flush=True)
                    # graphile-worker side by side where one producer process offers the rate, as dibs's does.
                    if "graphile-worker" in kinds and rate <= PRODUCER_RATE:
                        measured = node.latency("graphile-worker", POSTGRES_URL, rate, options.latency_seconds)
                        latencies.append(measured)
                        print(f"  latency, {describe_latency(measured)}", flush=True)
        finally:
            for backend in backends:
                own_database(backend, create=False)
    load = {"start": load_before, "end": os.getloadavg()}  # other work on the machine shows here
    return report(trials, enqueue_rates, latencies, vars(options), time.time() - began, load)


def describe(result: Trial) -> str:
    span = result.jobs / result.db_seconds if result.db_seconds == result.db_seconds else float("nan")
    return (
        f"{result.backend:<10} x{result.processes}  {result.kind:<16} {result.setting:<12} {result.jobs:>7,} jobs "
        f"{result.jobs_per_second:>10,.0f} jobs/s, {result.cpu_us_per_job:.0f} us CPU/job  (first claim to last "
        f"completion: {span:,.0f} jobs/s; "
        f"processes done at {', '.join(f'{end:.2f}' for end in result.ends)} s)"
    )


def round_plan(
    kinds: list[str], configs: list[dict[str, Any]], peers: dict[str, list[dict[str, Any]]]
) -> list[tuple[str, dict[str, Any]]]:
    """One round of trials: each dibs setting after the raw floor at its batch size, then the peers."""
    plan: list[tuple[str, dict[str, Any]]] = []
    for config in configs:
        if "raw" in kinds and all(setting["batch"] != config["batch"] for kind, setting in plan if kind == "raw"):
            plan.append(("raw", {"batch": config["batch"]}))
        if "dibs" in kinds:
            plan.append(("dibs", config))
    return plan + [(kind, setting) for kind, settings in peers.items() for setting in settings]


# -- the report ------------------------------------------------------------------------------------

#: The goals, as ratios from the same run: dibs's best over each peer's best at the same number of
#: processes, and over the raw floor at the same batch size.
PEER_GOALS = {"pgqueuer": 2.5, "procrastinate": 50.0, "huey": 10.0}
FLOOR_GOAL = 0.7


def median_of(trials: list[Trial], **match: Any) -> float | None:
    values = [t.jobs_per_second for t in trials if all(getattr(t, k) == v for k, v in match.items())]
    return statistics.median(values) if values else None


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    """Per backend and process count: the best median of each kind, and dibs's ratios to the others."""
    summary = []
    for backend in dict.fromkeys(t.backend for t in trials):
        for processes in sorted({t.processes for t in trials if t.backend == backend}):
            row: dict[str, Any] = {"backend": backend, "processes": processes}
            for kind in KINDS:
                medians = {
                    t.setting: median_of(trials, backend=backend, processes=processes, kind=kind, setting=t.setting)
                    for t in trials
                    if (t.backend, t.processes, t.kind) == (backend, processes, kind)
                }
                if medians:
                    best = max(medians, key=lambda s: medians[s] or 0.0)
                    row[kind] = {"best": best, "jobs_per_second": medians[best], "all": medians}
            if "dibs" in row and "raw" in row:
                batch = next(t.batch for t in trials if t.kind == "dibs" and t.setting == row["dibs"]["best"])
                floor = median_of(trials, backend=backend, processes=processes, kind="raw", batch=batch)
                if floor:
                    row["raw_at_dibs_batch"] = {"setting": f"b{batch}", "jobs_per_second": floor}
                    row["dibs_over_raw"] = row["dibs"]["jobs_per_second"] / floor
            for kind in PEERS:
                if "dibs" in row and kind in row:
                    row[f"dibs_over_{kind}"] = row["dibs"]["jobs_per_second"] / row[kind]["jobs_per_second"]
            summary.append(row)
    return summary


def goals(summary: list[dict[str, Any]]) -> list[str]:
    """One line per goal and process count: the ratio, and met or MISSED."""
    lines = []
    for row in summary:
        where = f"{row['backend']} x{row['processes']}"
        if "dibs_over_raw" in row:
            ratio = row["dibs_over_raw"]
            lines.append(
                f"{where}: dibs {row['dibs']['jobs_per_second']:,.0f} ({row['dibs']['best']}) / raw floor at the same "
                f"batch {row['raw_at_dibs_batch']['jobs_per_second']:,.0f} = {ratio:.2f}; goal >= {FLOOR_GOAL}: "
                + ("met" if ratio >= FLOOR_GOAL else "MISSED")
            )
        for kind, goal in PEER_GOALS.items():
            if f"dibs_over_{kind}" in row:
                ratio = row[f"dibs_over_{kind}"]
                lines.append(
                    f"{where}: dibs / {kind} ({row[kind]['jobs_per_second']:,.0f}, {row[kind]['best']}) = "
                    f"{ratio:.2f}; goal >= {goal}: " + ("met" if ratio >= goal else "MISSED")
                )
    return lines


def describe_latency(result: dict[str, Any]) -> str:
    per = f", {result['jobs_per_transaction']:.1f} per transaction" if "jobs_per_transaction" in result else ""
    return (
        f"{result.get('kind', 'dibs')}: {result['offered_rate']:,.0f} jobs/s offered, "
        f"{result['achieved_rate']:,.0f} achieved ({result['jobs']:,} jobs{per}): p50 {result['p50_ms']:.1f} ms, "
        f"p95 {result['p95_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms"
    )


def versions(kinds: list[str]) -> dict[str, str]:
    packages = ["dibs", "sqlalchemy", "psycopg", "pymysql"]
    for kind in kinds:
        if kind in PEERS:
            packages.extend(peer(kind).PACKAGES)
    return record.versions(packages)


def report(
    trials: list[Trial],
    enqueue_rates: dict[str, float],
    latencies: list[dict[str, Any]],
    options: dict[str, Any],
    elapsed: float,
    load: dict[str, Any],
) -> dict[str, Any]:
    print("\nmedian jobs/s of each setting")
    print(
        f"{'backend':<11}{'procs':>6}  {'kind':<17}{'setting':<13}{'jobs':>8}{'median':>11}{'trials':>8}"
        f"{'CPU us/job':>12}"
    )
    seen = sorted(
        {(t.backend, t.processes, t.kind, t.batch, t.setting, t.jobs) for t in trials},
        key=lambda k: (BACKENDS.index(k[0]), k[1], KINDS.index(k[2]), k[3], k[4]),
    )
    for backend, processes, kind, _, setting, jobs in seen:
        match = {"backend": backend, "processes": processes, "kind": kind, "setting": setting}
        count = sum(1 for t in trials if all(getattr(t, k) == v for k, v in match.items()))
        middle = median_of(trials, **match) or 0.0
        cpu = statistics.median(t.cpu_us_per_job for t in trials if all(getattr(t, k) == v for k, v in match.items()))
        print(f"{backend:<11}{processes:>6}  {kind:<17}{setting:<13}{jobs:>8,}{middle:>11,.0f}{count:>8}{cpu:>12.0f}")

    summary = summarize(trials)
    print("\nbest median per kind; dibs/raw at dibs's best batch size, dibs/peer best against best")
    print(f"{'backend':<11}{'procs':>6}  " + "".join(f"{kind:>16}" for kind in KINDS) + "   ratios")
    for row in summary:
        cells = "".join(f"{row[kind]['jobs_per_second']:>16,.0f}" if kind in row else f"{'-':>16}" for kind in KINDS)
        ratios = ", ".join(
            f"/{kind} {row[f'dibs_over_{kind}']:.2f}" for kind in ("raw", *PEERS) if f"dibs_over_{kind}" in row
        )
        print(f"{row['backend']:<11}{row['processes']:>6}  {cells}   {ratios}")
    verdicts = goals(summary)
    print("\ngoals")
    for line in verdicts:
        print(f"  {line}")
    if latencies:
        print("\nenqueue-to-start latency on PostgreSQL")
        for result in latencies:
            print(f"  {describe_latency(result)}")
    print(f"\ndibs enqueue_many while filling: {', '.join(f'{b} {r:,.0f} jobs/s' for b, r in enqueue_rates.items())}")
    results = {
        "benchmark": "drain",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": load},
        "versions": versions(options["kinds"].split(",")),
        "options": options,
        "seconds": elapsed,
        "summary": summary,
        "goals": verdicts,
        "latency": latencies,
        "enqueue_many_jobs_per_second": enqueue_rates,
        "trials": [
            asdict(t) | {"jobs_per_second": t.jobs_per_second, "cpu_us_per_job": t.cpu_us_per_job} for t in trials
        ],
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"drain-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {out} after {elapsed / 60:.1f} minutes")
    return results


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
