"""Which workers run, and which queued jobs none of them can take.

Each worker keeps a row in ``dibs_workers`` while it runs: written as it starts, its ``last_heartbeat`` moved
on by one UPDATE per heartbeat, deleted as it stops. A worker that was killed leaves its row behind; once
its heartbeat is :data:`~dibs.schema.DEAD_AFTER_LEASES` of its leases old the row counts as dead, is left
out of every answer, and the next sweep of any running worker deletes it.

A queued job is *stranded* when no live worker takes its queue, has its task and (for a tagged job) its tag:
a task registered under another name in the workers (``__main__.send`` in a script, ``shop.send`` in the
worker that imports it), a queue no worker was started for, a tag no worker has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs.dialects import backend_for
from dibs.engine import connected, writing
from dibs.schema import DEAD_AFTER_LEASES, QUEUED, aware, jobs, workers

log = logging.getLogger("dibs.worker")


@dataclass(frozen=True, kw_only=True)
class WorkerStatus:
    """A live worker, as its row in the database says."""

    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    #: The task names it runs: a job of any other task is never claimed by it.
    tasks: tuple[str, ...]
    #: Its version/capability tags: it takes jobs with no tag or one of these.
    tags: tuple[str, ...]
    concurrency: int
    lease_seconds: float
    started_at: datetime
    last_heartbeat: datetime
    #: Seconds since its last heartbeat, on the database clock.
    heartbeat_age_seconds: float

    def takes(self, queue: str, task: str, tag: str | None) -> bool:
        """Whether this worker claims queued jobs of this queue, task and tag.

        Args:
            queue: The jobs' queue.
            task: The jobs' task name.
            tag: The jobs' tag, or None.

        Returns:
            True when the worker serves them.
        """
        return queue in self.queues and task in self.tasks and (tag is None or tag in self.tags)


@dataclass(frozen=True, kw_only=True)
class StrandedJobs:
    """Queued jobs of one queue, task and tag that no live worker can take: they wait until one that can starts."""

    queue: str
    task: str
    tag: str | None
    count: int
    #: Seconds the oldest of them has been ready to run, on the database clock.
    oldest_seconds: float
    #: Why no live worker takes them, for a person to read.
    reason: str


class _HasEngine(Protocol):
    @property
    def engine(self) -> Engine: ...


class Serving(Protocol):
    """What the registry reads of a worker (a :class:`dibs.Worker`)."""

    @property
    def app(self) -> _HasEngine: ...
    @property
    def name(self) -> str: ...
    @property
    def queues(self) -> Sequence[str]: ...
    @property
    def task_names(self) -> Sequence[str]: ...
    @property
    def tags(self) -> Sequence[str]: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def lease_seconds(self) -> float: ...
    @property
    def heartbeat_seconds(self) -> float: ...


# -- one worker's row --------------------------------------------------------------------------------------


class Registration:
    """The statements of one worker's row."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        tags: Sequence[str],
        concurrency: int,
        lease_seconds: float,
    ) -> None:
        self.engine = engine
        self.name = name
        self.lease_seconds = lease_seconds
        self._values = {
            "name": name,
            "host": socket.gethostname()[:255],
            "pid": os.getpid(),
            "queues": json.dumps(sorted(queues)),
            "tasks": json.dumps(sorted(tasks)),
            "tags": json.dumps(sorted(tags)),
            "concurrency": concurrency,
            "lease_seconds": lease_seconds,
        }
        now = backend_for(engine.dialect).now()
        self._beat = sa.update(workers).where(workers.c.name == name).values(last_heartbeat=now)
        self._insert = workers.insert().values(**self._values, started_at=now, last_heartbeat=now)

    def register(self) -> None:
        """Write the row (replacing one a worker of the same name left behind)."""
        with writing(self.engine) as conn:
            conn.execute(sa.delete(workers).where(workers.c.name == self.name))
            conn.execute(self._insert)

    def beat(self) -> None:
        """Move the heartbeat on: one UPDATE. A row swept as dead (the worker was paused for several leases)
        is written again."""
        with writing(self.engine) as conn:
            changed = conn.execute(self._beat).rowcount
        if changed == 0:
            self.register()

    def unregister(self) -> None:
        with writing(self.engine) as conn:
            conn.execute(sa.delete(workers).where(workers.c.name == self.name))


