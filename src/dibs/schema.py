"""The library's own tables, their column types and their migrations.

``dibs_jobs`` holds the job queue. Its indexes are partial where the database has partial indexes
(PostgreSQL, SQLite) so that each one holds only the rows its query looks for: the claim reads an
index of queued jobs only, so finished and future jobs never make it slower. MySQL and MariaDB have no
partial indexes; there the status leads each index instead.

``dibs_outbox`` holds the transactional outbox: events written in the caller's business transaction
and published by relays, in order per aggregate. Its indexes are partial in the same way: the claim
reads pending events only, and the check that an event heads its aggregate reads unfinished ones only.

``dibs_periodic`` holds one row per periodic job schedule and the next slot it is due at.

``dibs_workers`` holds one row per running worker: what it serves and when it last beat, so that
``dibs status`` can tell which queued jobs no live worker can take.

Every name and key (a task, a queue, a dedupe key, an aggregate...) is a :class:`Name` column: it compares
byte for byte on every database, as it does in Python.

``dibs_schema`` records which migrations have run. :func:`migrate` runs the missing ones in order;
``dibs init`` calls it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine

from dibs._errors import SchemaMissing
from dibs.dialects import backend_for
from dibs.dialects.base import Name
from dibs.engine import connected

#: A point in time with microseconds on every backend: timestamptz on PostgreSQL, DATETIME(6) holding
#: UTC on MySQL and MariaDB (plain DATETIME drops the fraction), ISO text in UTC on SQLite.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


@overload
def aware(moment: datetime) -> datetime: ...
@overload
def aware(moment: None) -> None: ...
def aware(moment: datetime | None) -> datetime | None:
    """A Timestamp as read back, with its time zone: backends without time zones store UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


#: Job states. ``scheduled`` jobs wait for their time and are moved to ``queued`` when it comes, so that
#: the claim's index holds runnable jobs only.
SCHEDULED, QUEUED, RUNNING = "scheduled", "queued", "running"
SUCCEEDED, DEAD, CANCELLED = "succeeded", "dead", "cancelled"
LIVE = (SCHEDULED, QUEUED, RUNNING)
FINISHED = (SUCCEEDED, DEAD, CANCELLED)
STATES = (*LIVE, *FINISHED)

#: Text of any length (MySQL's TEXT stops at 64 KiB).
_LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

#: Outbox event states. A ``failed`` event waits for its next attempt and is moved back to ``pending``
#: when that time comes; after its last retry it is ``abandoned``, with the error kept.
PENDING, PROCESSING, PUBLISHED = "pending", "processing", "published"
FAILED, ABANDONED = "failed", "abandoned"
EVENT_STATES = (PENDING, PROCESSING, FAILED, ABANDONED, PUBLISHED)
#: The target an event goes to when none is named.
DEFAULT_TARGET = "default"

JOBS = "dibs_jobs"
OUTBOX = "dibs_outbox"
PERIODIC = "dibs_periodic"
WORKERS = "dibs_workers"
SCHEMA = "dibs_schema"

metadata = sa.MetaData()

