"""A worker's upkeep, apart from the claim: scheduled jobs whose time came become queued, periodic jobs are
enqueued, expired leases of crashed workers are recovered, jobs waiting for finished ones are settled,
old finished jobs are purged if asked, a new jobs table's first statistics are gathered if the database has
not yet, and the queue depths are observed for the metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from dibs.metrics import Metrics
from dibs.queue.stage import WorkerApp
from dibs.runtime import Chore, DatabaseThreads, Wakeup, until_done

log = logging.getLogger("dibs.worker")

#: Seconds between purges of old finished jobs, when the worker keeps them for a retention period.
PURGE_EVERY = 60.0


def worker_chores(
    app: WorkerApp,
    *,
    every: float,
    retention: timedelta | None,
    threads: DatabaseThreads,
    wakeup: Wakeup,
    metrics: Callable[[], Metrics | None],
) -> list[Chore]:
    """The chores of a worker of ``app``, every ``every`` seconds (purging, with a ``retention``, once a minute).

    Each chore that makes work runnable wakes the fetcher (through ``wakeup``); ``metrics`` gives the
    worker's metrics, if it serves them.
    """
    call, store, engine = threads.call, app.store, app.engine

    async def promote() -> None:
        if await call(store.promote_due, engine):
            wakeup.wake()

    async def periodic() -> None:
        if not app.schedules:
            return
        if await call(app.enqueue_periodic):
            wakeup.wake()

    async def recover() -> None:
        requeued, dead = await call(store.recover_expired, engine)
        if requeued or dead:
            log.warning("recovered %d jobs of workers that stopped renewing their lease (%d dead)", requeued, dead)
            wakeup.wake()

    async def settle() -> None:
        # The backstop: children of finished jobs that the finishing worker did not settle.
        if await call(store.settle_unsettled, engine):
            wakeup.wake()

    async def purge() -> None:
        await call(app.purge, older_than=retention)

    async def observe() -> None:
        watched = metrics()
        if watched is not None:
            watched.observe(await call(app.status))

    chores = [
        Chore("promote", every, promote),
        Chore("periodic", every, periodic),
        Chore("recover", every, recover),
        Chore("settle", every, settle),
        # Once they are there, the database keeps them.
        until_done("statistics", every, lambda: call(store.gather_first_statistics, engine)),
    ]
    if retention is not None:
        chores.append(Chore("purge", PURGE_EVERY, purge))
    chores.append(Chore("metrics", every, observe))
    return chores
