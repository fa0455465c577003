"""Jobs that wait for other jobs: linking a child to its parents, and settling children once parents finish.

A job enqueued ``after=[...]`` is inserted ``waiting`` with one ``dibs_job_parents`` row per parent, a
count of parents left, and each parent gets ``has_children``. When a parent finishes, its children are
*settled*: each counts the parent once (the edge is marked), a child with no parent left is queued (or
scheduled, if its own time has not come), and a child with a dead or cancelled parent is cancelled with
the reason (unless ``on_parent_failure="run"``), its own children settled in turn. Then the parent's
flag is cleared. The cost is per parent and child, never per parent times parents: a fan-in of
thousands counts down.

Settling is idempotent (an edge is counted once) and locks the children's rows before it reads their
edges, so counts of one child take turns. The worker that records a parent's success settles its
children right after; upkeep settles those of finished jobs whose flag is still set (a worker that died
in between, a parent that gained a child while it ran, a parent that died of an expired lease or was
cancelled by hand). Nothing ever looks at all waiting jobs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dibs._errors import InvalidArgument
from dibs.dialects import backend_for
from dibs.schema import (
    CANCEL_ON_PARENT_FAILURE,
    CANCELLED,
    FINISHED,
    QUEUED,
    SCHEDULED,
    SUCCEEDED,
    WAITING,
    job_parents,
    jobs,
)

#: Ids per statement.
CHUNK = 1000


def _chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    for start in range(0, len(ids), CHUNK):
        yield ids[start : start + CHUNK]


def parent_ids(after: Iterable[Any]) -> tuple[int, ...]:
    """The ids of ``after=``: jobs or ids, each once, in order; InvalidArgument for anything else."""
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise InvalidArgument(f"after must be a list of jobs or job ids, got {after!r}")
    found: dict[int, None] = {}
    for parent in after:
        job_id = getattr(parent, "id", parent)
        if type(job_id) is not int or job_id < 1:
            raise InvalidArgument(f"after must hold jobs or positive job ids, got {parent!r}")
        found[job_id] = None
    if not found:
        raise InvalidArgument("after is empty; leave it out for a job that waits for nothing")
    return tuple(found)


def link(conn: Connection, children: Sequence[tuple[int, Sequence[int]]]) -> None:
    """Record which parents each new (waiting) child waits for, flag the parents, and count those finished
    already; in ``conn``'s transaction. InvalidArgument if a parent does not exist."""
    wanted = sorted({parent for _, parents in children for parent in parents})
    existing: set[int] = set()
    for chunk in _chunks(wanted):
        existing.update(conn.execute(sa.select(jobs.c.id).where(jobs.c.id.in_(chunk))).scalars())
    missing = [parent for parent in wanted if parent not in existing]
    if missing:
        raise InvalidArgument(
            f"after names jobs that do not exist: {', '.join(map(str, missing[:10]))}; nothing was enqueued"
        )
    conn.execute(
        job_parents.insert(),
        [
            {"child_id": child, "position": position, "parent_id": parent}
            for child, parents in children
            for position, parent in enumerate(parents)
        ],
    )
    for child, parents in children:
        conn.execute(sa.update(jobs).where(jobs.c.id == child).values(parents_left=len(parents)))
    # Every parent is flagged, finished or not: in a caller's snapshot a parent may look unfinished that
    # finished meanwhile, and the flag makes upkeep settle its children once more.
    for chunk in _chunks(wanted):
        conn.execute(sa.update(jobs).where(jobs.c.id.in_(chunk)).values(has_children=True))
    _count(conn, wanted, [child for child, _ in children])


def wait_again(conn: Connection, child: int) -> list[int]:
    """Make a job just queued again by a retry wait once more for those of its parents that have not
    finished, in ``conn``'s transaction; returns them (none: it stays queued). Its edges are counted
    afresh: those of finished (or purged) parents as settled, the others not, and those parents flagged
    where they are not. A parent that finishes before this commits may not see the job waiting: the caller
    settles these parents again once it has committed."""
    edges = conn.execute(
        sa.select(job_parents.c.parent_id, jobs.c.status)
        .select_from(job_parents.outerjoin(jobs, jobs.c.id == job_parents.c.parent_id))
        .where(job_parents.c.child_id == child)
    ).all()
    unfinished = sorted(parent for parent, status in edges if status is not None and status not in FINISHED)
    if not edges:
        return []
    mine = job_parents.c.child_id == child
    conn.execute(sa.update(job_parents).where(mine).values(settled=True))
    if not unfinished:
        return []
    conn.execute(sa.update(job_parents).where(mine, job_parents.c.parent_id.in_(unfinished)).values(settled=False))
    conn.execute(sa.update(jobs).where(jobs.c.id == child).values(status=WAITING, parents_left=len(unfinished)))
    # Only where unset: a parent whose flag is set may be finishing, and its row is then not waited for.
    conn.execute(
        sa.update(jobs).where(jobs.c.id.in_(unfinished), jobs.c.has_children.is_(False)).values(has_children=True)
    )
    return unfinished


def forget_parents(conn: Connection, children: Sequence[int]) -> None:
    """Delete the links of these (purged) jobs to the jobs they waited for; in ``conn``'s transaction."""
    for chunk in _chunks(children):
        conn.execute(sa.delete(job_parents).where(job_parents.c.child_id.in_(chunk)))