jobs = sa.Table(
    JOBS,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("task", Name(200), nullable=False),
    sa.Column("queue", Name(100), nullable=False),
    sa.Column("args", _LongText, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("status", Name(16), nullable=False),
    sa.Column("run_at", Timestamp, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("lease_owner", Name(200), nullable=True),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
    # Set while the job is live, cleared when it finishes: the unique index then allows one live job per key.
    sa.Column("dedupe_key", Name(200), nullable=True),
    sa.Column("ordering_key", Name(200), nullable=True),
    sa.Column("tag", Name(100), nullable=True),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("enqueued_at", Timestamp, nullable=False),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Column("last_error", _LongText, nullable=True),
)


def _partial(
    name: str, columns: list[Any], where: str, full_prefix: list[Any], *, unique: bool = False
) -> list[sa.Index]:
    """A partial index where the database has them, else a full one led by ``full_prefix``."""
    partial = sa.Index(name, *columns, unique=unique, postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    partial.ddl_if(callable_=_has_partial)
    full = sa.Index(f"{name}_full", *full_prefix, *columns, unique=unique)
    full.ddl_if(callable_=_lacks_partial)
    return [partial, full]


def _has_partial(*_: Any, dialect: sa.Dialect, **__: Any) -> bool:
    return backend_for(dialect).partial_indexes


def _lacks_partial(*_: Any, dialect: sa.Dialect, **__: Any) -> bool:
    return not _has_partial(dialect=dialect)


# Indexes attach themselves to the table through their columns. Every update of a job that changes an
# indexed column writes an entry into each index whose predicate the new row matches, so each index
# holds only the rows it serves: a claim or a completion touches the primary key and one other index.
# The claim: runnable jobs of a queue in claim order.
_partial(
    "dibs_jobs_claim",
    [jobs.c.queue, jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id],
    "status = 'queued'",
    [jobs.c.status],
)
# Scheduled and retried jobs whose time has come.
_partial("dibs_jobs_due", [jobs.c.run_at], "status = 'scheduled'", [jobs.c.status])
# Leases that expired (a worker crashed). The predicate says more than status = 'running' on purpose: a
# lease write, whose WHERE holds status = 'running' and the keys, must not be planned as a scan of every
# running job through this index, but find its rows by primary key.
_partial(
    "dibs_jobs_expiry",
    [jobs.c.lease_expires_at],
    "status = 'running' AND lease_expires_at IS NOT NULL",
    [jobs.c.status],
)
# The oldest live job of an ordering key.
_partial(
    "dibs_jobs_ordering",
    [jobs.c.ordering_key, jobs.c.id],
    "status IN ('scheduled', 'queued', 'running') AND ordering_key IS NOT NULL",
    [jobs.c.status],
)
# One live job per dedupe key (the key is cleared when the job finishes).
_partial("dibs_jobs_dedupe", [jobs.c.dedupe_key], "dedupe_key IS NOT NULL", [], unique=True)
# Retention sweeps.
_partial(
    "dibs_jobs_finished",
    [jobs.c.status, jobs.c.finished_at],
    "status IN ('succeeded', 'dead', 'cancelled')",
    [],
)

outbox = sa.Table(
    OUTBOX,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    # The broker (or relay) the event is meant for: relays take the events of their target only.
    sa.Column("target", Name(100), nullable=False, server_default=DEFAULT_TARGET),
    sa.Column("aggregate_type", Name(200), nullable=False),
    sa.Column("aggregate_id", Name(200), nullable=False),
    sa.Column("event_type", Name(200), nullable=False),
    sa.Column("payload", _LongText, nullable=False),
    sa.Column("headers", sa.Text, nullable=True),
    sa.Column("status", Name(16), nullable=False, server_default=PENDING),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("next_attempt_at", Timestamp, nullable=True),
    # Failed publishes so far; claims so far (a relay that dies mid-batch counts a claim, not a failure).
    sa.Column("retry_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_owner", Name(200), nullable=True),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("last_error", _LongText, nullable=True),
    sa.Column("published_at", Timestamp, nullable=True),
)

# The claim: pending events of a target in creation order.
_partial("dibs_outbox_claim", [outbox.c.target, outbox.c.id], "status = 'pending'", [outbox.c.status])
# Whether an event heads its aggregate: the aggregate's unfinished events, oldest first. Without a partial
# index the status goes after the aggregate, so the check skips the aggregate's published events.
_aggregate = [outbox.c.target, outbox.c.aggregate_type, outbox.c.aggregate_id]
sa.Index(
    "dibs_outbox_aggregate",
    *_aggregate,
    outbox.c.id,
    postgresql_where=sa.text("status IN ('pending', 'processing', 'failed', 'abandoned')"),
    sqlite_where=sa.text("status IN ('pending', 'processing', 'failed', 'abandoned')"),
).ddl_if(callable_=_has_partial)
sa.Index("dibs_outbox_aggregate_full", *_aggregate, outbox.c.status, outbox.c.id).ddl_if(callable_=_lacks_partial)
# The aggregate's events in flight (being published): a few rows at most.
sa.Index(
    "dibs_outbox_in_flight",
    *_aggregate,
    postgresql_where=sa.text("status = 'processing'"),
    sqlite_where=sa.text("status = 'processing'"),
).ddl_if(callable_=_has_partial)
# Failed events whose next attempt has come.
_partial("dibs_outbox_due", [outbox.c.next_attempt_at], "status = 'failed'", [outbox.c.status])
# Leases of relays that died (see dibs_jobs_expiry for why the predicate says more than the status).
_partial(
    "dibs_outbox_expiry",
    [outbox.c.lease_expires_at],
    "status = 'processing' AND lease_expires_at IS NOT NULL",
    [outbox.c.status],
)
# Retention sweeps.
_partial("dibs_outbox_published", [outbox.c.published_at], "status = 'published'", [outbox.c.status])

# Periodic jobs: one row per schedule, due when its next slot comes. Taking the row, enqueueing the slot's
# job and moving the row on to the next slot happen in one transaction: one job per slot, however many
# workers look.
periodic = sa.Table(
    PERIODIC,
    metadata,
    sa.Column("name", Name(200), primary_key=True),
    sa.Column("task", Name(200), nullable=False),
    # "every 300s" or "cron */5 * * * *": a changed schedule starts again from the next slot.
    sa.Column("schedule", Name(200), nullable=False),
    sa.Column("next_slot_at", Timestamp, nullable=False),
    sa.Column("last_slot_at", Timestamp, nullable=True),
    sa.Column("last_job_id", sa.BigInteger, nullable=True),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# Running workers. A worker writes its row as it starts, beats in it, and deletes it as it stops; the row of a
# worker that stopped beating for DEAD_AFTER_LEASES of its leases (it was killed) counts as dead.
workers = sa.Table(
    WORKERS,
    metadata,
    sa.Column("name", Name(200), primary_key=True),
    sa.Column("host", Name(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    # JSON lists of names.
    sa.Column("queues", _LongText, nullable=False),
    sa.Column("tasks", _LongText, nullable=False),
    sa.Column("tags", _LongText, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    sa.Column("lease_seconds", sa.Double, nullable=False),
    sa.Column("started_at", Timestamp, nullable=False),
    sa.Column("last_heartbeat", Timestamp, nullable=False),
)
#: A worker whose heartbeat is older than this many of its leases is dead: its row is ignored and removed.
DEAD_AFTER_LEASES = 3

schema_versions = sa.Table(
    SCHEMA,
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", Timestamp, nullable=False),
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


def _exact_names_and_workers(conn: Connection) -> None:
    present = set(sa.inspect(conn).get_table_names())
    backend = backend_for(conn.dialect)
    for table in (jobs, outbox, periodic):
        if table.name in present:
            backend.make_names_exact(conn, table)
    workers.create(conn, checkfirst=True)


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


#: How many times migrate() tries when its statements collide with another process migrating the database.
MIGRATE_TRIES = 6


def migrate(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[Migration]:
    """Apply the migrations this database lacks, in order; returns those applied (none when up to date).

    Processes may migrate one database at once (every replica running ``dibs init`` as it starts): a step
    whose DDL or version row collides with another's is rolled back and, once that one is recorded, skipped.
    """
    applied: list[Migration] = []
    for attempt in range(1, MIGRATE_TRIES + 1):
        try:
            _apply_missing(bind, migrations, applied)
            return applied
        except sa.exc.DBAPIError:
            if attempt == MIGRATE_TRIES:
                raise
            if isinstance(bind, Connection) and bind.in_transaction():
                bind.rollback()
            time.sleep(0.05 * attempt)
    return applied


def _apply_missing(bind: Engine | Connection, migrations: tuple[Migration, ...], applied: list[Migration]) -> None:
    with connected(bind) as conn:
        schema_versions.create(conn, checkfirst=True)
        _commit(conn)
        present, done = _tables_and_version(conn)
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


def _tables_and_version(conn: Connection) -> tuple[set[str], int]:
    """The database's table names and its newest applied migration (0 for none), in two queries."""
    present = set(sa.inspect(conn).get_table_names())
    if SCHEMA not in present:
        return present, 0
    return present, _newest_applied(conn)


def _gone(present: set[str], done: int, migrations: tuple[Migration, ...]) -> list[str]:
    return [
        step.creates
        for step in sorted(migrations, key=lambda step: step.version)
        if step.version <= done and step.creates is not None and step.creates not in present
    ]


def missing_tables(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """The tables of applied migrations that the database no longer has (dropped after `dibs init`)."""
    with connected(bind) as conn:
        present, done = _tables_and_version(conn)
    return _gone(present, done, migrations)


def schema_problem(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> SchemaMissing | None:
    """What is wrong with the dibs tables, saying what to run; None when they are all there and current.
    Two queries on one connection: every worker asks as it starts."""
    with connected(bind) as conn:
        present, have = _tables_and_version(conn)
    want = max(step.version for step in migrations)
    if have < want:
        what = "has no dibs tables" if have == 0 else f"has dibs schema version {have}, this dibs needs {want}"
        return SchemaMissing(
            f"the database {what}; run `dibs --db URL init` (or dibs.migrate(engine)) to create or upgrade them"
        )
    gone = _gone(present, have, migrations)
    if gone:
        return SchemaMissing(
            f"the database lacks the dibs table{'s' if len(gone) > 1 else ''} {', '.join(gone)} (dropped after "
            "`dibs init` created it); run `dibs --db URL init` (or dibs.migrate(engine)) to create it again"
        )
    return None


def require_current(bind: Engine | Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> None:
    """Raise SchemaMissing, saying what to run, unless every migration has been applied and its tables exist."""
    problem = schema_problem(bind, migrations)
    if problem is not None:
        raise problem


def translated(error: Exception, engine: Engine) -> Exception:
    """For a statement that failed: SchemaMissing (caused by ``error``) when the failure is that the dibs
    tables are missing or out of date, else ``error`` itself. The tables are looked up on a connection of
    its own, since the one that failed may be in an aborted transaction."""
    if not isinstance(error, (sa.exc.ProgrammingError, sa.exc.OperationalError)) or error.connection_invalidated:
        return error
    try:
        problem = schema_problem(engine)
    except Exception:  # the database is away: the original error says more
        return error
    if problem is None:
        return error
    problem.__cause__ = error
    return problem


@contextmanager
def tables_checked(engine: Engine) -> Iterator[None]:
    """Turn the failure of a statement run in the block into SchemaMissing, saying what to run, when the
    dibs tables of ``engine``'s database are missing or out of date (see :func:`translated`)."""
    try:
        yield
    except sa.exc.DBAPIError as error:
        problem = translated(error, engine)
        if problem is error:
            raise
        raise problem from error


def _commit(conn: Connection) -> None:
    if conn.in_transaction():
        conn.commit()
