"""The worker: claims jobs in batches, runs them, and writes their outcome, fenced by their lease.

It is the wiring of its stages on the shared runtime (:mod:`dibs.runtime`). One asyncio loop runs
everything; database calls go to threads of their own, one per connection (two by default, so that a claim
need not wait behind a completion; one on SQLite); async task functions run on the loop, sync ones in a
thread pool.

* fetching (:mod:`~dibs.queue.fetch`): claims as many jobs as there are idle runners, waits for a
  notification or polls, backing off while idle, and sees when a burst is done;
* running (:mod:`~dibs.queue.execute`): ``concurrency`` runners each take the next claimed job;
* deciding (:mod:`~dibs.queue.outcome`) and writing (:mod:`~dibs.queue.writes`): successes in batches,
  failures retried with backoff or buried as dead, one by one;
* heartbeats (:class:`~dibs.runtime.LeaseKeeper`) renew the leases of every job held, and learn which
  running jobs were cancelled;
* upkeep (:mod:`~dibs.queue.chores`), apart from the claim;
* shutdown (SIGTERM, SIGINT or :meth:`Worker.stop`): no more claims, unstarted jobs are released at once,
  running jobs get ``grace`` seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from datetime import timedelta

import sqlalchemy as sa

from dibs.lease import Lease
from dibs.metrics import Metrics
from dibs.queue.chores import worker_chores
from dibs.queue.enqueue import CHANNEL
from dibs.queue.execute import Runners
from dibs.queue.fetch import ClaimedJobs, Fetcher
from dibs.queue.registry import keep_registered
from dibs.queue.settings import worker_settings
from dibs.queue.stage import Shared, WorkerApp
from dibs.queue.stats import WorkerStats
from dibs.queue.writes import JobWrites
from dibs.runtime import Chore, DatabaseThreads, LeaseKeeper, Service, Upkeep, tuned_gc
from dibs.runtime.missing_tables import MissingTables
from dibs.schema import require_current, translated

__all__ = ["Worker", "WorkerApp", "WorkerStats"]

log = logging.getLogger("dibs.worker")


class Worker(Service[WorkerStats]):
    """Runs an app's jobs until stopped (or, with ``burst=True``, until no job is runnable).

    Args:
        app: The app whose jobs it runs.
        queues: The queues to take jobs from (default: every queue of the app).
        tags: The version/capability tags this worker has; it takes jobs with no tag or one of these.
        concurrency: Jobs run at once.
        batch: Most jobs claimed per round trip (default: the concurrency). A claim never takes more jobs
            than there are idle runners, so that each claimed job starts at once and no attempt is counted
            for a job that waits (for fast jobs, a concurrency of twice the batch keeps a claim in flight
            while the last batch runs).
        lease: Seconds a claim is held before another worker may take the job over.
        heartbeat: Seconds between renewals of the leases (default: a third of the lease).
        poll: The longest wait between looks for work when idle.
        grace: Seconds running jobs get to finish at shutdown.
        upkeep_every: Seconds between rounds of upkeep.
        retention: Purge finished jobs older than this.
        burst: Stop once no job of its queues is queued, scheduled or running.
        name: Its lease owner name (default: host, process id and a random part).
        metrics_port: Serve Prometheus metrics on this port.
        metrics_address: The address to serve them on (default 127.0.0.1, this machine only;
            ``"0.0.0.0"`` serves every interface).
        handle_signals: Stop on SIGTERM and SIGINT (a second one: without waiting for running jobs).
        connections: The database connections the worker holds for its statements, 1 or 2, besides the one
            a PostgreSQL worker listens on for notifications (default: 2, and 1 on SQLite, which takes one
            writer at a time). With 2 a claim runs while successes are written; with 1 they take turns,
            which costs a lone worker some throughput and spares a database server that is short of CPU
            (many workers, few cores) the cost of twice as many transactions at once.
        tune_gc: Tune Python's garbage collector for a process that does little but run this worker
            (``dibs worker`` does): see :func:`~dibs.runtime.tuned_gc`.

    Raises:
        InvalidArgument: A setting is out of range; nothing was started.

    Attributes:
        ready: Set once the worker has started (its tables checked, its periodic schedules recorded) and is
            about to claim, and cleared when it stops: a readiness check for whatever runs it.
        abandoned: Sync jobs still running in their threads when the worker stopped (past the grace period).

    Example:
        >>> worker = app.worker(concurrency=4, burst=True)  # doctest: +SKIP
        >>> worker.run().succeeded  # doctest: +SKIP
        12
    """

    def __init__(
        self,
        app: WorkerApp,
        *,
        queues: Iterable[str] | None = None,
        tags: Iterable[str] = (),
        concurrency: int = 10,
        batch: int | None = None,
        lease: float = 30.0,
        heartbeat: float | None = None,
        poll: float = 2.0,
        grace: float = 30.0,
        upkeep_every: float = 1.0,
        retention: timedelta | None = None,
        burst: bool = False,
        name: str | None = None,
        metrics_port: int | None = None,
        metrics_address: str = "127.0.0.1",
        handle_signals: bool = True,
        connections: int | None = None,
        tune_gc: bool = False,
    ) -> None:
        # Every keyword above, passed on as it came: worker_settings checks them all, in one place.
        options = {key: value for key, value in locals().items() if key not in ("self", "app", "__class__")}
        self.app = app
        self.settings = settings = worker_settings(app.queues, **options)
        self.queues, self.tags = list(settings.queues), list(settings.tags)
        self.concurrency, self.batch, self.burst = settings.concurrency, settings.batch, settings.burst
        self.lease_seconds, self.heartbeat_seconds = settings.lease_seconds, settings.heartbeat_seconds
        self.poll_seconds, self.grace_seconds = settings.poll_seconds, settings.grace_seconds
        self.upkeep_seconds, self.retention = settings.upkeep_seconds, settings.retention
        self.metrics_port, self.metrics_address = settings.metrics_port, settings.metrics_address
        self.tune_gc = settings.tune_gc
        # A job routed by enqueue(queue=...) to one of our queues may be of any registered task.
        self.task_names = sorted(app.tasks)
        self.stats = WorkerStats()
        self.abandoned = 0
        self.metrics: Metrics | None = None
        # One thread per connection; the database's statements run without the GIL.
        self.connections = settings.connections or app.store.backend.default_worker_connections
        threads = DatabaseThreads(
            self.connections, name="dibs-db", translate=lambda error: translated(error, app.engine)
        )
        super().__init__(name=settings.name, threads=threads, handle_signals=settings.handle_signals, log=log)
        self._missing = MissingTables(log, f"worker {self.name} cannot reach its jobs")
        self._listening = False
        self._wire()

    def _wire(self) -> None:
        """Make the stages and connect them: what each one reads and whom it tells."""
        app, threads, wakeup, missing = self.app, self.threads, self.wakeup, self._missing
        self.keeper = LeaseKeeper(
            lambda held: app.store.renew(app.engine, held, self.lease_seconds),
            every=self.heartbeat_seconds,
            lost=self._lost,
            failed=self._heartbeat_failed,
            also=self._cancelled,
        )
        shared = Shared(
            store=app.store,
            engine=app.engine,
            threads=threads,
            wakeup=wakeup,
            keeper=self.keeper,
            stats=self.stats,
            missing=missing,
        )
        self.writes = JobWrites(shared)
        self.jobs = ClaimedJobs(wakeup)
        self.runners = Runners(
            tasks=app.tasks,
            concurrency=self.concurrency,
            jobs=self.jobs,
            writes=self.writes,
            async_options=app.async_engine_options,
        )
        self.fetcher = Fetcher(
            shared,
            settings=self.settings,
            task_names=self.task_names,
            jobs=self.jobs,
            writes=self.writes,
            stopping=lambda: self.stopping,
        )
        chores = worker_chores(
            app,
            every=self.upkeep_seconds,
            retention=self.retention,
            threads=threads,
            wakeup=wakeup,
            metrics=lambda: self.metrics,
        )
        self.upkeep = Upkeep(chores, failed=self._upkeep_failed)

    async def arun(self) -> WorkerStats:
        """Run on the caller's event loop until stopped; returns what was done."""
        with tuned_gc() if self.tune_gc else contextlib.nullcontext():
            stats = await super().arun()
        log.info("worker %s stopped: %s", self.name, stats)
        return stats

    async def start(self) -> None:
        """Check the schema and record the periodic schedules. A connection dropped under the worker as it
        starts (a server-side kill, a failover) is tried again; a database that cannot be reached at all is
        an error for whoever started the worker to see, as are options the App gave the asyncio engine of
        async transactional tasks that the engine does not know."""
        self.runners.transactions.check(self.app.tasks.values())
        for attempt in range(1, 4):
            try:
                await self.threads.call(require_current, self.app.engine)
                await self.threads.call(self.app.sync_periodic)
                break
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated or attempt == 3 or self.stopping:
                    raise
                log.warning("the connection dropped while the worker started, trying again: %s", error)
                await asyncio.sleep(0.1 * attempt)
        if self.metrics_port is not None:
            self.metrics = Metrics.serve(self.metrics_port, self.metrics_address)
            self.fetcher.metrics = self.runners.metrics = self.writes.metrics = self.metrics

    async def serve(self) -> WorkerStats:
        """Claim and run jobs until stopped, then give back what has not started and let running jobs end."""
        self._listening = self._listen()
        self.writes.successes.start()
        runners = self.runners.start()
        self.background(self.keeper.run(self.threads), "dibs-heartbeats")
        self.background(self.runners.progress.run(), "dibs-progress")
        if self.burst:
            # Its first pass comes before the first claim, or a burst with nothing queued could end before
            # the pass enqueued a periodic job that is due, or moved a paused schedule on.
            await self.upkeep.run_due(lambda: self.stopping)
        self.background(self.upkeep.run(), "dibs-upkeep")
        # Its row in dibs_workers, for `dibs status`: written now, beating, deleted as it stops.
        self.background(keep_registered(self, self.threads.call), "dibs-registry")
        log.info("worker %s started: queues %s, concurrency %d", self.name, ",".join(self.queues), self.concurrency)
        await self.fetcher.run()
        # Jobs of a claim that came back as the worker stopped, not yet started: given back at once.
        await self.writes.release(self.jobs.unstarted())
        self.abandoned = await self.runners.stop(runners, grace=self.grace_seconds, hurry=lambda: self.hurry)
        await self.writes.successes.flush()
        # Sync jobs still running past the grace period cannot be stopped from here: their leases are no
        # longer renewed, so another worker may run them again once they expire. `dibs worker` ends its
        # process at this point, which stops them.
        return self.stats

    async def close(self) -> None:
        """Write the last successes (a write under way is waited for and counted), stop listening, stop serving
        metrics, and let the threads of sync jobs go."""
        await self.writes.successes.stop()
        if self._listening:
            await self.threads.call(self.wakeup.close)
        if self.metrics is not None:
            self.metrics.close()
        await self.runners.transactions.close()
        self.runners.shutdown()

    def _listen(self) -> bool:
        """Wake on notifications of new jobs on our queues, where the database sends them."""
        if not self.app.notify or self.burst:
            return False  # a burst worker stops once nothing is left: it has nothing to wait for
        queues = set(self.queues)
        return self.wakeup.listen(
            self.app.store.backend,
            self.app.engine,
            CHANNEL,
            lambda payload: not payload or bool(queues.intersection(payload.split(","))),
        )

    def _heartbeat_failed(self, error: Exception) -> None:
        # Tried again at the next beat, well before the leases expire.
        if not self._missing.report(error):
            log.warning("heartbeat failed, will try again: %s", error)

    def _upkeep_failed(self, chore: Chore, error: Exception) -> None:
        if not self._missing.report(error):
            log.warning("upkeep failed (%s), will try again: %s", chore.name, error)

    def _lost(self, lease: Lease) -> None:
        log.warning("lost the lease on job %s (it expired and was taken over); stopping it here", lease.key[0])
        self.runners.interrupt(lease.key[0], "lease lost")

    async def _cancelled(self) -> None:
        """Stop the running jobs someone asked to cancel."""
        running = list(self.runners.running)
        if running:
            for job_id in await self.threads.call(self.app.store.cancel_requests, self.app.engine, running):
                self.runners.interrupt(job_id, "cancelled")