def settle_children(conn: Connection, parents: Sequence[int]) -> list[int]:
    """Count these finished jobs as done for the children waiting for them (once per child and parent),
    queue or cancel the children that wait no more, then clear the parents' flag; in ``conn``'s
    transaction. Children cancelled here have their own children settled too. Returns the cancelled."""
    every_cancelled: list[int] = []
    while parents:
        children: set[int] = set()
        for chunk in _chunks(parents):
            children.update(
                conn.execute(
                    sa.select(job_parents.c.child_id).where(
                        job_parents.c.parent_id.in_(chunk), job_parents.c.settled.is_(False)
                    )
                ).scalars()
            )
        cancelled = _count(conn, parents, sorted(children))
        for chunk in _chunks(parents):
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id.in_(chunk), jobs.c.has_children.is_(True), jobs.c.status.in_(FINISHED))
                .values(has_children=False)
            )
        every_cancelled.extend(cancelled)
        parents = cancelled
    return every_cancelled


def _count(conn: Connection, parents: Sequence[int], children: Sequence[int]) -> list[int]:
    """Count the finished ones of ``parents`` for these waiting ``children``; returns the children cancelled."""
    cancelled: list[int] = []
    for parent_chunk in _chunks(parents):
        for chunk in _chunks(children):
            cancelled.extend(_count_chunk(conn, parent_chunk, chunk))
    return cancelled


def _count_chunk(conn: Connection, parents: Sequence[int], children: Sequence[int]) -> list[int]:
    # The children are locked first: counts for one child take turns, and each reads the edges after the
    # one before it marked its own.
    waiting = dict(
        conn.execute(
            sa.select(jobs.c.id, jobs.c.on_parent_failure)
            .where(jobs.c.id.in_(children), jobs.c.status == WAITING)
            .with_for_update()
        ).all()
    )
    if not waiting:
        return []
    parent = jobs.alias("dibs_parent")
    edges = conn.execute(
        sa.select(job_parents.c.child_id, job_parents.c.parent_id, parent.c.status)
        .join(parent, parent.c.id == job_parents.c.parent_id)
        .where(
            job_parents.c.parent_id.in_(parents),
            job_parents.c.child_id.in_(list(waiting)),
            job_parents.c.settled.is_(False),
            parent.c.status.in_(FINISHED),
        )
    ).all()
    if not edges:
        return []
    counted: dict[int, int] = {}
    failed: dict[int, int] = {}
    for child, parent_id, status in edges:
        counted[child] = counted.get(child, 0) + 1
        if status != SUCCEEDED:
            failed.setdefault(child, parent_id)
        conn.execute(
            sa.update(job_parents)
            .where(job_parents.c.child_id == child, job_parents.c.parent_id == parent_id)
            .values(settled=True)
        )
    return _decide(conn, waiting, counted, failed)


def _decide(
    conn: Connection, waiting: dict[int, str | None], counted: dict[int, int], failed: dict[int, int]
) -> list[int]:
    """Lower the children's counts; queue those with none left, cancel those a failed parent dooms."""
    backend = backend_for(conn.dialect)
    due = sa.case((jobs.c.run_at <= backend.now(), QUEUED), else_=SCHEDULED)
    doomed: list[int] = []
    for child, count in counted.items():
        left = jobs.c.parents_left - count
        if child in failed and (waiting[child] or CANCEL_ON_PARENT_FAILURE) == CANCEL_ON_PARENT_FAILURE:
            reason = f"job {failed[child]}, which this job waited for, did not succeed; cancelled without running"
            values: dict[Any, Any] = {
                jobs.c.parents_left: left,
                jobs.c.status: CANCELLED,
                jobs.c.finished_at: backend.now(),
                jobs.c.dedupe_key: None,
                jobs.c.last_error: reason,
            }
            doomed.append(child)
        else:
            values = {jobs.c.parents_left: left, jobs.c.status: sa.case((left <= 0, due), else_=WAITING)}
        conn.execute(sa.update(jobs).where(jobs.c.id == child, jobs.c.status == WAITING).values(values))
    return doomed


def parent_results(conn: Connection, child: int) -> list[Any]:
    """The results of the jobs ``child`` waited for, in the order they were given (None for a parent that
    returned None, did not succeed, or was purged)."""
    rows = conn.execute(
        sa.select(jobs.c.status, jobs.c.result)
        .select_from(job_parents.outerjoin(jobs, jobs.c.id == job_parents.c.parent_id))
        .where(job_parents.c.child_id == child)
        .order_by(job_parents.c.position)
    ).all()
    return [json.loads(result) if status == SUCCEEDED and result is not None else None for status, result in rows]


def unsettled_parents(conn: Connection, limit: int) -> list[int]:
    """Finished jobs whose children were not settled yet (read from an index that holds only flagged jobs)."""
    return list(
        conn.execute(
            # As the partial index says it: SQLite uses one only for a condition written as in its definition.
            sa.select(jobs.c.id).where(sa.text("has_children"), jobs.c.status.in_(FINISHED)).limit(limit)
        ).scalars()
    )
