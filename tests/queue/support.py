"""What the queue tests share: the databases they run on, test-only tables, and workers with short timings."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import dibs
from dibs.schema import jobs
from tests.helpers import ServiceThread

#: Worker timings that keep every test short: short leases, frequent upkeep, quick polls.
FAST = {"lease": 2.0, "poll": 0.05, "upkeep_every": 0.1, "grace": 5.0, "handle_signals": False}
#: Retries that come back almost at once.
QUICK_RETRY = dibs.Retry(base=0.05, factor=2.0, jitter=0.0)

#: Tables of the tests themselves (a business table written with the jobs; a log of task runs).
test_metadata = sa.MetaData()
orders = sa.Table(
    "dibs_test_orders",
    test_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("item", sa.String(50), nullable=False),
)
runs = sa.Table(
    "dibs_test_runs",
    test_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("event", sa.String(20), nullable=False),
)
#: Counters a transactional task increments in its transaction.
counters = sa.Table(
    "dibs_test_counters",
    test_metadata,
    sa.Column("name", sa.String(50), primary_key=True),
    sa.Column("n", sa.Integer, nullable=False),
)


def family_of(url: sa.URL | Engine) -> str:
    name = (url.url if isinstance(url, Engine) else url).get_backend_name()
    return "mariadb" if name in ("mysql", "mariadb") else name


def database_now(bind: Engine | sa.Connection) -> datetime:
    """The database's clock, in UTC (SQLite runs in-process: its clock is the application's)."""
    if bind.dialect.name == "sqlite":
        return datetime.now(timezone.utc)
    query = "SELECT now()" if bind.dialect.name == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            moment = conn.execute(sa.text(query)).scalar_one()
    else:
        moment = bind.execute(sa.text(query)).scalar_one()
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def drop_everything(url: sa.URL) -> None:
    """Drop the dibs tables and the test tables, failing fast (not hanging) if a leftover session holds a lock."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET lock_timeout = '10s'")
            elif conn.dialect.name in ("mysql", "mariadb"):
                conn.exec_driver_sql("SET SESSION lock_wait_timeout = 10")
            conn.commit()
            test_metadata.drop_all(conn)
            dibs.schema.metadata.drop_all(conn)
            conn.commit()
    finally:
        engine.dispose()


def job_rows(engine: Engine, *where: Any) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(jobs).where(*where).order_by(jobs.c.id)))


def job_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one())


def run_events(engine: Engine) -> list[tuple[int, str]]:
    """(job id, event) of every logged task run, in the order they were logged."""
    with engine.connect() as conn:
        return [(row.job_id, row.event) for row in conn.execute(sa.select(runs).order_by(runs.c.id))]


def log_run(engine: Engine, job_id: int, event: str) -> None:
    with engine.begin() as conn:
        conn.execute(runs.insert().values(job_id=job_id, event=event))


class WorkerThread(ServiceThread[dibs.WorkerStats]):
    """A worker running in a thread of this process; stopped in a hurry."""

    def __init__(self, worker: dibs.Worker) -> None:
        super().__init__(worker, lambda: worker.stop(hurry=True), "worker")
        self.worker = worker

    def start(self) -> WorkerThread:
        self.thread.start()
        return self


def sends_notifications(app: dibs.App, channel: str) -> bool:
    """Whether the app's database and driver deliver notifications on ``channel`` (a listener starts)."""
    listener = app.store.backend.listen(app.engine, channel, lambda payload: None)
    if listener is None:
        return False
    listener.close()
    return True


def kill_listeners(engine: Engine, channel: str) -> int:
    """End, from the PostgreSQL server, the sessions listening on ``channel``; returns how many."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query = :listen"
                ),
                {"listen": f'LISTEN "{channel}"'},
            ).scalar_one()
        )


def kill_other_sessions(url: sa.URL) -> int:
    """Kill every other session on this database from the server side (PostgreSQL or MariaDB); returns how
    many."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                query = (
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                return int(conn.execute(sa.text(query)).scalar_one())
            ids = conn.execute(
                sa.text("SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()")
            ).scalars()
            killed = 0
            for session in list(ids):
                try:
                    conn.execute(sa.text(f"KILL CONNECTION {int(session)}"))
                    killed += 1
                except sa.exc.DBAPIError:  # it ended by itself meanwhile
                    pass
            return killed
    finally:
        engine.dispose()


# -- query plans -----------------------------------------------------------------------------------------


