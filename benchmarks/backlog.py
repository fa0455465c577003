"""Claim cost of the job queue as the backlog grows and as finished rows accumulate.

Each scenario is a database of its own holding one ``dibs_jobs`` table:

* ``backlog N``: N queued jobs (default 10,000, 100,000 and 1,000,000);
* ``finished``: as many queued jobs as the smallest backlog, behind 1,000,000 finished ones (every
  hundredth dead, the rest succeeded), which hold the lower ids and the earlier run times, as in a
  queue that has run for a while.

Filling: 10,000 no-op jobs are enqueued once through dibs (``app.enqueue_many``) and kept as a template;
the table is then filled by copying the template with ``INSERT ... SELECT`` (generate_series on
PostgreSQL, a recursive CTE on SQLite, the SEQUENCE engine on MariaDB), 100,000 rows per statement, each
row with its own id and run time; statistics are refreshed afterwards (VACUUM ANALYZE, ANALYZE, ANALYZE
TABLE). A fill that takes longer than ``--fill-budget`` seconds stops and its scenario is reported as
skipped.

Measuring: one cycle is a claim of ``batch`` jobs and the completion of the jobs it got, each timed on
its own. ``dibs``: the calls the worker makes, ``JobStore.claim`` with the worker's queues, tasks, tags
and lease, then ``JobStore.succeed`` (the batched, token-fenced completion). ``raw``: the floor, the same
claim and completion shapes as ``benchmarks.drain`` written by hand on the bare driver (psycopg, sqlite3,
PyMySQL). After each pair of cycles (one dibs, one raw), untimed, the finished jobs are deleted and as
many new queued jobs are inserted at the back of the queue, so the queued and finished counts stay what
the scenario says for the whole run. The scenarios of a backend take turns in rounds, and dibs and raw
take turns going first, so that drift on a noisy machine reaches all of them; a few warm-up cycles per
scenario are not counted. Each kind gets ``--repeats`` timed cycles per scenario at batch sizes up to
100; larger batches get proportionally fewer (about as many jobs claimed), but at least 50.

Reported: median and p95 milliseconds per claim and per completion, and the ratio of the median claim at
the largest backlog (and with the finished rows) to the median claim at the smallest backlog. Goal: at
most 1.5.

Plans: after the cycles of each batch size, the statement of a dibs claim that picks the jobs (captured
as dibs sends it) is explained: EXPLAIN (ANALYZE, BUFFERS) on PostgreSQL, run in a transaction that is
rolled back, beside the raw claim; EXPLAIN QUERY PLAN on SQLite; ANALYZE (run, then rolled back) on
MariaDB. On PostgreSQL the run also records the table's live and dead rows and index size at the end.

    python -m benchmarks.backlog                                   # everything, about ten minutes
    python -m benchmarks.backlog --backends postgresql --batches 100 --repeats 100
    python -m benchmarks.backlog --backlogs 10000,100000 --finished 0 --backends sqlite

From Python, ``run(["--backends", "sqlite"])`` takes the same arguments and ``benchmark(backends=...)``
the same options as keywords; both return the results as a JSON-able dict.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import event

import dibs
from benchmarks import record
from benchmarks.drain import MARIADB_URL, POSTGRES_URL
from benchmarks.drain_kinds import drain_app
from benchmarks.floor import PG_CLAIM, PG_COMPLETE, SQLITE_CLAIM, SQLITE_COMPLETE, held_tokens
from dibs.queue.store import JobStore
from dibs.schema import jobs

# The servers (the same variables as the other benchmarks); every scenario is a database of its own on
# them, created at the start and dropped at the end.
DATABASE_PREFIX = "dibs_bench_backlog"
TEMPLATE = "dibs_bench_backlog_template"
TEMPLATE_JOBS = 10_000
ENQUEUE_CHUNK = 5_000
#: Rows per INSERT ... SELECT while filling (each in its own transaction).
FILL_CHUNK = 100_000
#: Every this-many-th finished row is dead, the others succeeded.
DEAD_EVERY = 100
BACKENDS = ("postgresql", "sqlite", "mariadb")
DEFAULT_BACKLOGS = (10_000, 100_000, 1_000_000)
DEFAULT_FINISHED = 1_000_000
DEFAULT_BATCHES = (100, 1000)
#: Timed cycles per kind and scenario at batch sizes up to REPEATS_BATCH; larger batches get fewer, in
#: proportion (about as many jobs claimed), but at least MIN_CYCLES.
DEFAULT_REPEATS = 200
REPEATS_BATCH = 100
MIN_CYCLES = 50
DEFAULT_ROUNDS = 10
DEFAULT_WARMUP = 5
#: Seconds one scenario's fill may take; 1,000,000 rows took about 40 s on MariaDB here, 12 s on PostgreSQL
#: and 15 s on SQLite, so every backend gets the 1,000,000-job backlog by default.
DEFAULT_FILL_BUDGET = 180.0
LEASE_SECONDS = 30.0
GOAL = 1.5
RESULTS = Path(__file__).parent / "results"

#: dibs_jobs's columns, in table order.
COLUMNS = [column.name for column in jobs.columns]
COPIED = [name for name in COLUMNS if name != "id"]


# -- scenarios and their databases -----------------------------------------------------------------


@dataclass
class Scenario:
    """One dibs_jobs table: ``queued`` jobs waiting, ``finished`` jobs done."""

    backend: str
    name: str
    queued: int
    finished: int
    url: str = ""
    database: str = ""
    fill_seconds: float = 0.0
    enqueue_jobs_per_second: float = 0.0
    skipped: str | None = None
    table: dict[str, Any] = field(default_factory=dict)


def scenarios_for(backend: str, backlogs: Sequence[int], finished: int, tmp: Path) -> list[Scenario]:
    made = [Scenario(backend, f"backlog {backlog:,}", backlog, 0) for backlog in backlogs]
    if finished:
        made.append(Scenario(backend, f"{min(backlogs):,} + {finished:,} finished", min(backlogs), finished))
    for scenario in made:
        suffix = f"q{scenario.queued}" + (f"_f{scenario.finished}" if scenario.finished else "")
        scenario.database = f"{DATABASE_PREFIX}_{suffix}"
        if backend == "sqlite":
            scenario.url = f"sqlite:///{tmp / (scenario.database + '.sqlite')}"
        else:
            server = POSTGRES_URL if backend == "postgresql" else MARIADB_URL
            scenario.url = sa.make_url(server).set(database=scenario.database).render_as_string(hide_password=False)
    return made


def own_database(scenario: Scenario, create: bool) -> None:
    """Create (or drop) the scenario's database on the PostgreSQL or MariaDB server."""
    if scenario.backend == "sqlite":
        path = Path(sa.make_url(scenario.url).database or "")
        for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            leftover.unlink(missing_ok=True)
        return
    server = POSTGRES_URL if scenario.backend == "postgresql" else MARIADB_URL
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        force = " WITH (FORCE)" if scenario.backend == "postgresql" else ""
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {scenario.database}{force}")
        if create:
            conn.exec_driver_sql(f"CREATE DATABASE {scenario.database}")
    admin.dispose()


