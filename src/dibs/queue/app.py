"""The App: a registry of tasks on one database, and everything done to its jobs from outside a worker.

::

    app = dibs.App("postgresql+psycopg://localhost/shop")

    @app.task(queue="emails", max_attempts=3, retry=dibs.Retry(on=(ConnectionError,)))
    def send_receipt(order_id: int) -> None: ...

    send_receipt.enqueue({"order_id": 7})                       # its own transaction
    with engine.begin() as conn:                                # or the caller's: no commit, no job
        conn.execute(orders.insert(), ...)
        send_receipt.enqueue({"order_id": 8}, conn=conn)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._checks import checked_count, checked_name, checked_seconds, checked_text
from dibs._errors import DibsWarning, InvalidArgument, JobNotFound
from dibs.claim import claim
from dibs.dialects import backend_for
from dibs.dialects.base import moment
from dibs.engine import checked_url, connected, create_engine, database_url, writing
from dibs.queue.enqueue import CHANNEL, NewJob, insert_jobs, new_job, task_named
from dibs.queue.job import Job
from dibs.queue.periodic import Periodic, PeriodicStatus, checked_periodic, enqueue_due, schedule_status, sync_schedules
from dibs.queue.registry import StrandedJobs, WorkerStatus, live_workers, stranded_jobs
from dibs.queue.store import JobStore
from dibs.queue.task import TASK_NAME_LIMIT, OrderingKey, Task
from dibs.queue.worker import Worker
from dibs.retry import DEFAULT_RETRY, Retry
from dibs.schema import (
    CANCELLED,
    DEAD,
    FINISHED,
    QUEUED,
    RUNNING,
    SCHEDULED,
    STATES,
    aware,
    jobs,
    migrate,
    tables_checked,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, kw_only=True)
class QueueStatus:
    """How one queue stands: jobs per state, how long the oldest runnable job has waited, and how many
    jobs finished per second over the last minute."""

    queue: str
    counts: dict[str, int]
    oldest_ready_seconds: float | None
    finished_per_second: float


def _warn_script_task(task_name: str, stacklevel: int) -> None:
    warnings.warn(
        f"task {task_name!r} is defined in a script run as __main__: a worker that imports the script's "
        f"module names it {task_name.replace('__main__.', 'MODULE.', 1)!r} and never runs its jobs. "
        f"Give it a stable name (@app.task(name={task_name.split('.', 1)[1]!r})) or define it in an "
        "importable module",
        DibsWarning,
        stacklevel=stacklevel,
    )


class App:
    """Tasks and the database their jobs live in (an Engine, a URL, or by default ``$DIBS_DATABASE_URL``
    or the SQLite file ``dibs.sqlite``).

    ``queues`` declares queues beyond those the tasks name (jobs may be routed to any of them).
    """

    def __init__(
        self,
        db: str | Engine | None = None,
        *,
        queues: Iterable[str] = (),
        max_args_bytes: int = 1_000_000,
        notify: bool = True,
    ) -> None:
        if isinstance(db, Engine):
            self._engine: Engine | None = db
            self.url = db.url.render_as_string(hide_password=True)
        else:
            self._engine = None
            # A URL that can never work (an unknown kind of database, a driver not installed) is refused now;
            # one that may work later (a server not up yet) when it is first used.
            self.url = database_url(db)
            checked_url(self.url)
        self.tasks: dict[str, Task] = {}
        self.declared_queues = frozenset(checked_name(queue, "a queue name") for queue in queues)
        if isinstance(max_args_bytes, bool) or not isinstance(max_args_bytes, int) or max_args_bytes < 1:
            raise InvalidArgument(f"max_args_bytes must be a positive whole number, got {max_args_bytes!r}")
        self.max_args_bytes = max_args_bytes
        self.notify = notify
        #: Periodic job schedules by name (see :meth:`periodic`).
        self.schedules: dict[str, Periodic] = {}
        self._store: JobStore | None = None

    # -- database ----------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The Engine jobs live in, created on first use."""
        if self._engine is None:
            self._engine = create_engine(self.url)
        return self._engine

    @property
    def store(self) -> JobStore:
        if self._store is None:
            self._store = JobStore(self.engine)
        return self._store

    def init(self) -> list[int]:
        """Create or upgrade the dibs tables; returns the versions applied (none when up to date)."""
        return [step.version for step in migrate(self.engine)]

    # -- tasks -------------------------------------------------------------------------------------

    @overload
    def task(self, function: F, /) -> Task: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        retry: Retry = DEFAULT_RETRY,
        timeout: timedelta | float | None = None,
        ordering_key: OrderingKey = None,
        tag: str | None = None,
    ) -> Callable[[F], Task]: ...

    def task(  # type: ignore[misc]
        self,
        function: F | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        retry: Retry = DEFAULT_RETRY,
        timeout: timedelta | float | None = None,
        ordering_key: OrderingKey = None,
        tag: str | None = None,
    ) -> Task | Callable[[F], Task]:
        """Register a sync or async function as a task (its name defaults to ``module.function``)."""

        # The warning points at the decorated function: register() is one call deeper under a bare @app.task.
        def register(chosen: F, stacklevel: int = 2) -> Task:
            task_name = name or f"{chosen.__module__}.{chosen.__qualname__}"
            if name is None and task_name.startswith("__main__."):
                _warn_script_task(task_name, stacklevel + 1)
            if task_name in self.tasks:
                raise InvalidArgument(f"a task named {task_name!r} is already registered; give this one name=")
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            task = Task(
                app=self,
                function=chosen,
                name=task_name,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                retry=retry,
                timeout=seconds,
                ordering_key=ordering_key,
                tag=tag,
            )
            self.tasks[task_name] = task
            return task

        return register if function is None else register(function, stacklevel=3)

    def task_named(self, name: str | Task) -> Task:
        """The task registered under ``name``, or else the one task whose function is called ``name``
        (``slow`` for ``tasks.slow``); UnknownTask, listing this app's tasks, when there is none or several."""
        return task_named(self.tasks, name)

    def periodic(
        self,
        *,
        every: timedelta | None = None,
        cron: str | None = None,
        name: str | None = None,
        args: Mapping[str, Any] | None = None,
        missed: str = "skip",
        **options: Any,
    ) -> Callable[[F | Task], Task]:
        """Register a function (or a task) to be enqueued at every slot of a schedule: ``every=`` a timedelta
        (slots at whole multiples of it since the epoch, UTC) or ``cron=`` an expression (UTC). Workers
        enqueue one job per slot however many run. ``missed``: for slots that passed while no worker ran,
        ``skip`` (one job, for the latest) or ``catch_up`` (one per slot). ``args`` and enqueue ``options``
        (queue, priority, max_attempts, tag) go to each job."""

        def register(function: F | Task) -> Task:
            task = function if isinstance(function, Task) else self.task(function)
            if task.app is not self:
                raise InvalidArgument(f"task {task.name!r} is registered with another app, not this one")
            try:
                definition = checked_periodic(
                    task, name=name, every=every, cron=cron, args=args, missed=missed, options=options
                )
            except InvalidArgument:
                if task is not function:  # registered just now: a bad schedule leaves no task behind
                    del self.tasks[task.name]
                raise
            if definition.name in self.schedules:
                raise InvalidArgument(f"a periodic job named {definition.name!r} is already registered; give name=")
            self.schedules[definition.name] = definition
            return task

        return register

    def enqueue_periodic(self) -> int:
        """Enqueue the jobs of every schedule whose slot has come (workers do this in their upkeep); returns
        how many were enqueued."""
        return enqueue_due(self.engine, self.schedules, self._channel())

    def sync_periodic(self) -> None:
        """Record this app's schedules in the database (workers do this as they start)."""
        sync_schedules(self.engine, self.schedules)

    def periodic_status(self) -> list[PeriodicStatus]:
        """Every schedule recorded in the database: its next slot, last slot and last job."""
        return schedule_status(self.engine)

    @property
    def queues(self) -> frozenset[str]:
        """Every queue a task names or the app declares."""
        return self.declared_queues | {task.queue for task in self.tasks.values()}

    # -- enqueue -----------------------------------------------------------------------------------

    def enqueue(
        self,
        task: Task | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        conn: Connection | Session | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue one job; with ``conn`` inside that connection's (or Session's) transaction.

        Options: ``queue``, ``priority``, ``run_at`` (aware datetime) or ``delay`` (seconds or timedelta),
        ``max_attempts``, ``dedupe_key`` (a live job with the key is returned instead of a new one),
        ``ordering_key``, ``tag``.
        """
        return self.enqueue_many(task, [args], conn=conn, **options)[0]

    def enqueue_many(
        self,
        task: Task | str,
        many_args: Iterable[Mapping[str, Any] | None],
        /,
        *,
        conn: Connection | Session | None = None,
        **options: Any,
    ) -> list[Job]:
        """Enqueue a job per argument set, in one round trip, with the same options; all or none."""
        new = self._validated(task, many_args, options)
        if (
            conn is None
            and len(new) == 1
            and new[0].values["dedupe_key"] is None
            and self.store.backend.atomic_statements
        ):
            # One INSERT is atomic on its own: in autocommit it is one round trip instead of three (BEGIN,
            # INSERT, COMMIT), and the notification that follows it finds the job committed.
            with self._tables(), self.engine.connect() as connection:
                autocommit = connection.execution_options(isolation_level="AUTOCOMMIT")
                return insert_jobs(autocommit, new, self._channel())
        return self._write(conn, lambda connection: insert_jobs(connection, new, self._channel()))

    async def aenqueue(
        self,
        task: Task | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        conn: AsyncConnection | AsyncSession | None = None,
        **options: Any,
    ) -> Job:
        """enqueue() for asyncio: with ``conn`` (AsyncConnection or AsyncSession) in its transaction."""
        return (await self.aenqueue_many(task, [args], conn=conn, **options))[0]

    async def aenqueue_many(
        self,
        task: Task | str,
        many_args: Iterable[Mapping[str, Any] | None],
        /,
        *,
        conn: AsyncConnection | AsyncSession | None = None,
        **options: Any,
    ) -> list[Job]:
        """enqueue_many() for asyncio."""
        new = self._validated(task, many_args, options)
        if conn is None:
            import asyncio

            return await asyncio.to_thread(self._write, None, lambda c: insert_jobs(c, new, self._channel()))

        def write(sync: Any) -> list[Job]:
            return self._write(sync, lambda c: insert_jobs(c, new, self._channel()))

        return await conn.run_sync(write)

    def _validated(
        self, task: Task | str, many_args: Iterable[Mapping[str, Any] | None], options: Mapping[str, Any]
    ) -> list[NewJob]:
        chosen = task_named(self.tasks, task, by_function=False)
        if isinstance(many_args, Mapping):
            raise InvalidArgument("enqueue_many takes a list of argument dicts, one per job; for one job use enqueue")
        known = self.queues
        try:
            return [
                new_job(chosen, args, known_queues=known, max_args_bytes=self.max_args_bytes, **options)
                for args in many_args
            ]
        except TypeError as exc:
            raise InvalidArgument(
                f"{exc}; enqueue options are queue, priority, run_at, delay, max_attempts, dedupe_key, "
                "ordering_key, tag and conn"
            ) from exc

    def _channel(self) -> str | None:
        return CHANNEL if self.notify else None

    def _tables(self) -> AbstractContextManager[None]:
        """Turn a statement's failure into SchemaMissing when the dibs tables are missing or out of date."""
        return tables_checked(self.engine)

    def _write(self, conn: Any, work: Callable[[Connection], list[Job]]) -> list[Job]:
        with self._tables():
            return self._write_on(conn, work)

    def _write_on(self, conn: Any, work: Callable[[Connection], list[Job]]) -> list[Job]:
        if conn is None:
            with writing(self.engine) as connection:
                return work(connection)
        if isinstance(conn, Connection):
            # Inside the caller's transaction, or the one this statement begins: the caller commits it.
            return work(conn)
        connection_of = getattr(conn, "connection", None)
        if callable(connection_of):  # an ORM Session: join its transaction; the caller commits
            return work(connection_of())
        raise InvalidArgument(
            f"conn must be a SQLAlchemy Connection or Session (AsyncConnection or AsyncSession for aenqueue), "
            f"got {type(conn).__name__}"
        )

    # -- inspection and upkeep ---------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with this id; JobNotFound if there is none."""
        with self._tables(), connected(self.engine) as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise JobNotFound(f"there is no job {job_id} (it may have been purged)")
        return Job.from_row(row)

    def jobs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs, newest first, filtered by state(s), queue and task name."""
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
            return [Job.from_row(row) for row in conn.execute(query)]

    def cancel(self, job_id: int) -> Job:
        """Cancel a job: a waiting one at once; a running one is asked to stop (its worker tells it, and
        records it cancelled when it stops). A finished job is returned unchanged."""
        backend = backend_for(self.engine.dialect)
        # Plain UPDATEs, which wait for a row another transaction holds, where a claim would skip it.
        waiting = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status.in_([SCHEDULED, QUEUED]))
            .values(status=CANCELLED, finished_at=backend.now(), dedupe_key=None, last_error="cancelled before it ran")
        )
        running = sa.update(jobs).where(jobs.c.id == job_id, jobs.c.status == RUNNING).values(cancel_requested=True)
        with self._tables(), writing(self.engine) as conn:
            if conn.execute(waiting).rowcount == 0:
                conn.execute(running)
        return self.get(job_id)

    def retry(self, job_id: int) -> Job:
        """Queue a dead or cancelled job again, with its attempts counted from zero."""
        backend = backend_for(self.engine.dialect)
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
            )
        if rows:
            return Job.from_row(rows[0])
        job = self.get(job_id)
        raise InvalidArgument(f"job {job_id} is {job.status}; only dead or cancelled jobs can be retried")

    def purge(self, *, older_than: timedelta = timedelta(0), statuses: Sequence[str] = FINISHED) -> int:
        """Delete finished jobs (of ``statuses``) that finished more than ``older_than`` ago; returns how many."""
        older_than = timedelta(seconds=checked_seconds(older_than, "older_than", zero=True))
        wrong = set(statuses) - set(FINISHED)
        if wrong:
            raise InvalidArgument(f"only finished jobs can be purged ({', '.join(FINISHED)}), not {sorted(wrong)}")
        total = 0
        with self._tables():
            while purged := self.store.purge(self.engine, older_than, statuses):
                total += purged
        return total

    def purgeable(self, *, older_than: timedelta = timedelta(0), statuses: Sequence[str] = FINISHED) -> dict[str, int]:
        """How many jobs :meth:`purge` with these arguments would delete now, per state; nothing is deleted."""
        older_than = timedelta(seconds=checked_seconds(older_than, "older_than", zero=True))
        with self._tables():
            return self.store.purgeable(self.engine, older_than, statuses)

    def status(self) -> list[QueueStatus]:
        """Per queue: jobs per state, the oldest runnable job's wait, and recent throughput."""
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
            window = moment(backend, -60.0)
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
        """The live workers on this database (of any app), by name: those whose heartbeat is recent."""
        with self._tables():
            return live_workers(self.engine)

    def stranded_jobs(self) -> list[StrandedJobs]:
        """Queued jobs that no live worker can take (none serves their queue with their task, or their tag),
        per queue, task and tag, oldest first: they wait until a worker that can take them starts."""
        with self._tables():
            return stranded_jobs(self.engine)

    # -- workers -----------------------------------------------------------------------------------

    def worker(self, **options: Any) -> Worker:
        """A worker for this app's tasks; options as for :class:`dibs.Worker`."""
        return Worker(self, **options)
