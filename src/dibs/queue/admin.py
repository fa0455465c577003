"""The App's view of its jobs from outside a worker: looking them up, cancelling, retrying, purging, and
how each queue stands."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa

from dibs._checks import checked_count, checked_id, checked_seconds, checked_text
from dibs._errors import InvalidArgument, JobNotFound
from dibs.claim import claim
from dibs.dialects import backend_for
from dibs.dialects.base import from_now
from dibs.engine import connected, writing
from dibs.queue.app_base import AppBase
from dibs.queue.dependencies import wait_again
from dibs.queue.job import Job
from dibs.queue.registry import StrandedJobs, WorkerStatus, live_workers, stranded_jobs
from dibs.queue.task import TASK_NAME_LIMIT
from dibs.schema import CANCELLED, DEAD, FINISHED, QUEUED, RUNNING, SCHEDULED, STATES, WAITING, aware, jobs


@dataclass(frozen=True, kw_only=True)
class QueueStatus:
    """How one queue stands.

    Attributes:
        queue: The queue's name.
        counts: Jobs per state, every state present.
        oldest_ready_seconds: How long the oldest runnable job has waited, None when none waits.
        finished_per_second: Jobs finished per second over the last minute.
    """

    queue: str
    counts: dict[str, int]
    oldest_ready_seconds: float | None
    finished_per_second: float


def finished_states(statuses: str | Iterable[str]) -> tuple[str, ...]:
    """The finished states ``statuses`` names: one state as a str, or several; InvalidArgument for any
    other state."""
    if isinstance(statuses, str):  # one state: iterating it would give its letters
        wanted: tuple[object, ...] = (statuses,)
    elif isinstance(statuses, Iterable):
        wanted = tuple(statuses)
    else:
        raise InvalidArgument(f"statuses must be a state or a list of states, got {statuses!r}")
    wrong = [state for state in wanted if state not in FINISHED]
    if wrong:
        raise InvalidArgument(
            f"only finished jobs can be purged ({', '.join(FINISHED)}), not {sorted(map(str, wrong))}"
        )
    return tuple(dict.fromkeys(wanted))  # type: ignore[arg-type]


class Administering(AppBase):
    """The App's job inspection and administration; see :class:`dibs.App`."""

    def get(self, job_id: int) -> Job:
        """The job with this id.

        Args:
            job_id: The job's id.

        Returns:
            The job as stored now.

        Raises:
            JobNotFound: There is no such job (it may have been purged).
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        job_id = checked_id(job_id, "a job id")
        with self._tables(), connected(self.engine) as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise JobNotFound(f"there is no job {job_id} (it may have been purged)")
        return self._waited([Job.from_row(row)])[0]

    def jobs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs, newest first, filtered by state(s), queue and task name.

        Args:
            status: One state or a list of states; None for all.
            queue: Only jobs of this queue.
            task: Only jobs of this task (its full name).
            limit: The most jobs to return.

        Returns:
            The jobs, newest first.

        Raises:
            InvalidArgument: An unknown state, or a bad limit, queue or task name.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        query = sa.select(jobs).order_by(jobs.c.id.desc()).limit(checked_count(limit, "limit", minimum=0))
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            unknown = set(wanted) - set(STATES)
            if unknown:
                raise InvalidArgument(f"unknown job state {sorted(unknown)}; states are {', '.join(STATES)}")
            query = query.where(jobs.c.status.in_(wanted))
        if queue is not None:
            query = query.where(jobs.c.queue == checked_text(queue, "queue", 100))
        if task is not None:
            query = query.where(jobs.c.task == checked_text(task, "task", TASK_NAME_LIMIT))
        with self._tables(), connected(self.engine) as conn:
            return self._waited([Job.from_row(row) for row in conn.execute(query)])

    def cancel(self, job_id: int) -> Job:
        """Cancel a job: a waiting one at once; a running one is asked to stop.

        The worker running a job tells it to stop and records it cancelled when it does. A finished job is
        left as it is.

        Args:
            job_id: The job's id.

        Returns:
            The job as stored after the cancel.

        Raises:
            JobNotFound: There is no such job.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        job_id = checked_id(job_id, "a job id")
        backend = backend_for(self.engine.dialect)
        # Plain UPDATEs, which wait for a row another transaction holds, where a claim would skip it.
        waiting = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status.in_([WAITING, SCHEDULED, QUEUED]))
            .values(status=CANCELLED, finished_at=backend.now(), dedupe_key=None, last_error="cancelled before it ran")
        )
        running = sa.update(jobs).where(jobs.c.id == job_id, jobs.c.status == RUNNING).values(cancel_requested=True)
        with self._tables(), writing(self.engine) as conn:
            cancelled = conn.execute(waiting).rowcount > 0
            if not cancelled:
                conn.execute(running)
        if cancelled:
            with self._tables():
                self.store.settle_children(self.engine, [job_id])  # the jobs waiting for it are cancelled too
                self.store.announce(self.engine, [job_id])
        return self.get(job_id)

    def retry(self, job_id: int) -> Job:
        """Queue a dead or cancelled job again, with its attempts counted from zero. A job that waited for
        others (``after=``, a chain's step, a group's callback) waits again for those not finished yet.

        Args:
            job_id: The job's id.

        Returns:
            The job as queued (or waiting) again.

        Raises:
            InvalidArgument: The job is neither dead nor cancelled.
            JobNotFound: There is no such job.
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        job_id = checked_id(job_id, "a job id")
        backend = backend_for(self.engine.dialect)
        parents: list[int] = []
        with self._tables():
            rows = claim(
                self.engine,
                jobs,
                where=[jobs.c.id == job_id, jobs.c.status.in_([DEAD, CANCELLED])],
                set={
                    jobs.c.status: QUEUED,
                    jobs.c.attempts: 0,
                    jobs.c.run_at: backend.now(),
                    jobs.c.finished_at: None,
                    jobs.c.cancel_requested: False,
                },
                then=lambda conn, claimed: parents.extend(wait_again(conn, claimed[0].id)) if claimed else None,
            )
        if rows and parents:
            # Those that finished while the retry's transaction was open, counted now (idempotent).
            self.store.settle_children(self.engine, parents)
            return self._waited([self.get(job_id)])[0]
        if rows:
            return self._waited([Job.from_row(rows[0])])[0]
        job = self.get(job_id)
        raise InvalidArgument(f"job {job_id} is {job.status}; only dead or cancelled jobs can be retried")

    def purge(self, *, older_than: timedelta = timedelta(0), statuses: str | Sequence[str] = FINISHED) -> int:
        """Delete finished jobs that finished more than ``older_than`` ago.

        A finished job whose waiting children were not settled yet is kept until upkeep has settled them.

        Args:
            older_than: How long ago (a timedelta or seconds) a job must have finished.
            statuses: The finished states to delete: one state (``"dead"``) or a list of them.

        Returns:
            How many jobs were deleted.

        Raises:
            InvalidArgument: A state that is not a finished one (succeeded, dead, cancelled).
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).

        Example:
            >>> app.purge(older_than=timedelta(days=7), statuses="succeeded")
            1204
        """
        age = timedelta(seconds=checked_seconds(older_than, "older_than", zero=True))
        states = finished_states(statuses)
        total = 0
        with self._tables():
            while purged := self.store.purge(self.engine, age, states):
                total += purged
        return total

    def purgeable(
        self, *, older_than: timedelta = timedelta(0), statuses: str | Sequence[str] = FINISHED
    ) -> dict[str, int]:
        """How many jobs :meth:`purge` with these arguments would delete now, per state; nothing is deleted.

        Args:
            older_than: How long ago (a timedelta or seconds) a job must have finished.
            statuses: The finished states to count: one state or a list of them.

        Returns:
            The count per state, only states with jobs to purge present.

        Raises:
            InvalidArgument: A state that is not a finished one (succeeded, dead, cancelled).
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        age = timedelta(seconds=checked_seconds(older_than, "older_than", zero=True))
        states = finished_states(statuses)
        with self._tables():
            return self.store.purgeable(self.engine, age, states)

    def status(self) -> list[QueueStatus]:
        """Per queue: jobs per state, the oldest runnable job's wait, and recent throughput.

        Returns:
            One :class:`QueueStatus` per queue that has jobs, by queue name.

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        backend = backend_for(self.engine.dialect)
        with self._tables(), connected(self.engine) as conn:
            now = aware(conn.execute(sa.select(backend.now())).scalar_one())
            counts = conn.execute(
                sa.select(jobs.c.queue, jobs.c.status, sa.func.count()).group_by(jobs.c.queue, jobs.c.status)
            ).all()
            oldest = dict(
                conn.execute(
                    sa.select(jobs.c.queue, sa.func.min(jobs.c.run_at))
                    .where(jobs.c.status == QUEUED)
                    .group_by(jobs.c.queue)
                ).all()
            )
            window = from_now(backend, -60.0)
            recent: dict[str, int] = dict(
                conn.execute(
                    sa.select(jobs.c.queue, sa.func.count())
                    .where(jobs.c.status.in_(FINISHED), jobs.c.finished_at >= window)
                    .group_by(jobs.c.queue)
                ).all()
            )
        per_queue: dict[str, dict[str, int]] = {}
        for queue, state, count in counts:
            per_queue.setdefault(queue, dict.fromkeys(STATES, 0))[state] = count
        return [
            QueueStatus(
                queue=queue,
                counts=per_queue[queue],
                oldest_ready_seconds=(
                    max(0.0, (now - aware(oldest[queue])).total_seconds()) if oldest.get(queue) else None
                ),
                finished_per_second=recent.get(queue, 0) / 60.0,
            )
            for queue in sorted(per_queue)
        ]

    def workers(self) -> list[WorkerStatus]:
        """The live workers on this database (of any app), by name: those whose heartbeat is recent.

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        with self._tables():
            return live_workers(self.engine)

    def stranded_jobs(self) -> list[StrandedJobs]:
        """Queued jobs that no live worker can take, per queue, task and tag, oldest first.

        No live worker serves their queue with their task, or their tag: they wait until one that can
        take them starts.

        Raises:
            SchemaMissing: The database lacks the dibs tables (run ``dibs init``).
        """
        with self._tables():
            return stranded_jobs(self.engine)