# -- filling ---------------------------------------------------------------------------------------


def moment(backend: str, base: datetime, microseconds: str) -> str:
    """SQL for ``base`` plus the integer expression ``microseconds`` µs, stored as dibs stores times."""
    if backend == "postgresql":
        return f"(timestamptz '{base:%Y-%m-%d %H:%M:%S}+00' + ({microseconds}) * interval '1 microsecond')"
    if backend == "mariadb":
        return f"TIMESTAMPADD(MICROSECOND, {microseconds}, '{base:%Y-%m-%d %H:%M:%S}')"
    # SQLite: ISO text with six fractional digits, as SQLAlchemy writes it.
    total = f"({int(base.timestamp()) * 1_000_000} + {microseconds})"
    seconds = f"strftime('%Y-%m-%d %H:%M:%S', {total} / 1000000, 'unixepoch')"
    return f"({seconds} || '.' || printf('%06d', {total} % 1000000))"


def copies_source(backend: str, first: int, last: int) -> tuple[str, str]:
    """(a WITH prefix, a FROM item) yielding one row per copy number k in first..last."""
    if backend == "postgresql":
        return "", f"generate_series({first}, {last}) AS copies(k)"
    if backend == "mariadb":
        return "", f"(SELECT seq AS k FROM seq_{first}_to_{last}) AS copies"
    prefix = f"WITH RECURSIVE copies(k) AS (SELECT {first} UNION ALL SELECT k + 1 FROM copies WHERE k < {last}) "
    return prefix, "copies"


def copy_values(backend: str, base: datetime, row_id: str, finished: bool) -> dict[str, str]:
    """SQL for each column of a copied template row ``t`` whose id is ``row_id``: queued as enqueued, or
    finished (succeeded, or dead for every hundredth id) at its run time."""
    at = moment(backend, base, row_id)
    values = {name: f"t.{name}" for name in COPIED}
    values.update({"id": row_id, "run_at": at, "enqueued_at": at})
    if not finished:
        return values
    # psycopg and PyMySQL read % as a placeholder.
    dead = f"{row_id} % {DEAD_EVERY} = 0" if backend == "sqlite" else f"mod({row_id}, {DEAD_EVERY}) = 0"
    return {
        **values,
        "status": f"CASE WHEN {dead} THEN 'dead' ELSE 'succeeded' END",
        "attempts": "1",
        "lease_token": "1",
        "lease_owner": "'filled'",
        "started_at": at,
        "finished_at": at,
        "last_error": f"CASE WHEN {dead} THEN 'RuntimeError: filled' ELSE NULL END",
    }


def values_statement(backend: str, values: dict[str, str], first_copy: int, last_copy: int, where: str) -> str:
    prefix, source = copies_source(backend, first_copy, last_copy)
    return (
        f"{prefix}INSERT INTO dibs_jobs ({', '.join(COLUMNS)}) "
        f"SELECT {', '.join(values[name] for name in COLUMNS)} FROM {source} CROSS JOIN {TEMPLATE} AS t "
        f"WHERE {where}"
    )


