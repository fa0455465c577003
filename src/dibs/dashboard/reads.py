"""What the dashboard's pages read: each a query that an index answers, however many jobs the table holds.

Lists are pages of a keyset (``id < last id seen``, newest first), never ``OFFSET``; no page counts every row
of a filter. No index can find text inside the arguments, so a search for it reads a window of the newest
:data:`SEARCH_WINDOW` ids below where its page starts, a range of the primary key, and says which; the
next window is a page of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs.dialects import backend_for
from dibs.dialects.base import inline
from dibs.engine import connected
from dibs.schema import DEAD, FINISHED, LIVE, QUEUED, RUNNING, STATES, SUCCEEDED, aware, job_parents, jobs

#: Jobs on one page of the list.
PAGE = 50
#: The throughput chart: this many bars over the last hour.
BUCKETS = 12
#: Children listed on a job's page (a fan-out may have thousands).
FAMILY_LIMIT = 100
#: Ids one search for text in the arguments reads: the newest this many below where its page starts.
SEARCH_WINDOW = 100_000


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    """The filters of the jobs page; empty ones filter nothing."""

    status: str = ""
    queue: str = ""
    task: str = ""
    #: A live job's dedupe or ordering key.
    key: str = ""
    #: Text the job's arguments (as stored JSON) contain.
    text: str = ""

    def where(self) -> list[sa.ColumnElement[bool]]:
        """The filter as conditions on the jobs table."""
        conditions: list[sa.ColumnElement[bool]] = []
        if self.status in STATES:
            conditions.append(jobs.c.status == self.status)
        if self.queue:
            conditions.append(jobs.c.queue == self.queue)
        if self.task:
            conditions.append(jobs.c.task == self.task)
        if self.key:
            # Each side repeats its partial index's condition: keys are looked up in those indexes, so a
            # key finds live jobs (a dedupe key is cleared when its job finishes anyway).
            live = jobs.c.status.in_([inline(state) for state in LIVE])
            conditions.append(
                sa.or_(
                    sa.and_(jobs.c.dedupe_key.is_not(None), jobs.c.dedupe_key == self.key),
                    sa.and_(live, jobs.c.ordering_key.is_not(None), jobs.c.ordering_key == self.key),
                )
            )
        if self.text:
            conditions.append(jobs.c.args.contains(self.text, autoescape=True))
        return conditions

    def query(self) -> dict[str, str]:
        """The filter as URL query parameters (empty ones left out)."""
        return {name: value for name, value in vars(self).items() if value}


@dataclass(frozen=True, kw_only=True)
class SearchWindow:
    """The ids a search for text in the arguments read, and where the next window starts, if older jobs are
    left to search."""

    lowest: int
    highest: int
    further: int | None


@dataclass(frozen=True, kw_only=True)
class JobPage:
    """One page of the jobs list."""

    rows: list[Any]
    #: The id to pass as ``before`` for the next page of matches (None: this window or table has no more).
    next_before: int | None
    #: For a search for text in the arguments: the window of ids it read.
    searched: SearchWindow | None = None


def job_page(engine: Engine, chosen: JobFilter, before: int | None, window: int | None = None) -> JobPage:
    """One page of jobs matching the filter, newest first, older than job ``before``. A search for text in
    the arguments reads the ``window`` (default :data:`SEARCH_WINDOW`) newest ids below ``before`` only."""
    query = (
        sa.select(
            jobs.c.id,
            jobs.c.task,
            jobs.c.queue,
            jobs.c.status,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.run_at,
            jobs.c.last_error,
        )
        .where(*chosen.where())
        .order_by(jobs.c.id.desc())
        .limit(PAGE + 1)
    )
    with connected(engine) as conn:
        top = before
        if chosen.text and top is None:
            top = (conn.execute(sa.select(sa.func.max(jobs.c.id))).scalar() or 0) + 1
        if top is not None:
            query = query.where(jobs.c.id < top)
        if chosen.text and top is not None:
            lowest = max(top - (window or SEARCH_WINDOW), 1)
            query = query.where(jobs.c.id >= lowest)
        rows = list(conn.execute(query).all())
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        if not chosen.text or top is None or top <= 1 or more:
            return JobPage(rows=rows, next_before=rows[-1].id if more else None)
        older = conn.execute(sa.select(jobs.c.id).where(jobs.c.id < lowest).order_by(jobs.c.id.desc()).limit(1))
        further = lowest if older.first() is not None else None
    return JobPage(rows=rows, next_before=None, searched=SearchWindow(lowest=lowest, highest=top - 1, further=further))


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """Jobs finished over the last hour, in equal buckets, oldest first."""

    starts: list[datetime]
    succeeded: list[int]
    failed: list[int]

    def most(self) -> int:
        """The highest bar, at least 1 (the chart's scale)."""
        return max([1, *self.succeeded, *self.failed])


def throughput(engine: Engine) -> Throughput:
    """Succeeded and dead jobs per bucket of the last hour: a range of the finished-jobs index each."""
    backend = backend_for(engine.dialect)
    with connected(engine) as conn:
        now = aware(conn.execute(sa.select(backend.now())).scalar_one())
        width = timedelta(hours=1) / BUCKETS
        starts = [now - width * (BUCKETS - index) for index in range(BUCKETS)]

        def count(state: str, start: datetime) -> sa.ScalarSelect[int]:
            return (
                sa.select(sa.func.count())
                .select_from(jobs)
                .where(_finished(), jobs.c.status == inline(state))
                .where(jobs.c.finished_at >= start, jobs.c.finished_at < start + width)
                .scalar_subquery()
            )

        row = conn.execute(sa.select(*(count(state, start) for state in (SUCCEEDED, DEAD) for start in starts))).one()
    return Throughput(starts=starts, succeeded=list(row[:BUCKETS]), failed=list(row[BUCKETS:]))


def _finished() -> sa.ColumnElement[bool]:
    """The finished-jobs index's own condition, written as it is: SQLite reads a partial index only for a
    query that repeats it."""
    return jobs.c.status.in_([inline(state) for state in FINISHED])


@dataclass(frozen=True, kw_only=True)
class QueueLine:
    """One queue on the overview: its live jobs per state (exact) and how long its oldest ready job has
    waited."""

    queue: str
    counts: dict[str, int]
    oldest_ready_seconds: float | None


def queue_lines(engine: Engine) -> list[QueueLine]:
    """Every queue with live jobs, by name.

    Finished jobs are not counted per queue: that would read millions of rows, where these read the live
    jobs' partial indexes only (the throughput chart counts the last hour's finished jobs instead)."""
    backend = backend_for(engine.dialect)
    counts: dict[str, dict[str, int]] = {}
    with connected(engine) as conn:
        now = aware(conn.execute(sa.select(backend.now())).scalar_one())
        for state in LIVE:
            live = sa.select(jobs.c.queue, sa.func.count()).where(jobs.c.status == inline(state))
            if state == RUNNING:  # the expiry index's condition: a running job always holds a lease
                live = live.where(jobs.c.lease_expires_at.is_not(None))
            live = live.group_by(jobs.c.queue)
            for queue, count in conn.execute(live):
                counts.setdefault(queue, dict.fromkeys(LIVE, 0))[state] = count
        oldest = sa.select(jobs.c.queue, sa.func.min(jobs.c.run_at)).where(jobs.c.status == inline(QUEUED))
        ready = dict(conn.execute(oldest.group_by(jobs.c.queue)).all())
    return [
        QueueLine(
            queue=queue,
            counts=counts[queue],
            oldest_ready_seconds=max(0.0, (now - aware(ready[queue])).total_seconds()) if ready.get(queue) else None,
        )
        for queue in sorted(counts)
    ]


def running_per_worker(engine: Engine) -> dict[str, int]:
    """How many jobs each worker (by name, its lease owner) runs now, from the expiry index."""
    query = (
        sa.select(jobs.c.lease_owner, sa.func.count())
        .where(jobs.c.status == inline(RUNNING), jobs.c.lease_expires_at.is_not(None))
        .group_by(jobs.c.lease_owner)
    )
    with connected(engine) as conn:
        return {owner: count for owner, count in conn.execute(query) if owner is not None}


@dataclass(frozen=True, kw_only=True)
class Relative:
    """A job a job waits for, or one that waits for it; a purged one has no task or status left."""

    id: int
    task: str | None
    status: str | None


@dataclass(frozen=True, kw_only=True)
class Family:
    """The jobs a job waits for (in the order given to ``after=``) and the first of those waiting for it."""

    parents: list[Relative]
    children: list[Relative]
    #: Whether more children wait than are listed.
    more_children: bool


def job_family(engine: Engine, job_id: int) -> Family:
    """A job's parents, by the links' primary key, and children, by the index on the parent."""
    parents = (
        sa.select(job_parents.c.parent_id, jobs.c.task, jobs.c.status)
        .select_from(job_parents.outerjoin(jobs, jobs.c.id == job_parents.c.parent_id))
        .where(job_parents.c.child_id == job_id)
        .order_by(job_parents.c.position)
    )
    children = (
        sa.select(job_parents.c.child_id, jobs.c.task, jobs.c.status)
        .select_from(job_parents.outerjoin(jobs, jobs.c.id == job_parents.c.child_id))
        .where(job_parents.c.parent_id == job_id)
        .order_by(job_parents.c.child_id)
        .limit(FAMILY_LIMIT + 1)
    )
    with connected(engine) as conn:
        found = [
            [Relative(id=row[0], task=row[1], status=row[2]) for row in conn.execute(query)]
            for query in (parents, children)
        ]
    return Family(parents=found[0], children=found[1][:FAMILY_LIMIT], more_children=len(found[1]) > FAMILY_LIMIT)
