"""What upkeep and the end of a burst ask of the jobs table: which jobs are left for a worker, scheduled jobs
whose time came, and finished jobs to purge; each answered from an index however many jobs the table holds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs.claim import claim
from dibs.dialects.backend import Backend
from dibs.dialects.base import from_now, inline
from dibs.engine import connected
from dibs.queue.dependencies import forget_parents
from dibs.schema import QUEUED, RUNNING, SCHEDULED, jobs, queues


def queue_paused() -> sa.ColumnElement[bool]:
    """Whether the job's queue is paused. An IN over the paused names is read once per statement and leaves
    the claim's index scan as it was; a correlated EXISTS let PostgreSQL plan an anti-join over every queued
    job, which made a claim read the whole backlog."""
    return jobs.c.queue.in_(sa.select(queues.c.name).where(queues.c.paused.is_(True)))


class WorkLeft(NamedTuple):
    """Which jobs of a worker's queues and tasks are left: queued, scheduled (a retry waiting for its
    time), or running under a lease (in another worker, or in one that crashed, until it expires)."""

    queued: bool
    scheduled: bool
    running: bool


def work_left(
    conn: Engine | Connection, queues: Sequence[str], tasks: Sequence[str], tags: Sequence[str] = ()
) -> WorkLeft:
    """Whether any job of these queues and tasks, untagged or of these tags, is queued, scheduled or
    running (with a lease): three probes, each answered from a partial index, however many finished
    jobs the table holds (a burst worker asks this each time a claim comes back empty; counting every
    job per state read the whole table).

    Each probe asks for the first job in the order of its state's index (LIMIT 1), not whether one
    EXISTS: PostgreSQL plans an EXISTS as a scan of the whole table when its statistics, taken while a
    backlog waited, say most rows match, and the end of a drain then read every finished row at each
    look (5-40 ms at 50,000 rows); MariaDB and SQLite did the same for the queued probe. The first row
    in index order is read from the index whatever the statistics say."""
    tagged = jobs.c.tag.in_(sa.bindparam("dibs_tags", expanding=True)) if tags else sa.false()
    in_queues = sa.and_(
        jobs.c.queue.in_(sa.bindparam("dibs_queues", expanding=True)),
        jobs.c.task.in_(sa.bindparam("dibs_tasks", expanding=True)),
        sa.or_(jobs.c.tag.is_(None), tagged),
    )

    def state(name: str) -> sa.ColumnElement[bool]:
        # A literal: SQLite uses a partial index only for a query that repeats its condition as written.
        return jobs.c.status == sa.literal(name, literal_execute=True)

    def first(where: sa.ColumnElement[bool], *order: sa.ColumnElement[object]) -> sa.ColumnElement[bool]:
        return sa.select(jobs.c.id).where(where, in_queues).order_by(*order).limit(1).scalar_subquery().is_not(None)

    probes = sa.select(
        # The claim index's first column: a list of queues still reads it in order, and no database
        # sorts (MariaDB before 10.8 keeps the index's priority ascending, and sorted for the whole key).
        # A paused queue's jobs are not left for a worker: a burst ends without them.
        first(sa.and_(state(QUEUED), ~queue_paused()), jobs.c.queue),
        first(state(SCHEDULED), jobs.c.run_at),
        first(sa.and_(state(RUNNING), jobs.c.lease_expires_at.is_not(None)), jobs.c.lease_expires_at),
    )
    parameters = {"dibs_queues": list(queues), "dibs_tasks": list(tasks)}
    if tags:
        parameters["dibs_tags"] = list(tags)
    with connected(conn) as connection:
        found = connection.execute(probes, parameters).one()
    return WorkLeft(*(bool(value) for value in found))


def promote_due(conn: Engine | Connection, backend: Backend, limit: int) -> int:
    """Scheduled jobs whose run time has come on the database clock become queued; returns how many."""
    rows = claim(
        conn,
        jobs,
        where=[jobs.c.status == inline(SCHEDULED), jobs.c.run_at <= backend.now()],
        set={jobs.c.status: QUEUED},
        limit=limit,
        # In the due index's order: read from the index whatever the statistics say (see work_left).
        order_by=[jobs.c.run_at],
    )
    return len(rows)


def purge(
    conn: Engine | Connection, backend: Backend, older_than: timedelta, statuses: Sequence[str], limit: int
) -> int:
    """Delete up to ``limit`` finished jobs that finished more than ``older_than`` ago; returns how many."""
    rows = claim(conn, jobs, where=_purged(backend, older_than, statuses), delete=True, limit=limit)
    if rows:
        # The purged jobs' own links to their parents go with them; links from children to a purged
        # parent stay, since those children read its result as None.
        with connected(conn) as connection, backend.transaction(connection):
            forget_parents(connection, [row.id for row in rows])
    return len(rows)


def purgeable(
    conn: Engine | Connection, backend: Backend, older_than: timedelta, statuses: Sequence[str]
) -> dict[str, int]:
    """How many jobs purge() with these arguments would delete, per state (states with none left out)."""
    query = (
        sa.select(jobs.c.status, sa.func.count()).where(*_purged(backend, older_than, statuses)).group_by(jobs.c.status)
    )
    with connected(conn) as connection:
        return {str(state): int(count) for state, count in connection.execute(query).all()}


def _purged(backend: Backend, older_than: timedelta, statuses: Sequence[str]) -> list[sa.ColumnElement[bool]]:
    cutoff = from_now(backend, -older_than.total_seconds())
    # A job whose children were not settled yet is kept: upkeep settles them from it.
    return [jobs.c.status.in_(list(statuses)), jobs.c.finished_at < cutoff, jobs.c.has_children == sa.false()]