async def keep_registered(worker: Serving, call: Callable[..., Awaitable[Any]]) -> None:
    """A worker's chore: register it, beat every heartbeat and sweep dead rows every lease, until cancelled;
    then delete its row. Database errors are logged and tried again at the next beat."""
    registration = Registration(
        worker.app.engine,
        name=worker.name,
        queues=worker.queues,
        tasks=worker.task_names,
        tags=worker.tags,
        concurrency=worker.concurrency,
        lease_seconds=worker.lease_seconds,
    )
    step: Callable[[], None] = registration.register
    swept = time.monotonic()
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            # Shielded: a write under way when the worker stops is waited for before the row is deleted.
            pending = asyncio.ensure_future(call(step))
            try:
                await asyncio.shield(pending)
                step = registration.beat
                if time.monotonic() - swept >= worker.lease_seconds:
                    swept = time.monotonic()
                    await call(sweep_dead, worker.app.engine)
            except Exception as error:
                log.warning(
                    "worker %s could not update its row in dibs_workers, will try again: %s", worker.name, error
                )
            await asyncio.sleep(worker.heartbeat_seconds)
    finally:
        if pending is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await pending
        try:
            await call(registration.unregister)
        except Exception as error:
            log.warning("worker %s could not delete its row in dibs_workers; it ages out: %s", worker.name, error)


# -- reading -----------------------------------------------------------------------------------------------


def _all_workers(conn: Connection) -> tuple[datetime, list[WorkerStatus], list[WorkerStatus]]:
    """The database clock now, the live workers and the dead ones, by name."""
    now = aware(conn.execute(sa.select(backend_for(conn.dialect).now())).scalar_one())
    live: list[WorkerStatus] = []
    dead: list[WorkerStatus] = []
    for row in conn.execute(sa.select(workers).order_by(workers.c.name)):
        beat = aware(row.last_heartbeat)
        age = max(0.0, (now - beat).total_seconds())
        status = WorkerStatus(
            name=row.name,
            host=row.host,
            pid=row.pid,
            queues=tuple(json.loads(row.queues)),
            tasks=tuple(json.loads(row.tasks)),
            tags=tuple(json.loads(row.tags)),
            concurrency=row.concurrency,
            lease_seconds=row.lease_seconds,
            started_at=aware(row.started_at),
            last_heartbeat=beat,
            heartbeat_age_seconds=age,
        )
        (dead if age > DEAD_AFTER_LEASES * row.lease_seconds else live).append(status)
    return now, live, dead


def live_workers(bind: Engine | Connection) -> list[WorkerStatus]:
    """The workers whose heartbeat is recent, by name."""
    with connected(bind) as conn:
        return _all_workers(conn)[1]


def sweep_dead(engine: Engine) -> int:
    """Delete the rows of dead workers; returns how many. A row that beat since it was read is kept."""
    with connected(engine) as conn:
        dead = _all_workers(conn)[2]
    if not dead:
        return 0
    with writing(engine) as conn:
        for worker in dead:
            conn.execute(
                sa.delete(workers).where(
                    workers.c.name == worker.name, workers.c.last_heartbeat <= worker.last_heartbeat
                )
            )
    log.info("removed the rows of %d dead workers: %s", len(dead), ", ".join(worker.name for worker in dead))
    return len(dead)


def stranded_jobs(bind: Engine | Connection) -> list[StrandedJobs]:
    """Queued jobs that no live worker can take, per queue, task and tag, oldest first."""
    with connected(bind) as conn:
        now, live, _ = _all_workers(conn)
        groups = conn.execute(
            sa.select(jobs.c.queue, jobs.c.task, jobs.c.tag, sa.func.count(), sa.func.min(jobs.c.run_at))
            .where(jobs.c.status == QUEUED)
            .group_by(jobs.c.queue, jobs.c.task, jobs.c.tag)
        ).all()
    found = [
        StrandedJobs(
            queue=queue,
            task=task,
            tag=tag,
            count=count,
            oldest_seconds=max(0.0, (now - aware(oldest)).total_seconds()),
            reason=_why_stranded(live, queue, task, tag),
        )
        for queue, task, tag, count, oldest in groups
        if not any(worker.takes(queue, task, tag) for worker in live)
    ]
    return sorted(found, key=lambda jobs: (-jobs.oldest_seconds, jobs.queue, jobs.task, jobs.tag or ""))


def _why_stranded(live: Sequence[WorkerStatus], queue: str, task: str, tag: str | None) -> str:
    if not live:
        return "no worker is running"
    on_queue = [worker for worker in live if queue in worker.queues]
    if not on_queue:
        return f"no live worker takes queue {queue!r}"
    with_task = [worker for worker in on_queue if task in worker.tasks]
    if not with_task:
        return f"no live worker of queue {queue!r} has task {task!r} (a task registered under another name?)"
    return f"no live worker of queue {queue!r} with task {task!r} has tag {tag!r}"
