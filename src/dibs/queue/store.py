"""The job queue's reads and writes, all through claim and fenced leases.

* claim: queued jobs of the worker's queues, tasks and tags, highest priority first, then by run time
  and enqueue order; of the live jobs sharing an ordering key only the oldest is eligible, so jobs of
  one key run one at a time, in enqueue order.
  No job of a paused queue is claimed.
* finish: succeeded, retry (back to ``scheduled`` with a new run time), dead, or cancelled, each a
  token-fenced lease write, batched.
* upkeep, apart from the claim: expired leases (a crashed worker) go back to queued, or to dead after
  their last attempt; promoting scheduled jobs, purging and the probes of a burst's end are in
  :mod:`dibs.queue.maintenance`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._checks import ERROR_LIMIT
from dibs.dialects import backend_for, driver
from dibs.dialects.base import inline
from dibs.engine import connected, writing
from dibs.lease import Claimer, Lease, Leases
from dibs.queue.dependencies import parent_results, settle_children, unsettled_parents
from dibs.queue.maintenance import WorkLeft, promote_due, purge, purgeable, queue_paused, work_left
from dibs.queue.results import FINISHED_CHANNEL, RESULT_WRITE, finished_payload, keyed_results
from dibs.schema import (
    DEAD,
    FINISHED,
    LIVE,
    QUEUED,
    RUNNING,
    SCHEDULED,
    SUCCEEDED,
    jobs,
)

RETRY_DELAY = "dibs_retry_delay"
# A running job's progress, fenced by its lease: a worker that lost the lease, or a job that ended, is left as is.
_PROGRESS = (
    sa.update(jobs)
    .where(
        jobs.c.id == sa.bindparam("dibs_id"),
        jobs.c.lease_token == sa.bindparam("dibs_token"),
        jobs.c.status == inline(RUNNING),
    )
    .values(progress=sa.bindparam("dibs_progress"), progress_message=sa.bindparam("dibs_message"))
)
UPKEEP_BATCH = 1000

leases = Leases(
    jobs,
    ready=QUEUED,
    running=RUNNING,
    done=SUCCEEDED,
    failed=DEAD,
    reclaim_expired=False,
    finished_at="finished_at",
)


def _key_taken() -> sa.ColumnElement[bool]:
    """Whether another job with the same ordering key runs now, or waits ahead of this one (enqueued
    before it). Jobs of one key then run one at a time, in enqueue order; a job committed late (by a
    long transaction) waits for the one running, and may run after jobs enqueued after it.

    The states are written into the statement, not bound: SQLite uses a partial index only when the
    query repeats its condition with the same literals; with bound states it scanned the whole table
    for every candidate job that has a key (a claim of 100 such jobs at 100,000 rows: 1.4 s, now 8 ms)."""
    other = jobs.alias("dibs_other")
    return sa.exists(
        sa.select(other.c.id).where(
            other.c.ordering_key == jobs.c.ordering_key,
            other.c.id != jobs.c.id,
            other.c.status.in_([inline(state) for state in LIVE]),
            sa.or_(other.c.status == inline(RUNNING), other.c.id < jobs.c.id),
        )
    )


#: The columns of a claimed job's row, in order: the lease's own (key, token, expiry), what the worker reads
#: (decoding the other columns cost more than the claim), and the order's columns (returned, the claim
#: sorts its rows itself instead of having the database join them back to the picked order, on
#: PostgreSQL, or pick them in a statement of their own, on SQLite).
CLAIMED = (
    jobs.c.id,
    jobs.c.lease_token,
    jobs.c.lease_expires_at,
    jobs.c.task,
    jobs.c.args,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.priority,
    jobs.c.run_at,
    jobs.c.has_children,
    jobs.c.on_parent_failure,
    jobs.c.queue,
    jobs.c.headers,
)
#: Where the worker finds what it reads in a claimed job's row (by position: a row's mapping costs more
#: than the rest of a no-op job's bookkeeping).
_CLAIMED_NAMES = [column.name for column in CLAIMED]
ID_AT, TASK_AT, ARGS_AT, ATTEMPTS_AT, HAS_CHILDREN_AT, HAS_PARENTS_AT, QUEUE_AT, HEADERS_AT = (
    _CLAIMED_NAMES.index(name)
    for name in ("id", "task", "args", "attempts", "has_children", "on_parent_failure", "queue", "headers")
)


class JobStore:
    """The queue's statements for one engine.

    Args:
        engine: The database of the jobs.
        announce: Whether finished jobs are announced to those waiting for their results, where the
            database has notifications.
    """

    def __init__(self, engine: Engine, *, announce: bool = True) -> None:
        self.engine = engine
        self.backend = backend_for(engine.dialect)
        self._claimers: dict[tuple[tuple[str, ...], ...], Claimer] = {}
        # Made once: a lease write is built and compiled once per expression it holds.
        self._retry_at = self.backend.after(RETRY_DELAY)
        self._announce = self.backend.notify(FINISHED_CHANNEL) if announce else None
        # Where a completion can announce its jobs itself (PostgreSQL): the NULL their dedupe keys are cleared to,
        # which saves the announcement's own statement, and its commit, per batch of completions.
        self._cleared_announcing = self.backend.announcing(FINISHED_CHANNEL) if announce else None
        # Where the database can look each row's result up in one bound object: the completion sets them.
        self._keyed_result = self.backend.keyed_text("dibs_results", jobs.c.id)

    # -- claim -------------------------------------------------------------------------------------

    def claim(
        self,
        conn: Engine | Connection,
        *,
        owner: str,
        lease_seconds: float,
        limit: int,
        queues: Sequence[str],
        tasks: Sequence[str],
        tags: Sequence[str],
    ) -> list[Lease]:
        """Lease up to ``limit`` runnable jobs."""
        return self._claimer(tuple(queues), tuple(tasks), tuple(tags)).claim(
            conn, owner=owner, duration=lease_seconds, limit=limit
        )

    def _claimer(self, queues: tuple[str, ...], tasks: tuple[str, ...], tags: tuple[str, ...]) -> Claimer:
        """The claim of one worker's queues, tasks and tags, built once.

        They are written into the statement (they are checked names), not bound: a worker claims with the
        same ones all its life, so its statement stays the same and runs compiled once on the driver, and
        the planner sees them (one queue is ``queue = 'name'``, and the claim index is read in claim
        order: a list bound as one parameter would have it sort every queued job of the queue instead).
        """
        wanted = (queues, tasks, tags)
        claimer = self._claimers.get(wanted)
        if claimer is not None:
            return claimer
        if len(self._claimers) >= 64:  # a long-lived process asking for ever new combinations
            self._claimers.clear()
        tagged = jobs.c.tag.in_([inline(tag) for tag in tags]) if tags else sa.false()
        claimer = self._claimers[wanted] = leases.claimer(
            where=[
                jobs.c.queue.in_([inline(queue) for queue in queues]),
                jobs.c.task.in_([inline(task) for task in tasks]),
                sa.or_(jobs.c.tag.is_(None), tagged),
                sa.or_(jobs.c.ordering_key.is_(None), ~_key_taken()),
                ~queue_paused(),
            ],
            order_by=[jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id],
            set={jobs.c.started_at: self.backend.now()},
            columns=CLAIMED,
        )
        return claimer

    # -- finish ------------------------------------------------------------------------------------

    def succeed(
        self, conn: Engine | Connection, claimed: Sequence[Lease], results: Sequence[tuple[Lease, str]] = ()
    ) -> list[Lease]:
        """Mark jobs succeeded, with the JSON ``results`` of those that returned a value, and announce them;
        returns the leases that were lost (those writes changed nothing).

        One fenced statement, setting the results too where the backend looks them up by key (PostgreSQL);
        elsewhere they go first, in one executemany, in its transaction, each fenced by its lease."""
        with connected(conn) as connection:
            if not results or self._keyed_result is not None:
                lost = self._finished(connection, claimed, results)
            else:
                with self.backend.transaction(connection):
                    lost = self._finished(connection, claimed, results)
            if self._cleared_announcing is None:
                self._announced(connection, claimed, lost)
        return lost

    def _finished(
        self, connection: Connection, claimed: Sequence[Lease], results: Sequence[tuple[Lease, str]]
    ) -> list[Lease]:
        """Write the results, then mark the jobs succeeded, all fenced, in ``connection``'s transaction (or,
        with no results, the one the lease write opens); returns the leases lost."""
        done: dict[Any, Any] = {jobs.c.dedupe_key: None}
        parameters: dict[str, Any] = {}
        if self._cleared_announcing is not None:
            # Every job of the batch is named: a waiter for one whose lease was lost looks, and waits on.
            done[jobs.c.dedupe_key] = self._cleared_announcing
            parameters["dibs_payload"] = finished_payload([lease.key[0] for lease in claimed])
        if results and self._keyed_result is not None:
            done[jobs.c.result] = self._keyed_result
            parameters["dibs_results"] = keyed_results(results)
        elif results:
            kept = [{"dibs_job": held.key[0], "dibs_token": held.token, "dibs_result": text} for held, text in results]
            connection.execute(RESULT_WRITE, kept)
        return leases.complete_many(connection, claimed, status=SUCCEEDED, set=done, parameters=parameters)

    def succeed_in(self, conn: Connection, lease: Lease, result: str | None) -> bool:
        """In ``conn``'s open transaction: mark the job succeeded with the JSON of its result, fenced by its
        lease, settle the jobs waiting for it and announce it (on commit); False if the lease was lost."""
        if self._finished(conn, [lease], [] if result is None else [(lease, result)]):
            return False
        if lease.row[HAS_CHILDREN_AT]:
            settle_children(conn, [lease.key[0]])
        if self._cleared_announcing is None:
            self._announce_in(conn, [lease.key[0]])
        return True

    def announce(self, conn: Engine | Connection, ids: Sequence[int]) -> None:
        """Tell those waiting for the results of these jobs that they finished (where the database can)."""
        if self._announce is None or not ids:
            return
        with connected(conn) as connection, self.backend.one_statement(connection, owned=isinstance(conn, Engine)):
            self._announce_in(connection, ids)

    def _announce_in(self, connection: Connection, ids: Sequence[int]) -> None:
        """The announcement of these finished jobs, in ``connection``'s transaction (sent when it commits)."""
        if self._announce is not None and ids:
            driver.execute(connection, self._announce, {"dibs_payload": finished_payload(ids)})

    def _announced(self, conn: Connection, finished: Sequence[Lease], lost: Sequence[Lease]) -> None:
        if self._announce is None:
            return
        if lost:
            gone = {(lease.key, lease.token) for lease in lost}
            finished = [lease for lease in finished if (lease.key, lease.token) not in gone]
        # The finish is written: a failed announcement must not make it look unwritten (waiters poll anyway).
        with contextlib.suppress(sa.exc.DBAPIError):
            self.announce(conn, [lease.key[0] for lease in finished])

    def retry(self, conn: Engine | Connection, lease: Lease, delay: timedelta, error: str) -> bool:
        """Schedule the job again ``delay`` from now on the database clock; False if the lease was lost."""
        lost = leases.fail_many(
            conn,
            [lease],
            status=SCHEDULED,
            set={jobs.c.run_at: self._retry_at, jobs.c.last_error: error[:ERROR_LIMIT]},
            parameters={RETRY_DELAY: self.backend.after_value(delay.total_seconds())},
        )
        return not lost

    def bury(self, conn: Engine | Connection, lease: Lease, error: str, status: str = DEAD) -> bool:
        """Finish the job as dead (or cancelled) with its error kept, and announce it; False if the lease was
        lost."""
        with connected(conn) as connection:
            lost = leases.fail_many(
                connection,
                [lease],
                status=status,
                set={jobs.c.last_error: error[:ERROR_LIMIT], jobs.c.dedupe_key: None},
            )
            self._announced(connection, [lease], lost)
        return not lost

    def renew(self, conn: Engine | Connection, claimed: Sequence[Lease], lease_seconds: float) -> list[Lease]:
        """Extend leases; returns those lost."""
        return leases.renew_many(conn, claimed, lease_seconds)

    def release(self, conn: Engine | Connection, claimed: Sequence[Lease]) -> list[Lease]:
        """Give back unstarted jobs, queued again at once with the attempt not counted."""
        return leases.release_many(conn, claimed)

    def write_progress(self, engine: Engine, reports: Sequence[tuple[Lease, float, str | None]]) -> None:
        """Record the latest progress of running jobs (lease, fraction, message), all in one transaction."""
        if not reports:
            return
        # In id order, as other writes lock their rows: two transactions that lock the same rows in opposite
        # orders can deadlock.
        rows = [
            {"dibs_id": lease.key[0], "dibs_token": lease.token, "dibs_progress": done, "dibs_message": message}
            for lease, done, message in sorted(reports, key=lambda report: report[0].key)
        ]
        with writing(engine) as conn:
            conn.execute(_PROGRESS, rows)

    def cancel_requests(self, conn: Engine | Connection, ids: Iterable[int]) -> set[int]:
        """Which of these running jobs someone asked to cancel."""
        wanted = list(ids)
        if not wanted:
            return set()
        query = sa.select(jobs.c.id).where(jobs.c.id.in_(wanted), jobs.c.cancel_requested.is_(True))
        with connected(conn) as reader:
            return set(reader.execute(query).scalars())

    def work_left(
        self, conn: Engine | Connection, queues: Sequence[str], tasks: Sequence[str], tags: Sequence[str] = ()
    ) -> WorkLeft:
        """Whether any job of these queues and tasks, untagged or of these tags, is queued, scheduled or
        running (see :func:`~dibs.queue.maintenance.work_left`)."""
        return work_left(conn, queues, tasks, tags)

    # -- upkeep ------------------------------------------------------------------------------------

    def promote_due(self, conn: Engine | Connection, limit: int = UPKEEP_BATCH) -> int:
        """Scheduled jobs whose run time has come on the database clock become queued; returns how many."""
        return promote_due(conn, self.backend, limit)

    def gather_first_statistics(self, conn: Engine | Connection) -> bool:
        """Analyze the jobs table if the database never has and it has grown; True once nothing is left to do
        (see :mod:`dibs.dialects.statistics`)."""
        with connected(conn) as connection:
            return self.backend.gather_first_statistics(connection, jobs)

    def settle_children(self, conn: Engine | Connection, parents: Sequence[int]) -> None:
        """Queue or cancel the waiting children of these finished jobs, in one transaction of its own, and
        announce the cancelled."""
        if not parents:
            return
        with connected(conn) as connection:
            with self.backend.transaction(connection):
                cancelled = settle_children(connection, parents)
            with contextlib.suppress(sa.exc.DBAPIError):  # as for a finish: the waiters look again later
                self.announce(connection, cancelled)

    def parent_results(self, conn: Engine | Connection, child: int) -> list[Any]:
        """The results of the jobs ``child`` waited for, in the order given to ``after=``."""
        with connected(conn) as connection:
            return parent_results(connection, child)

    def settle_unsettled(self, conn: Engine | Connection, limit: int = UPKEEP_BATCH) -> int:
        """Settle the children of finished jobs still flagged as having some; returns how many parents."""
        with connected(conn) as connection:
            parents = unsettled_parents(connection, limit)
            if connection.in_transaction():
                connection.commit()
        self.settle_children(conn, parents)
        return len(parents)

    def recover_expired(self, conn: Engine | Connection) -> tuple[int, int]:
        """Jobs whose worker lost its lease (it crashed, or hung past it) are queued again, or dead after
        their last attempt; returns (requeued, dead)."""
        message = "the worker running this job stopped renewing its lease (it crashed or hung) on its last attempt"
        dead = leases.recover(
            conn,
            where=jobs.c.attempts >= jobs.c.max_attempts,
            status=DEAD,
            set={jobs.c.last_error: message, jobs.c.dedupe_key: None},
            batch=UPKEEP_BATCH,
        )
        # The same test again: a lease that expired between the two statements must not be queued for an
        # attempt past its last (it is buried at the next round instead).
        requeued = leases.recover(conn, where=jobs.c.attempts < jobs.c.max_attempts, status=QUEUED, batch=UPKEEP_BATCH)
        if dead:
            # Finished as a worker's dead job is: its waiting children settled and its waiters told now.
            ids = [key[0] for key in dead]
            self.settle_children(conn, ids)
            with contextlib.suppress(sa.exc.DBAPIError):
                self.announce(conn, ids)
        return len(requeued), len(dead)

    def purge(
        self, conn: Engine | Connection, older_than: timedelta, statuses: Sequence[str] = FINISHED, limit: int = 10_000
    ) -> int:
        """Delete up to ``limit`` finished jobs that finished more than ``older_than`` ago; returns how many."""
        return purge(conn, self.backend, older_than, statuses, limit)

    def purgeable(self, conn: Engine | Connection, older_than: timedelta, statuses: Sequence[str]) -> dict[str, int]:
        """How many jobs purge() with these arguments would delete, per state (states with none left out)."""
        return purgeable(conn, self.backend, older_than, statuses)


def error_text(error: BaseException, formatted: str) -> str:
    """What is kept of a failure: the exception's type and message, then the traceback."""
    return f"{type(error).__name__}: {error}\n\n{formatted}"[:ERROR_LIMIT]