def fill(scenario: Scenario, budget: float) -> None:
    """The scenario's database: the dibs schema, the template (enqueued through dibs), then the finished
    rows (ids 1..F) and the queued ones (ids F+1..F+Q), copied from the template; fresh statistics."""
    backend = scenario.backend
    own_database(scenario, create=True)
    app = drain_app(scenario.url)
    engine = app.engine
    app.init()
    began = time.perf_counter()
    for first in range(0, TEMPLATE_JOBS, ENQUEUE_CHUNK):
        app.enqueue_many("noop", [{}] * min(ENQUEUE_CHUNK, TEMPLATE_JOBS - first))
    scenario.enqueue_jobs_per_second = TEMPLATE_JOBS / (time.perf_counter() - began)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {TEMPLATE} AS SELECT row_number() OVER (ORDER BY id) AS n, {', '.join(COPIED)} "
            "FROM dibs_jobs"
        )
        conn.exec_driver_sql("DELETE FROM dibs_jobs")
    # Filled jobs ran (or run) a day ago, one microsecond apart; the jobs inserted while measuring run now.
    base = datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None) - timedelta(days=1)
    began = time.perf_counter()
    done = 0
    for finished, count, first_id in ((True, scenario.finished, 1), (False, scenario.queued, scenario.finished + 1)):
        copies = -(-count // TEMPLATE_JOBS)
        step = FILL_CHUNK // TEMPLATE_JOBS
        for first_copy in range(0, copies, step):
            if time.perf_counter() - began > budget:
                scenario.skipped = (
                    f"the fill passed its budget of {budget:.0f} s after {done:,} of "
                    f"{scenario.queued + scenario.finished:,} rows"
                )
                engine.dispose()
                return
            last_copy = min(copies, first_copy + step) - 1
            offset = f"(k * {TEMPLATE_JOBS} + t.n - 1)"
            values = copy_values(backend, base, f"({first_id} + {offset})", finished)
            with engine.begin() as conn:
                conn.exec_driver_sql(values_statement(backend, values, first_copy, last_copy, f"{offset} < {count}"))
            done += min(count, (last_copy + 1) * TEMPLATE_JOBS) - first_copy * TEMPLATE_JOBS
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if backend == "postgresql":
            conn.exec_driver_sql("SELECT setval(pg_get_serial_sequence('dibs_jobs', 'id'), max(id)) FROM dibs_jobs")
            conn.exec_driver_sql("VACUUM ANALYZE dibs_jobs")
        elif backend == "sqlite":
            conn.exec_driver_sql("ANALYZE")
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            conn.exec_driver_sql("ANALYZE TABLE dibs_jobs").all()
    scenario.fill_seconds = time.perf_counter() - began
    engine.dispose()
    counts = status_counts(scenario)
    expected = {"queued": scenario.queued}
    if scenario.finished:
        dead = scenario.finished // DEAD_EVERY
        expected |= {"succeeded": scenario.finished - dead, "dead": dead}
    if counts != expected:
        raise RuntimeError(f"{backend} {scenario.name}: filled {counts}, expected {expected}")


def status_counts(scenario: Scenario) -> dict[str, int]:
    engine = sa.create_engine(scenario.url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status, count(*) FROM dibs_jobs GROUP BY status").all()
    engine.dispose()
    return {status: int(count) for status, count in rows}


# -- the raw floor: the claim and completion shapes of benchmarks.drain, on the bare driver ---------

MARIADB_PICK = (
    "SELECT id FROM dibs_jobs WHERE status = 'queued' AND queue = 'default' "
    "ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
)


def sqlite_now(offset: float = 0.0) -> str:
    """UTC as dibs stores it in SQLite."""
    moment = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=offset)
    return moment.isoformat(sep=" ", timespec="microseconds")


class RawQueue:
    """One bare-driver connection to a scenario's database: the raw claim and completion, and the
    untimed replacement of finished jobs by new queued ones."""

    def __init__(self, scenario: Scenario) -> None:
        self.backend = scenario.backend
        self.owner = f"raw-{os.getpid()}"
        address = sa.make_url(scenario.url)
        self.conn: Any
        if self.backend == "postgresql":
            import psycopg

            # Autocommit: each statement is atomic on its own, no BEGIN/COMMIT round trips.
            self.conn = psycopg.connect(
                host=address.host,
                port=address.port,
                user=address.username,
                password=address.password,
                dbname=address.database,
                autocommit=True,
            )
        elif self.backend == "sqlite":
            self.conn = sqlite3.connect(address.database or "", isolation_level=None, timeout=10)
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
        else:
            import pymysql

            self.conn = pymysql.connect(
                host=address.host,
                port=address.port or 3306,
                user=address.username,
                password=address.password or "",
                database=address.database,
            )
            with self.conn.cursor() as cursor:
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def claim(self, batch: int) -> list[tuple[int, int]]:
        """Claim ``batch`` jobs; returns their (id, lease token)."""
        if self.backend == "postgresql":
            cursor = self.conn.execute(PG_CLAIM, {"batch": batch, "owner": self.owner})
            rows = cursor.fetchall()
            token = [column.name for column in cursor.description or ()].index("lease_token")
            return [(row[0], row[token]) for row in rows]
        if self.backend == "sqlite":
            now = sqlite_now()
            self.conn.execute("BEGIN IMMEDIATE")
            cursor = self.conn.execute(SQLITE_CLAIM, (self.owner, sqlite_now(LEASE_SECONDS), now, batch))
            rows = cursor.fetchall()
            self.conn.execute("COMMIT")
            token = [column[0] for column in cursor.description].index("lease_token")
            return [(row[0], row[token]) for row in rows]
        with self.conn.cursor() as cursor:
            cursor.execute(MARIADB_PICK, (batch,))
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                self.conn.commit()
                return []
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(
                "UPDATE dibs_jobs SET status = 'running', lease_owner = %s, "
                "lease_expires_at = TIMESTAMPADD(MICROSECOND, 30000000, UTC_TIMESTAMP(6)), "
                "lease_token = lease_token + 1, attempts = attempts + 1, started_at = UTC_TIMESTAMP(6) "
                f"WHERE id IN ({marks})",
                (self.owner, *ids),
            )
            cursor.execute(f"SELECT * FROM dibs_jobs WHERE id IN ({marks})", ids)
            rows = cursor.fetchall()
            self.conn.commit()
            token = [column[0] for column in cursor.description].index("lease_token")
            return [(row[0], row[token]) for row in rows]

    def complete(self, held: list[tuple[int, int]]) -> int:
        """The batched, token-fenced completion; returns how many jobs it finished."""
        ids = [job_id for job_id, _ in held]
        tokens = held_tokens(ids, [token for _, token in held])
        if self.backend == "postgresql":
            return len(self.conn.execute(PG_COMPLETE, {"ids": ids, "tokens": tokens}).fetchall())
        if self.backend == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
            finished = self.conn.execute(SQLITE_COMPLETE, (sqlite_now(), tokens)).fetchall()
            self.conn.execute("COMMIT")
            return len(finished)
        marks = ", ".join(["%s"] * len(held))
        pairs = ", ".join(["(%s, %s)"] * len(held))
        with self.conn.cursor() as cursor:
            count = int(
                cursor.execute(
                    "UPDATE dibs_jobs SET status = 'succeeded', lease_expires_at = NULL, dedupe_key = NULL, "
                    f"finished_at = UTC_TIMESTAMP(6) WHERE id IN ({marks}) AND (id, lease_token) IN ({pairs}) "
                    "AND status = 'running'",
                    [*ids, *(value for pair in held for value in pair)],
                )
            )
        self.conn.commit()
        return count

    def ids(self, held: list[tuple[int, int]]) -> list[int]:
        return [job_id for job_id, _ in held]

    def replace(self, finished: list[int]) -> None:
        """Delete these finished jobs and insert as many new queued jobs, running now, at the back."""
        count = len(finished)
        values = [name for name in COPIED if name not in ("run_at", "enqueued_at")]
        listed = ", ".join(values)
        if self.backend == "postgresql":
            with self.conn.transaction():
                self.conn.execute("DELETE FROM dibs_jobs WHERE id = ANY(%s)", (finished,))
                self.conn.execute(
                    f"INSERT INTO dibs_jobs ({listed}, run_at, enqueued_at) SELECT {listed}, "
                    f"statement_timestamp(), statement_timestamp() FROM {TEMPLATE} WHERE n <= %s",
                    (count,),
                )
            return
        marks = ", ".join(["?" if self.backend == "sqlite" else "%s"] * count)
        if self.backend == "sqlite":
            now = sqlite_now()
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(f"DELETE FROM dibs_jobs WHERE id IN ({marks})", finished)
            self.conn.execute(
                f"INSERT INTO dibs_jobs ({listed}, run_at, enqueued_at) SELECT {listed}, ?, ? FROM {TEMPLATE} "
                "WHERE n <= ?",
                (now, now, count),
            )
            self.conn.execute("COMMIT")
            return
        with self.conn.cursor() as cursor:
            cursor.execute(f"DELETE FROM dibs_jobs WHERE id IN ({marks})", finished)
            cursor.execute(
                f"INSERT INTO dibs_jobs ({listed}, run_at, enqueued_at) SELECT {listed}, UTC_TIMESTAMP(6), "
                f"UTC_TIMESTAMP(6) FROM {TEMPLATE} WHERE n <= %s",
                (count,),
            )
        self.conn.commit()


# -- dibs: the worker's own calls ------------------------------------------------------------------


class DibsQueue:
    """A scenario's app and the claim and completion exactly as a worker of it calls them."""

    def __init__(self, scenario: Scenario) -> None:
        self.app = drain_app(scenario.url)
        self.store: JobStore = self.app.store
        # The worker is only asked for its claim parameters (queues, tasks, tags, lease, name); not run.
        self.worker = self.app.worker(handle_signals=False, name=f"dibs-{os.getpid()}", lease=LEASE_SECONDS)

    def claim(self, batch: int) -> list[dibs.Lease]:
        worker = self.worker
        return self.store.claim(
            self.app.engine,
            owner=worker.name,
            lease_seconds=worker.lease_seconds,
            limit=batch,
            queues=worker.queues,
            tasks=worker.task_names,
            tags=worker.tags,
        )

    def complete(self, held: list[dibs.Lease]) -> int:
        """What the worker's flush of successes calls; returns how many jobs it finished."""
        return len(held) - len(self.store.succeed(self.app.engine, held))

    def ids(self, held: list[dibs.Lease]) -> list[int]:
        return [lease.key[0] for lease in held]

    def close(self) -> None:
        self.app.engine.dispose()


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Samples:
    backend: str
    scenario: str
    queued: int
    finished: int
    batch: int
    kind: str
    claim_ms: list[float] = field(default_factory=list)
    complete_ms: list[float] = field(default_factory=list)


class JobQueue(Protocol):
    def claim(self, batch: int) -> list[Any]: ...

    def complete(self, held: list[Any]) -> int: ...

    def ids(self, held: list[Any]) -> list[int]: ...


def cycle(kind: str, queue: JobQueue, batch: int, samples: Samples | None) -> list[int]:
    """Claim ``batch`` jobs and complete them, each timed; returns the ids of the finished jobs."""
    began = time.perf_counter()
    held = queue.claim(batch)
    claimed = time.perf_counter()
    done = queue.complete(held)
    completed = time.perf_counter()
    if len(held) != batch or done != batch:
        raise RuntimeError(f"{kind}: claimed {len(held)} and completed {done} of a batch of {batch}")
    if samples is not None:
        samples.claim_ms.append((claimed - began) * 1000)
        samples.complete_ms.append((completed - claimed) * 1000)
    return queue.ids(held)


@dataclass
class Bench:
    """One scenario's two queues while it is measured."""

    scenario: Scenario
    dibs: DibsQueue
    raw: RawQueue

    def queue(self, kind: str) -> JobQueue:
        return self.dibs if kind == "dibs" else self.raw


KINDS = ("dibs", "raw")


def measure(benches: list[Bench], batch: int, repeats: int, rounds: int, warmup: int, log: Any) -> list[Samples]:
    """``repeats`` timed cycles of each kind on each scenario, in ``rounds`` rounds that take turns."""
    found = {
        (bench.scenario.name, kind): Samples(
            bench.scenario.backend,
            bench.scenario.name,
            bench.scenario.queued,
            bench.scenario.finished,
            batch,
            kind,
        )
        for bench in benches
        for kind in KINDS
    }
    for bench in benches:
        for _ in range(warmup):
            bench.raw.replace([job_id for kind in KINDS for job_id in cycle(kind, bench.queue(kind), batch, None)])
    per_round = -(-repeats // rounds)
    began = time.perf_counter()
    for round_number in range(rounds):
        # The scenarios take turns, each round starting with another one; dibs and raw take turns going first.
        order = benches[round_number % len(benches) :] + benches[: round_number % len(benches)]
        for bench in order:
            for _ in range(per_round):
                finished: list[int] = []
                for kind in KINDS if round_number % 2 == 0 else KINDS[::-1]:
                    samples = found[(bench.scenario.name, kind)]
                    if len(samples.claim_ms) < repeats:
                        finished += cycle(kind, bench.queue(kind), batch, samples)
                if finished:
                    bench.raw.replace(finished)
    log(f"    {rounds} rounds in {time.perf_counter() - began:.0f} s")
    return list(found.values())


def cycles_for(batch: int, repeats: int) -> int:
    """Timed cycles at this batch size: ``repeats`` up to REPEATS_BATCH jobs, fewer for larger batches."""
    return min(repeats, max(MIN_CYCLES, repeats * REPEATS_BATCH // batch))


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def describe(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "p95": percentile(values, 0.95),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


# -- plans -----------------------------------------------------------------------------------------


@contextmanager
def captured(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their parameters) the engine sends to the driver meanwhile."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def dibs_claim_statement(bench: Bench, batch: int) -> tuple[str, Any]:
    """The statement that picks the jobs in a dibs claim of ``batch``, as dibs sends it."""
    engine = bench.dibs.app.engine
    with captured(engine) as seen:
        held = bench.dibs.claim(batch)
    bench.dibs.complete(held)
    bench.raw.replace(bench.dibs.ids(held))
    for statement, parameters in seen:
        # PostgreSQL: the claim's CTE; SQLite: its UPDATE ... WHERE id IN (SELECT ... ORDER BY ...); MariaDB: its
        # locking SELECT. The completion orders nothing.
        if "dibs_picked" in statement or "ORDER BY" in statement:
            return statement, parameters
    raise RuntimeError(f"no claim statement among {[statement[:40] for statement, _ in seen]}")


def explain(bench: Bench, batch: int) -> dict[str, Any]:
    """The plan of the dibs claim (and on PostgreSQL of the raw one), run and rolled back."""
    backend = bench.scenario.backend
    statement, parameters = dibs_claim_statement(bench, batch)
    engine = bench.dibs.app.engine
    plans: dict[str, Any] = {"backend": backend, "scenario": bench.scenario.name, "batch": batch}
    with engine.connect() as conn:
        transaction = conn.begin()
        try:
            if backend == "postgresql":
                rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", parameters).all()
                plans["dibs"] = [row[0] for row in rows]
            elif backend == "sqlite":
                rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
                plans["dibs"] = [str(row[-1]) for row in rows]
            else:
                result = conn.exec_driver_sql(f"ANALYZE {statement}", parameters)
                names = list(result.keys())
                plans["dibs"] = [dict(zip(names, map(str, row), strict=True)) for row in result.all()]
        finally:
            transaction.rollback()
    if backend == "postgresql":
        with bench.raw.conn.transaction(force_rollback=True):
            rows = bench.raw.conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS) {PG_CLAIM}", {"batch": batch, "owner": "explain"}
            ).fetchall()
        plans["raw"] = [row[0] for row in rows]
    return plans


SCAN = re.compile(r"(Index Only Scan|Index Scan|Bitmap Index Scan|Seq Scan)[^(]*")


def plan_summary(plans: dict[str, Any], kind: str = "dibs") -> str:
    """One line: how the claim found its jobs, and what it cost."""
    plan = plans.get(kind)
    if not plan:
        return "-"
    if plans["backend"] == "postgresql":
        scans = [SCAN.search(line) for line in plan]
        first = next((match.group(0).strip() for match in scans if match), "no scan")
        picked = next((line.strip() for line in plan if SCAN.search(line)), "")
        rows = re.search(r"actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", picked)
        buffers = next((line.strip() for line in plan if line.strip().startswith("Buffers:")), "")
        execution = next((line.strip() for line in plan if line.startswith("Execution Time")), "")
        planning = next((line.strip() for line in plan if line.startswith("Planning Time")), "")
        return f"{first} ({rows.group(1) if rows else '?'} rows); {buffers}; {planning}; {execution}"
    if plans["backend"] == "sqlite":
        return "; ".join(plan)
    return "; ".join(
        f"{row.get('table')}: {row.get('type')} on {row.get('key')}, rows {row.get('rows')}, "
        f"r_rows {row.get('r_rows')}, {row.get('Extra')}"
        for row in plan
    )


def postgresql_diagnostics(bench: Bench) -> dict[str, Any]:
    """The table's dead rows, and whether the prepared claim ran with generic or custom plans."""
    with bench.dibs.app.engine.connect() as conn:
        table = conn.exec_driver_sql(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, "
            "pg_relation_size('dibs_jobs'), pg_relation_size('dibs_jobs_claim') "
            "FROM pg_stat_user_tables WHERE relname = 'dibs_jobs'"
        ).one()
        prepared = conn.exec_driver_sql(
            "SELECT left(statement, 60), generic_plans, custom_plans FROM pg_prepared_statements"
        ).all()
    return {
        "live_rows": table[0],
        "dead_rows": table[1],
        "autovacuums": table[2],
        "autoanalyzes": table[3],
        "table_bytes": table[4],
        "claim_index_bytes": table[5],
        "prepared_on_dibs_connection": [
            {"statement": " ".join(text.split()), "generic_plans": generic, "custom_plans": custom}
            for text, generic, custom in prepared
        ],
    }


# -- the run ---------------------------------------------------------------------------------------


def benchmark(
    backends: Sequence[str] = BACKENDS,
    backlogs: Sequence[int] = DEFAULT_BACKLOGS,
    finished: int = DEFAULT_FINISHED,
    batches: Sequence[int] = DEFAULT_BATCHES,
    repeats: int = DEFAULT_REPEATS,
    rounds: int = DEFAULT_ROUNDS,
    warmup: int = DEFAULT_WARMUP,
    fill_budget: float = DEFAULT_FILL_BUDGET,
    explain_plans: bool = True,
    results: Path | None = RESULTS,
    verbose: bool = True,
) -> dict[str, Any]:
    """Measure every backend; returns the results (JSON-able), also written to ``results`` unless None.
    :func:`run` is the same with command-line arguments."""
    if not backlogs or min(backlogs) < 1:
        raise ValueError(f"backlogs must be positive numbers of jobs, got {list(backlogs)}")
    if any(batch < 1 or 2 * batch > TEMPLATE_JOBS for batch in batches):
        raise ValueError(f"batches must be between 1 and {TEMPLATE_JOBS // 2}, got {list(batches)}")
    if repeats < 1 or rounds < 1:
        raise ValueError("repeats and rounds must be at least 1")

    def log(line: str) -> None:
        if verbose:
            print(line, flush=True)

    options = {
        "backends": list(backends),
        "backlogs": list(backlogs),
        "finished": finished,
        "batches": list(batches),
        "repeats": repeats,
        "cycles_per_batch": {str(batch): cycles_for(batch, repeats) for batch in batches},
        "rounds": rounds,
        "warmup": warmup,
        "fill_budget": fill_budget,
        "explain": explain_plans,
    }
    began = time.time()
    load_before = os.getloadavg()
    filled: list[Scenario] = []
    measured: list[Samples] = []
    plans: list[dict[str, Any]] = []
    diagnostics: list[dict[str, Any]] = []
    backend_seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix=DATABASE_PREFIX) as tmp:
        for backend in backends:
            backend_began = time.time()
            scenarios = scenarios_for(backend, sorted(set(backlogs)), finished, Path(tmp))
            benches: list[Bench] = []
            try:
                for scenario in scenarios:
                    fill(scenario, fill_budget)
                    filled.append(scenario)
                    if scenario.skipped:
                        log(f"  {backend:<10} {scenario.name:<28} SKIPPED: {scenario.skipped}")
                        continue
                    log(
                        f"  {backend:<10} {scenario.name:<28} filled in {scenario.fill_seconds:6.1f} s "
                        f"({(scenario.queued + scenario.finished) / scenario.fill_seconds:,.0f} rows/s; "
                        f"template enqueued through dibs at {scenario.enqueue_jobs_per_second:,.0f} jobs/s)"
                    )
                    benches.append(Bench(scenario, DibsQueue(scenario), RawQueue(scenario)))
                for batch in batches:
                    cycles = cycles_for(batch, repeats)
                    log(f"  {backend:<10} batch {batch}: {cycles} cycles per kind and scenario, {rounds} rounds")
                    found = measure(benches, batch, cycles, rounds, warmup, log)
                    measured.extend(found)
                    for samples in found:
                        claim, complete = describe(samples.claim_ms), describe(samples.complete_ms)
                        log(
                            f"    {samples.scenario:<28} {samples.kind:<5} claim {claim['median']:7.2f} ms "
                            f"(p95 {claim['p95']:7.2f})  complete {complete['median']:7.2f} ms "
                            f"(p95 {complete['p95']:7.2f})"
                        )
                    if explain_plans:
                        for bench in benches:
                            plan = explain(bench, batch)
                            plans.append(plan)
                            log(f"    plan {bench.scenario.name:<28} {plan_summary(plan)}")
                for bench in benches:
                    scenario = bench.scenario
                    if backend == "postgresql":
                        diagnostics.append(
                            {"backend": backend, "scenario": scenario.name, **postgresql_diagnostics(bench)}
                        )
                    counts = status_counts(scenario)
                    left = {status: count for status, count in counts.items() if status in ("running", "scheduled")}
                    if counts.get("queued") != scenario.queued or left:
                        raise RuntimeError(f"{backend} {scenario.name}: expected {scenario.queued} queued, {counts}")
                    scenario.table = counts
            finally:
                try:
                    for bench in benches:
                        bench.dibs.close()
                        bench.raw.close()
                finally:
                    for scenario in scenarios:
                        own_database(scenario, create=False)
            backend_seconds[backend] = time.time() - backend_began
    elapsed = time.time() - began
    summary = summarize(measured)
    verdicts = goals(summary)
    document: dict[str, Any] = {
        "benchmark": "backlog",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": {"start": load_before, "end": os.getloadavg()},
        },
        "versions": versions(),
        "servers": servers(backends),
        "options": options,
        "seconds": elapsed,
        "seconds_per_backend": backend_seconds,
        "target": f"median claim at the largest backlog, and with the finished rows, <= {GOAL} x the smallest's",
        "goals": verdicts,
        "summary": summary,
        "rows": rows_of(summary),
        "scenarios": [
            {
                "backend": s.backend,
                "scenario": s.name,
                "queued": s.queued,
                "finished": s.finished,
                "fill_seconds": s.fill_seconds,
                "enqueue_many_jobs_per_second": s.enqueue_jobs_per_second,
                "skipped": s.skipped,
                "rows_at_end": s.table,
            }
            for s in filled
        ],
        "plans": plans,
        "postgresql_tables": diagnostics,
        "samples": [
            {
                "backend": s.backend,
                "scenario": s.scenario,
                "batch": s.batch,
                "kind": s.kind,
                "claim_ms": [round(value, 3) for value in s.claim_ms],
                "complete_ms": [round(value, 3) for value in s.complete_ms],
            }
            for s in measured
        ],
    }
    if verbose:
        report(document)
    if results is not None:
        results.mkdir(exist_ok=True)
        out = results / f"backlog-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(document, indent=2))
        document["written_to"] = str(out)
        log(f"\nwritten to {out} after {elapsed / 60:.1f} minutes")
    return document


def summarize(measured: list[Samples]) -> list[dict[str, Any]]:
    """Per backend, batch and kind: each scenario's medians, and the ratios against the smallest backlog."""
    summary = []
    keys = dict.fromkeys((s.backend, s.batch, s.kind) for s in measured)
    for backend, batch, kind in keys:
        rows = [s for s in measured if (s.backend, s.batch, s.kind) == (backend, batch, kind)]
        plain = sorted((s for s in rows if not s.finished), key=lambda s: s.queued)
        entry: dict[str, Any] = {
            "backend": backend,
            "batch": batch,
            "kind": kind,
            "scenarios": [
                {
                    "scenario": s.scenario,
                    "queued": s.queued,
                    "finished": s.finished,
                    "samples": len(s.claim_ms),
                    "claim_ms": describe(s.claim_ms),
                    "complete_ms": describe(s.complete_ms),
                }
                for s in rows
            ],
        }
        if plain:
            smallest = plain[0]
            base_claim = statistics.median(smallest.claim_ms)
            base_complete = statistics.median(smallest.complete_ms)
            entry["baseline"] = smallest.scenario
            if len(plain) > 1:
                largest = plain[-1]
                entry["largest"] = largest.scenario
                entry["claim_ratio_largest"] = statistics.median(largest.claim_ms) / base_claim
                entry["complete_ratio_largest"] = statistics.median(largest.complete_ms) / base_complete
            with_finished = [s for s in rows if s.finished and s.queued == smallest.queued]
            if with_finished:
                entry["with_finished"] = with_finished[0].scenario
                entry["claim_ratio_finished"] = statistics.median(with_finished[0].claim_ms) / base_claim
                entry["complete_ratio_finished"] = statistics.median(with_finished[0].complete_ms) / base_complete
        summary.append(entry)
    return summary


def rows_of(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary flat: one row per backend, batch, kind and scenario."""
    return [
        {
            "backend": entry["backend"],
            "batch": entry["batch"],
            "kind": entry["kind"],
            "scenario": row["scenario"],
            "backlog": row["queued"],
            "finished": row["finished"],
            "samples": row["samples"],
            "claim_ms_median": row["claim_ms"]["median"],
            "claim_ms_p95": row["claim_ms"]["p95"],
            "complete_ms_median": row["complete_ms"]["median"],
            "complete_ms_p95": row["complete_ms"]["p95"],
        }
        for entry in summary
        for row in entry["scenarios"]
    ]


def goals(summary: list[dict[str, Any]]) -> list[str]:
    lines = []
    for entry in summary:
        if entry["kind"] != "dibs":
            continue
        where = f"{entry['backend']} batch {entry['batch']}"
        for key, label in (("largest", "claim"), ("with_finished", "claim")):
            ratio = entry.get(f"{label}_ratio_{'largest' if key == 'largest' else 'finished'}")
            if ratio is None:
                continue
            verdict = "met" if ratio <= GOAL else "MISSED"
            lines.append(
                f"{where}: median dibs claim, {entry[key]} / {entry['baseline']} = {ratio:.2f}x; "
                f"goal <= {GOAL}x: {verdict}"
            )
    return lines


def report(document: dict[str, Any]) -> None:
    print("\nmedian (p95) ms per claim and per completion; dibs/raw = the two median claims")
    print(
        f"{'backend':<11}{'batch':>6}  {'scenario':<28}{'dibs claim':>18}{'dibs complete':>18}"
        f"{'raw claim':>18}{'raw complete':>18}{'dibs/raw':>9}"
    )
    by_key = {(e["backend"], e["batch"], e["kind"]): e for e in document["summary"]}
    for (backend, batch, kind), entry in by_key.items():
        if kind != "dibs":
            continue
        raw = by_key.get((backend, batch, "raw"))
        raw_rows = {row["scenario"]: row for row in raw["scenarios"]} if raw else {}
        for row in entry["scenarios"]:
            other = raw_rows.get(row["scenario"])
            cells = [row["claim_ms"], row["complete_ms"]]
            cells += [other["claim_ms"], other["complete_ms"]] if other else []
            text = "".join(f"{cell['median']:.2f} ({cell['p95']:.2f})".rjust(18) for cell in cells)
            ratio = f"{row['claim_ms']['median'] / other['claim_ms']['median']:.2f}" if other else "-"
            print(f"{backend:<11}{batch:>6}  {row['scenario']:<28}{text}{ratio:>9}")
    print("\nclaim cost against the smallest backlog (median / median)")
    print(
        f"{'backend':<11}{'batch':>6}  {'kind':<6}{'claim: largest':>16}{'finished':>10}"
        f"{'complete: largest':>19}{'finished':>10}"
    )
    ratios = ("claim_ratio_largest", "claim_ratio_finished", "complete_ratio_largest", "complete_ratio_finished")
    for entry in document["summary"]:
        cells = [entry.get(key) for key in ratios]
        shown = [f"{value:.2f}x" if value is not None else "-" for value in cells]
        print(
            f"{entry['backend']:<11}{entry['batch']:>6}  {entry['kind']:<6}{shown[0]:>16}{shown[1]:>10}"
            f"{shown[2]:>19}{shown[3]:>10}"
        )
    print("\ngoals")
    for line in document["goals"]:
        print(f"  {line}")
    skipped = [s for s in document["scenarios"] if s["skipped"]]
    for scenario in skipped:
        print(f"  {scenario['backend']} {scenario['scenario']}: not measured, {scenario['skipped']}")


def servers(backends: Sequence[str]) -> dict[str, Any]:
    """The server versions and the settings that decide how much of a big table stays in memory."""
    found: dict[str, Any] = {}
    if "postgresql" in backends:
        engine = sa.create_engine(POSTGRES_URL)
        with engine.connect() as conn:
            version = conn.exec_driver_sql("SHOW server_version").scalar_one()
            settings = conn.exec_driver_sql(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN "
                "('shared_buffers', 'work_mem', 'plan_cache_mode', 'jit', 'autovacuum', 'synchronous_commit')"
            ).all()
        engine.dispose()
        found["postgresql"] = {"version": version, **{str(row[0]): row[1] for row in settings}}
    if "mariadb" in backends:
        engine = sa.create_engine(MARIADB_URL)
        with engine.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT VERSION(), @@innodb_buffer_pool_size, @@innodb_flush_log_at_trx_commit"
            ).one()
        engine.dispose()
        found["mariadb"] = {
            "version": row[0],
            "innodb_buffer_pool_size": int(row[1]),
            "innodb_flush_log_at_trx_commit": int(row[2]),
        }
    return found


def versions() -> dict[str, str]:
    return record.versions(("sqlalchemy", "psycopg", "pymysql"))


def numbers(text: str) -> list[int]:
    return [int(item.replace("_", "")) for item in text.split(",") if item]


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--backlogs", default=",".join(map(str, DEFAULT_BACKLOGS)), help="queued jobs per scenario")
    parser.add_argument(
        "--finished",
        type=int,
        default=DEFAULT_FINISHED,
        help="finished jobs behind the smallest backlog in one more scenario (0: no such scenario)",
    )
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help=f"timed cycles per kind and scenario at batches up to {REPEATS_BATCH} (larger: fewer, >= {MIN_CYCLES})",
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="turns the scenarios take")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed cycles per kind and scenario")
    parser.add_argument(
        "--fill-budget", type=float, default=DEFAULT_FILL_BUDGET, help="seconds a scenario's fill may take"
    )
    parser.add_argument("--no-explain", action="store_true", help="skip the plans")
    return parser


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run what the command-line arguments ``argv`` ask for; returns the results (also written to
    benchmarks/results)."""
    options = arguments().parse_args(None if argv is None else list(argv))
    return benchmark(
        backends=options.backends.split(","),
        backlogs=numbers(options.backlogs),
        finished=options.finished,
        batches=numbers(options.batches),
        repeats=options.repeats,
        rounds=options.rounds,
        warmup=options.warmup,
        fill_budget=options.fill_budget,
        explain_plans=not options.no_explain,
    )


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
