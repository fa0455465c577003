"""The library's own tables, their column types and their migrations.

``dibs_jobs`` holds the job queue. Its indexes are partial where the database has partial indexes
(PostgreSQL, SQLite) so that each one holds only the rows its query looks for: the claim reads an
index of queued jobs only, so finished and future jobs never make it slower. MySQL and MariaDB have no
partial indexes; there the status leads each index instead.

``dibs_outbox`` holds the transactional outbox: events written in the caller's business transaction
and published by relays, in order per aggregate. Its indexes are partial in the same way: the claim
reads pending events only, and the check that an event heads its aggregate reads unfinished ones only.

``dibs_periodic`` holds one row per periodic job schedule, the next slot it is due at, and whether it is paused.

``dibs_workers`` holds one row per running worker: what it serves and when it last beat, so that
``dibs status`` can tell which queued jobs no live worker can take.

Every name and key (a task, a queue, a dedupe key, an aggregate...) is a :class:`Name` column: it compares
byte for byte on every database, as it does in Python.

``dibs_queues`` holds one row per queue someone paused (and, once resumed, kept with ``paused`` false):
the claim takes no job of a paused queue.

``dibs_schema`` records which migrations have run. :func:`migrate` runs the missing ones in order;
``dibs init`` calls it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dibs.dialects import backend_for
from dibs.dialects.base import Name
from dibs.schema.states import DEFAULT_TARGET, PENDING
from dibs.schema.types import LongText, Timestamp

JOBS = "dibs_jobs"
JOB_PARENTS = "dibs_job_parents"
OUTBOX = "dibs_outbox"
PERIODIC = "dibs_periodic"
WORKERS = "dibs_workers"
QUEUES = "dibs_queues"
SCHEMA = "dibs_schema"
#: The longest message a job's progress may carry.
PROGRESS_MESSAGE_LIMIT = 200

metadata = sa.MetaData()

jobs = sa.Table(
    JOBS,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("task", Name(200), nullable=False),
    sa.Column("queue", Name(100), nullable=False),
    sa.Column("args", LongText, nullable=False),
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
    sa.Column("last_error", LongText, nullable=True),
    # The JSON of what the task returned, when it succeeded and returned something other than None.
    sa.Column("result", LongText, nullable=True),
    # True while jobs enqueued after this one wait for it to finish: once it did, they are settled (queued,
    # or cancelled) and the flag cleared. Upkeep reads the finished jobs that still have it (a few).
    sa.Column("has_children", sa.Boolean, nullable=False, server_default=sa.false()),
    # For a job enqueued after others: "cancel" (the default) or "run" when a parent dies or is cancelled,
    # and how many of its parents have not finished yet (it is queued when none is left).
    sa.Column("on_parent_failure", Name(16), nullable=True),
    sa.Column("parents_left", sa.Integer, nullable=True),
    # What the task last reported of how far it has got, 0 to 1, and its message; written while it runs, at
    # most once a second, by the worker that holds its lease.
    sa.Column("progress", sa.Double, nullable=True),
    sa.Column("progress_message", Name(PROGRESS_MESSAGE_LIMIT), nullable=True),
    # The enqueuer's trace context as JSON (W3C traceparent and tracestate), when it enqueued inside a trace.
    sa.Column("headers", sa.Text, nullable=True),
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

# Finished jobs whose waiting children are not settled yet (upkeep's backstop reads these only).
_partial("dibs_jobs_children", [jobs.c.id], "has_children", [jobs.c.has_children])

# Which jobs a job waits for, in the order given to enqueue(after=...).
job_parents = sa.Table(
    JOB_PARENTS,
    metadata,
    sa.Column("child_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("parent_id", sa.BigInteger, nullable=False),
    # Whether the child has counted this parent's finish: counting is done once per edge, however many
    # times the parent's children are settled.
    sa.Column("settled", sa.Boolean, nullable=False, server_default=sa.false()),
)
sa.Index("dibs_job_parents_parent", job_parents.c.parent_id)

outbox = sa.Table(
    OUTBOX,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    # The broker (or relay) the event is meant for: relays take the events of their target only.
    sa.Column("target", Name(100), nullable=False, server_default=DEFAULT_TARGET),
    sa.Column("aggregate_type", Name(200), nullable=False),
    sa.Column("aggregate_id", Name(200), nullable=False),
    sa.Column("event_type", Name(200), nullable=False),
    sa.Column("payload", LongText, nullable=False),
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
    sa.Column("last_error", LongText, nullable=True),
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
    # A paused schedule enqueues nothing: workers move its next slot on past each slot that comes.
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
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
    sa.Column("queues", LongText, nullable=False),
    sa.Column("tasks", LongText, nullable=False),
    sa.Column("tags", LongText, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    sa.Column("lease_seconds", sa.Double, nullable=False),
    sa.Column("started_at", Timestamp, nullable=False),
    sa.Column("last_heartbeat", Timestamp, nullable=False),
)
#: A worker whose heartbeat is older than this many of its leases is dead: its row is ignored and removed.
DEAD_AFTER_LEASES = 3

# Paused queues. The claim's WHERE reads this table by primary key, so a pause holds for every worker from
# its next claim, and a resume from the next claim after it.
queues = sa.Table(
    QUEUES,
    metadata,
    sa.Column("name", Name(100), primary_key=True),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

schema_versions = sa.Table(
    SCHEMA,
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", Timestamp, nullable=False),
)
