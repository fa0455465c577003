"""The migrations that create and upgrade the dibs tables, and :func:`migrate`, which applies them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs.dialects import backend_for
from dibs.engine import connected
from dibs.schema.recorder import Recorder
from dibs.schema.tables import (
    JOB_PARENTS,
    JOBS,
    OUTBOX,
    PERIODIC,
    QUEUES,
    SCHEMA,
    WORKERS,
    job_parents,
    jobs,
    outbox,
    periodic,
    queues,
    schema_versions,
    workers,
)


@dataclass(frozen=True, kw_only=True)
class Migration:
    """One step of the schema, applied once, in version order."""

    version: int
    description: str
    apply: Callable[[Connection], None]
    #: The table this step creates: if it goes missing later (dropped by hand, or by a restore), ``apply``
    #: creates it again, in its current shape, the next time the database is migrated.
    creates: str | None = None


def _create_jobs(conn: Connection) -> None:
    jobs.create(conn, checkfirst=True)


def _create_outbox(conn: Connection) -> None:
    outbox.create(conn, checkfirst=True)


def _create_periodic(conn: Connection) -> None:
    periodic.create(conn, checkfirst=True)


#: Columns of dibs_jobs that steps after 4 add: step 4 leaves them to those steps.
LATER_JOB_COLUMNS = frozenset(
    {"result", "has_children", "on_parent_failure", "parents_left", "progress", "progress_message", "headers"}
)


def _exact_names_and_workers(conn: Connection) -> None:
    present = conn.tables if isinstance(conn, Recorder) else set(sa.inspect(conn).get_table_names())
    backend = backend_for(conn.dialect)
    recording = isinstance(conn, Recorder)
    for table in (jobs, outbox, periodic):
        if table.name in present:
            # A database is asked which columns it has; a recording is told which ones a version 3 table had.
            columns = [c for c in table.columns if c.name not in LATER_JOB_COLUMNS] if recording else None
            backend.make_names_exact(conn, table, columns)
    workers.create(conn, checkfirst=True)


def _create_queues(conn: Connection) -> None:
    queues.create(conn, checkfirst=True)


def _add_columns(conn: Connection, table: sa.Table, *names: str) -> list[str]:
    """Add these columns of ``table`` in place (its rows stay), those it lacks; returns those added. A table
    created (again) by its own step has them all."""
    if isinstance(conn, Recorder):
        # A recording sees the table an older dibs made, or the one an earlier step just made with every column.
        present = set() if table.name in conn.tables else set(table.c.keys())
    else:
        present = {column["name"] for column in sa.inspect(conn).get_columns(table.name)}
    added = []
    for name in names:
        if name not in present:
            column = sa.schema.CreateColumn(table.c[name]).compile(dialect=conn.dialect)
            conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {column}"))
            added.append(name)
    return added


def _add_job_columns(conn: Connection, *names: str) -> list[str]:
    """Add these columns of ``dibs_jobs`` in place (the jobs stay), those it lacks; returns those added."""
    return _add_columns(conn, jobs, *names)


def _job_results(conn: Connection) -> None:
    _add_job_columns(conn, "result")


def _job_dependencies(conn: Connection) -> None:
    if _add_job_columns(conn, "has_children", "on_parent_failure", "parents_left"):
        partial = backend_for(conn.dialect).partial_indexes
        for index in jobs.indexes:
            if index.name == ("dibs_jobs_children" if partial else "dibs_jobs_children_full"):
                index.create(conn, checkfirst=True)
    job_parents.create(conn, checkfirst=True)


def _periodic_pause(conn: Connection) -> None:
    _add_columns(conn, periodic, "paused")


def _job_progress(conn: Connection) -> None:
    _add_job_columns(conn, "progress", "progress_message")


def _job_headers(conn: Connection) -> None:
    _add_job_columns(conn, "headers")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, description="the jobs table", apply=_create_jobs, creates=JOBS),
    Migration(version=2, description="the outbox table", apply=_create_outbox, creates=OUTBOX),
    Migration(version=3, description="the periodic jobs table", apply=_create_periodic, creates=PERIODIC),
    Migration(
        version=4,
        description="names and keys compare byte for byte on MySQL and MariaDB; the workers table",
        apply=_exact_names_and_workers,
        creates=WORKERS,
    ),
    # Pausing queues: its own step, renumbered after any step merged before it.
    Migration(version=5, description="the queues table: paused queues", apply=_create_queues, creates=QUEUES),
    Migration(version=6, description="job results: the result column of dibs_jobs", apply=_job_results),
    Migration(
        version=7,
        description="jobs that wait for other jobs: the waiting state's columns and dibs_job_parents",
        apply=_job_dependencies,
        creates=JOB_PARENTS,
    ),
    Migration(
        version=8, description="pausing periodic schedules: the paused column of dibs_periodic", apply=_periodic_pause
    ),
    Migration(version=9, description="job progress: the progress columns of dibs_jobs", apply=_job_progress),
    Migration(version=10, description="trace context: the headers column of dibs_jobs", apply=_job_headers),
)
#: The schema version this dibs needs.
LATEST = max(step.version for step in MIGRATIONS)


def current_version(bind: Engine | Connection) -> int:
    """The newest migration applied to this database, 0 for none."""
    with connected(bind) as conn:
        if not sa.inspect(conn).has_table(SCHEMA):
            return 0
        return _newest_applied(conn)


def _newest_applied(conn: Connection) -> int:
    """The newest version recorded in dibs_schema (which exists), 0 for none."""
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(schema_versions.c.version), 0))).scalar_one())


#: How many collisions in a row, with no step recorded by anyone in between, make migrate() give up.
MIGRATE_TRIES = 6


def migrate(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[Migration]:
    """Apply the migrations this database lacks, in order.

    Processes may migrate one database at once (every replica running ``dibs init`` as it starts): a step
    whose DDL or version row collides with another's is rolled back and, once that one is recorded, skipped.

    Args:
        bind: An Engine, or a Connection (each step commits on it).
        migrations: The steps to apply; dibs's own unless given.

    Returns:
        The steps applied, none when the database was up to date.

    Example:
        >>> applied = dibs.migrate(engine)
        >>> applied[-1].version == dibs.schema.LATEST
        True
    """
    applied: list[Migration] = []
    stalled, newest = 0, -1
    while True:
        try:
            _apply_missing(bind, migrations, applied)
            return applied
        except sa.exc.DBAPIError:
            if isinstance(bind, Connection) and bind.in_transaction():
                bind.rollback()
            # A collision while others record steps is progress, however many steps there are: only
            # collisions with nothing recorded in between count towards giving up.
            recorded = _version_or_none(bind)
            stalled = 0 if recorded is not None and recorded > newest else stalled + 1
            newest = max(newest, recorded or 0)
            if stalled >= MIGRATE_TRIES:
                raise
            time.sleep(0.05 * (stalled + 1))


def _version_or_none(bind: Engine | Connection) -> int | None:
    """The newest step recorded, or None if the database cannot say now."""
    try:
        return current_version(bind)
    except sa.exc.DBAPIError:
        if isinstance(bind, Connection) and bind.in_transaction():
            bind.rollback()
        return None


def _apply_missing(bind: Engine | Connection, migrations: tuple[Migration, ...], applied: list[Migration]) -> None:
    with connected(bind) as conn:
        schema_versions.create(conn, checkfirst=True)
        _commit(conn)
        present, done = tables_and_version(conn)
        for migration in sorted(migrations, key=lambda step: step.version):
            if migration.version <= done:
                if migration.creates is not None and migration.creates not in present:
                    # Recorded as applied, but its table is gone: create it again (empty).
                    migration.apply(conn)
                    _commit(conn)
                continue
            migration.apply(conn)
            # The backend's clock in UTC (MySQL's NOW() is the session's local time).
            now = backend_for(conn.dialect).now()
            conn.execute(schema_versions.insert().values(version=migration.version, applied_at=now))
            _commit(conn)
            applied.append(migration)


def tables_and_version(conn: Connection) -> tuple[set[str], int]:
    """The database's table names and its newest applied migration (0 for none), in two queries."""
    present = set(sa.inspect(conn).get_table_names())
    if SCHEMA not in present:
        return present, 0
    return present, _newest_applied(conn)


def _commit(conn: Connection) -> None:
    if conn.in_transaction():
        conn.commit()