def caught_statements(engine: Engine, call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The reads and writes ``call`` sends through ``engine``, with their parameters."""
    statements: list[tuple[str, Any]] = []

    def caught(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE")):
            statements.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", caught)
    try:
        call()
    finally:
        sa.event.remove(engine, "before_cursor_execute", caught)
    return statements


def plan_of(conn: sa.Connection, statement: str, parameters: Any) -> str:
    """The database's plan for a statement, one step per ``|``-separated part."""
    explain = "EXPLAIN QUERY PLAN" if conn.dialect.name == "sqlite" else "EXPLAIN"
    rows = conn.exec_driver_sql(f"{explain} {statement}", parameters).all()
    if conn.dialect.name == "mysql":
        # id, select_type, table, type (ALL: the whole table), possible_keys, key, key_len, ref, rows, Extra
        return " | ".join(f"{row[2]} {row[3]} {row[5]} {row[9]}" for row in rows)
    return " | ".join(str(row[-1]) for row in rows)


def reads_whole(plan: str, table: str) -> bool:
    """Whether a plan from plan_of reads all of ``table``, on any of the three databases."""
    return (
        f"Seq Scan on {table}" in plan  # PostgreSQL
        or re.search(rf"SCAN {table}(?! USING)", plan) is not None  # SQLite
        or f"{table} ALL" in plan  # MariaDB
    )


def sorts(plan: str) -> bool:
    """Whether a plan from plan_of sorts rows (it read them all to find the first)."""
    return re.search(r"\bSort\b|TEMP B-TREE|filesort", plan) is not None


def assert_reads_indexes(engine: Engine, statements: list[tuple[str, Any]], table: str, indexes: list[str]) -> None:
    """Each statement's plan reads ``table`` through its indexes, not whole and without sorting, and the
    plans use every one of ``indexes``."""
    assert statements, "nothing was asked of the database"
    with engine.connect() as conn:
        plans = [plan_of(conn, statement, parameters) for statement, parameters in statements]
    everything = " || ".join(plans)
    for index in indexes:
        assert index in everything, everything
    for plan in plans:
        assert not reads_whole(plan, table), plan
        assert not sorts(plan), plan


def analyzed_then_finished(engine: Engine, table: sa.Table, backlog: dict[str, Any], finished: dict[str, Any]) -> None:
    """Every row of ``table`` set to ``backlog`` when the statistics are taken (and kept), then to
    ``finished``: what a planner believes after a backlog was analyzed and its rows then finished."""
    with engine.begin() as conn:
        conn.execute(sa.update(table).values(**backlog))
    statistics_taken_now(engine, table.name)
    with engine.begin() as conn:
        conn.execute(sa.update(table).values(**finished))


def statistics_taken_now(engine: Engine, table: str) -> None:
    """Statistics of ``table`` as it is now, which the database then keeps (no automatic refresh) until
    the table is dropped: what a planner believes after a backlog was analyzed."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if conn.dialect.name == "mysql":
            conn.exec_driver_sql(f"ALTER TABLE {table} STATS_AUTO_RECALC=0")
            conn.exec_driver_sql(f"ANALYZE TABLE {table}").all()
        elif conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            conn.exec_driver_sql(f"ANALYZE {table}")
        else:
            conn.exec_driver_sql(f"ANALYZE {table}")


#: The columns of dibs_jobs that schema steps 6, 7, 9 and 10 (results, dependencies, progress, trace context) add.
LATER_JOB_COLUMNS = (
    "result",
    "has_children",
    "on_parent_failure",
    "parents_left",
    "progress",
    "progress_message",
    "headers",
)
#: The column of dibs_periodic that step 8 (pausing schedules) adds.
LATER_PERIODIC_COLUMNS = ("paused",)


def without_later_job_columns(engine: Engine) -> None:
    """Step 1 makes today's jobs table, and step 3 today's periodic table; drop what later steps add, as an
    older dibs left the tables."""
    with engine.begin() as conn:
        present = {index["name"] for index in sa.inspect(conn).get_indexes("dibs_jobs")}
        for index in jobs.indexes:
            if index.name in present and str(index.name).startswith("dibs_jobs_children"):
                index.drop(conn)
        for name in LATER_JOB_COLUMNS:
            conn.execute(sa.text(f"ALTER TABLE dibs_jobs DROP COLUMN {name}"))
        if "dibs_periodic" in sa.inspect(conn).get_table_names():
            for name in LATER_PERIODIC_COLUMNS:
                conn.execute(sa.text(f"ALTER TABLE dibs_periodic DROP COLUMN {name}"))
