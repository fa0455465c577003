"""The worker: claims jobs in batches, runs them, and writes their outcome, fenced by their lease.

One asyncio loop runs everything. Database calls go to threads of their own, one per connection (two by
default, so that a claim need not wait behind a completion; one on SQLite), async task functions run on
the loop, sync ones in a thread pool.

* fetching: a claim takes at most as many jobs as there are idle runners, so every job claimed starts
  at once (a claim counts an attempt: a job must not lose one waiting behind others in a worker that
  then dies); when nothing is runnable the worker waits for a PostgreSQL notification or polls,
  backing off while idle;
* running: ``concurrency`` runners each take the next claimed job;
* finishing: successes are written in batches, each as one token-fenced statement; failures are
  retried with backoff or buried as dead, one by one;
* heartbeats renew the leases of every job held, and learn which running jobs were cancelled;
* upkeep (apart from the claim): scheduled jobs whose time came become queued, expired leases of
  crashed workers are recovered, and, if asked, old finished jobs are purged;
* shutdown (SIGTERM, SIGINT or :meth:`Worker.stop`): no more claims, unstarted jobs are released at
  once, running jobs get ``grace`` seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs._errors import InvalidArgument, SchemaMissing
from dibs._signals import handle_stop_signals
from dibs.dialects.base import Listener
from dibs.lease import Lease
from dibs.metrics import Metrics, QueueDepth
from dibs.queue.enqueue import CHANNEL
from dibs.queue.job import JobContext
from dibs.queue.outcome import Outcome, failed_outcome
from dibs.queue.registry import keep_registered
from dibs.queue.settings import worker_settings
from dibs.queue.store import ARGS_AT, ATTEMPTS_AT, ID_AT, TASK_AT, JobStore, WorkLeft, error_text
from dibs.queue.task import Task
from dibs.schema import CANCELLED, require_current, translated

T = TypeVar("T")
log = logging.getLogger("dibs.worker")


@dataclass
class WorkerStats:
    """What one worker did."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    released: int = 0
    #: Outcomes the database refused because the lease had been taken over: the job runs elsewhere.
    lost: int = 0


#: Allocations (less deallocations) between collections of the youngest generation, where Python's default
#: is 700: a worker's few objects per job (its row, its lease) live until the job's batch is written, and a
#: collection every 700 of them would walk the batches in hand again and again.
TUNED_GC_THRESHOLD = 10_000
#: Seconds between looks of a burst worker that has nothing left to do but wait for jobs running in other
#: workers to end (it stays until they have: a failed one is retried, a crashed worker's is recovered):
#: the first wait, grown by half at each look up to the second (or the worker's poll, if shorter). Workers
#: draining one backlog end within tens of milliseconds of each other, and each look is one read of three
#: indexes, so the first looks come quickly; many burst workers behind one long job still do not probe the
#: database more than a few times a second each.
BURST_END_POLL = 0.01
BURST_END_POLL_GROWTH = 1.5
BURST_END_POLL_MOST = 0.4


@contextmanager
def tuned_gc() -> Iterator[None]:
    """Python's cyclic garbage collector tuned for a worker process, for the block, then put back.

    What exists when the block starts (modules, the app, SQLAlchemy's metadata and compiled statements) is
    moved out of the collector's sight with :func:`gc.freeze`, so that full collections no longer walk it
    again and again, and the youngest generation is collected less often, which a worker's short-lived
    per-job objects call for. It changes the whole process: meant for a process
    that runs a worker and little else, as ``dibs worker`` does.
    """
    thresholds = gc.get_threshold()
    # A process that froze objects of its own manages its collector itself: what it froze stays frozen.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(TUNED_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()


@dataclass
class _Running:
    lease: Lease
    task: Task
    context: JobContext
    runner: asyncio.Task[Any] | None


def _decoded(raw: str) -> dict[str, Any] | str:
    """A job's stored arguments, or what is wrong with them."""
    try:
        args = json.loads(raw)
    except ValueError as exc:
        return f"are not valid JSON ({exc})"
    if not isinstance(args, dict):
        kind = "null" if args is None else f"a {type(args).__name__}"
        return f"are not a JSON object of argument names but {kind}"
    return args


class WorkerApp(Protocol):
    """What a worker reads of the app whose jobs it runs (a :class:`dibs.App`)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def store(self) -> JobStore: ...
    @property
    def tasks(self) -> Mapping[str, Task]: ...
    @property
    def queues(self) -> frozenset[str]: ...
    @property
    def schedules(self) -> Mapping[str, object]: ...
    @property
    def notify(self) -> bool: ...
    def sync_periodic(self) -> None: ...
    def enqueue_periodic(self) -> int: ...
    def purge(self, *, older_than: timedelta = ..., statuses: Sequence[str] = ...) -> int: ...
    def status(self) -> Sequence[QueueDepth]: ...


class Worker:
    """Runs an app's jobs until stopped (or, with ``burst=True``, until no job is runnable).

    ``queues``: the queues to take jobs from (default: every queue of the app). ``tags``: the
    version/capability tags this worker has; it takes jobs with no tag or one of these.
    ``concurrency``: jobs run at once. ``batch``: most jobs claimed per round trip (default: the
    concurrency); a claim never takes more jobs than there are idle runners, so that each claimed job
    starts at once and no attempt is counted for a job that waits (for fast jobs, a concurrency of twice
    the batch keeps a claim in flight while the last batch runs). ``lease``: seconds a claim is held
    before another worker may take the job over; renewed every ``heartbeat`` seconds. ``poll``: the
    longest wait between looks for work when idle.
    ``grace``: seconds running jobs get to finish at shutdown. ``retention``: purge finished jobs older
    than this. ``metrics_port``: serve Prometheus metrics on this port, on ``metrics_address`` (default
    127.0.0.1, this machine only; ``"0.0.0.0"`` serves every interface). ``connections``: the database
    connections the worker holds for its statements, 1 or 2, besides the one a PostgreSQL worker listens
    on for notifications (default: 2, and 1 on SQLite, which takes one writer at a time):
    with 2 a claim runs while successes are written; with 1 they take turns, which costs a lone worker
    some throughput and spares a database server that is short of CPU (many workers, few cores) the
    cost of twice as many transactions at once. ``tune_gc``: tune Python's
    garbage collector for a process that does little but run this worker (``dibs worker`` does): see
    :func:`tuned_gc`.

    :attr:`ready` is set once the worker has started (its tables checked, its periodic schedules
    recorded) and is about to claim, and cleared when it stops: a readiness check for whatever runs it.
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
        self.app = app
        self.settings = worker_settings(
            app.queues,
            queues=queues,
            tags=tags,
            concurrency=concurrency,
            batch=batch,
            lease=lease,
            heartbeat=heartbeat,
            poll=poll,
            grace=grace,
            upkeep_every=upkeep_every,
            retention=retention,
            burst=burst,
            name=name,
            metrics_port=metrics_port,
            metrics_address=metrics_address,
            handle_signals=handle_signals,
            connections=connections,
            tune_gc=tune_gc,
        )
        settings = self.settings
        self.queues, self.tags, self.name = list(settings.queues), list(settings.tags), settings.name
        self.concurrency, self.batch, self.burst = settings.concurrency, settings.batch, settings.burst
        self.lease_seconds, self.heartbeat_seconds = settings.lease_seconds, settings.heartbeat_seconds
        self.poll_seconds, self.grace_seconds = settings.poll_seconds, settings.grace_seconds
        self.upkeep_seconds, self.retention = settings.upkeep_seconds, settings.retention
        self.metrics_port, self.metrics_address = settings.metrics_port, settings.metrics_address
        self.handle_signals, self.tune_gc = settings.handle_signals, settings.tune_gc
        # A job routed by enqueue(queue=...) to one of our queues may be of any registered task.
        self.task_names = sorted(app.tasks)
        self.stats = WorkerStats()
        #: Set from start-up until the worker stops (see the class's description).
        self.ready = threading.Event()
        #: Sync jobs still running in their threads when the worker stopped (past the grace period).
        self.abandoned = 0
        self.metrics: Metrics | None = None
        self._store = app.store
        self._stopping = threading.Event()
        self._hurry = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # Claimed jobs go to the buffer, and idle runners take them at once. A runner that finds more jobs
        # left wakes one more runner, so that a job that waits (for I/O, or in a thread) holds up no other;
        # jobs that never wait are run back to back by the runner already awake, without a switch each.
        self._buffer: deque[Lease] = deque()
        self._waiting: list[asyncio.Future[bool]] = []  # idle runners' wake-ups (False: shut down)
        self._starting = 0  # runners woken and not yet running
        self._closing = False
        self._held: dict[tuple[Any, ...], Lease] = {}  # claimed and not yet finished
        #: Successes being written: a burst worker holding none has not finished until they are written.
        self._writing = 0
        self._running: dict[int, _Running] = {}
        self._done: list[Lease] = []
        self._flushing = True
        self._done_ready: asyncio.Event | None = None
        # One thread per connection; the database's statements run without the GIL.
        self.connections = settings.connections or self._store.backend.default_worker_connections
        self._db = ThreadPoolExecutor(self.connections, thread_name_prefix="dibs-db")
        self._schema_reported: float | None = None  # when the missing tables were last logged
        self._threads = ThreadPoolExecutor(self.concurrency, thread_name_prefix="dibs-task")

    # -- control -----------------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Run until stopped; returns what was done."""
        return asyncio.run(self.arun())

    def stop(self, *, hurry: bool = False) -> None:
        """Stop gracefully (from any thread): claim no more, release unstarted jobs, let running ones
        finish within the grace period (``hurry``: don't wait for them)."""
        self._hurry = self._hurry or hurry
        self._stopping.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_up)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def arun(self) -> WorkerStats:
        """run() on the caller's event loop."""
        with tuned_gc() if self.tune_gc else contextlib.nullcontext():
            return await self._arun()

    async def _arun(self) -> WorkerStats:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._done_ready = asyncio.Event()
        try:
            await self._start()
        except BaseException:
            # Not started: leave no database thread behind.
            self._db.shutdown(wait=True)
            self._threads.shutdown(wait=False)
            raise
        self._install_signals()
        self.ready.set()
        listener = self._listen()
        runners = [asyncio.create_task(self._runner(), name=f"dibs-runner-{n}") for n in range(self.concurrency)]
        flusher = asyncio.create_task(self._flusher(), name="dibs-flusher")
        chores = [
            asyncio.create_task(self._heartbeats(), name="dibs-heartbeats"),
            asyncio.create_task(self._upkeep(), name="dibs-upkeep"),
            # Its row in dibs_workers, for `dibs status`: written now, beating, deleted as it stops.
            asyncio.create_task(keep_registered(self, self._call), name="dibs-registry"),
        ]
        log.info("worker %s started: queues %s, concurrency %d", self.name, ",".join(self.queues), self.concurrency)
        try:
            await self._fetch()
            await self._shut_down(runners)
        finally:
            for chore in chores:
                chore.cancel()
            await asyncio.gather(*chores, return_exceptions=True)
            # The flusher is not cancelled: a write of successes it has begun is waited for and counted.
            self._flushing = False
            assert self._done_ready is not None
            self._done_ready.set()
            await asyncio.gather(flusher, return_exceptions=True)
            await self._flush()
            if listener is not None:
                await self._call(listener.close)
            self._remove_signals()
            if self.metrics is not None:
                self.metrics.close()
            self._db.shutdown(wait=True)
            self._threads.shutdown(wait=False, cancel_futures=True)
        self.ready.clear()
        log.info("worker %s stopped: %s", self.name, self.stats)
        return self.stats

    async def _start(self) -> None:
        """Check the schema and record the periodic schedules. A connection dropped under the worker as it
        starts (a server-side kill, a failover) is tried again; a database that cannot be reached at all is
        an error for whoever started the worker to see."""
        for attempt in range(1, 4):
            try:
                await self._call(require_current, self.app.engine)
                await self._call(self.app.sync_periodic)
                break
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated or attempt == 3 or self.stopping:
                    raise
                log.warning("the connection dropped while the worker started, trying again: %s", error)
                await asyncio.sleep(0.1 * attempt)
        self._start_metrics()

    # -- fetching ----------------------------------------------------------------------------------

    async def _fetch(self) -> None:
        assert self._wake is not None
        idle_wait = 0.01
        while not self.stopping:
            # Cleared before the state is looked at (not when a wait begins): a notification or a finished
            # job that comes while a claim runs still cuts the wait after it short.
            self._wake.clear()
            idle = self._idle_runners()
            if idle == 0:
                # Every runner has a job: wait until one ends.
                await self._sleep(self.poll_seconds)
                continue
            started = time.perf_counter()
            try:
                claimed = await self._call(
                    self._store.claim,
                    self.app.engine,
                    owner=self.name,
                    lease_seconds=self.lease_seconds,
                    limit=min(idle, self.batch),
                    queues=self.queues,
                    tasks=self.task_names,
                    tags=self.tags,
                )
            except SchemaMissing as error:  # the tables were dropped: wait for `dibs init`, polling
                self._report(error)
                await self._sleep(self.poll_seconds)
                continue
            except Exception as error:  # the database is away or busy: try again, backing off
                log.warning("claim failed, trying again in %.1fs: %s", idle_wait, error)
                await self._sleep(idle_wait)
                idle_wait = min(max(idle_wait * 2, 0.1), self.poll_seconds)
                continue
            self._schema_reported = None
            if self.metrics is not None:
                self.metrics.claimed(len(claimed), time.perf_counter() - started)
            if self.stopping and claimed:
                await self._release(claimed)
                break
            self.stats.claimed += len(claimed)
            for lease in claimed:
                self._held[lease.key] = lease
            self._buffer.extend(claimed)
            if claimed:
                self._wake_runner()
                idle_wait = 0.01
                continue
            if self.burst and not self._held and not self._writing:
                left = await self._quietly(self._work_left)
                if left is not None and not any(left):
                    break
                if left is not None and not left.queued and not left.scheduled:
                    if await self._outlast_others():
                        break
                    continue
            # Idle: wait for a notification, a finished job, or the next poll, backing off.
            await self._sleep(idle_wait)
            idle_wait = min(idle_wait * 2, self.poll_seconds)

    def _idle_runners(self) -> int:
        """How many jobs a claim may take now: one for each runner with no job, less the jobs already
        claimed for them. A claim counts an attempt, so only jobs a runner takes at once are claimed: a
        job waiting in a worker that died would have lost an attempt without ever running."""
        return len(self._waiting) + self._starting - len(self._buffer)

    def _wake_runner(self) -> None:
        """Wake an idle runner for the buffered jobs, unless one is already on its way."""
        if self._buffer and not self._starting and self._waiting:
            self._starting += 1
            self._waiting.pop().set_result(True)

    async def _quietly(self, check: Callable[[], Awaitable[T]]) -> T | None:
        """``await check()``, or None when the database fails it (logged)."""
        try:
            return await check()
        except Exception as error:
            log.warning("could not check for remaining work: %s", error)
            return None

    async def _work_left(self) -> WorkLeft:
        """For burst mode: which jobs of ours (of our queues and tasks, untagged or of our tags) are queued,
        scheduled (a retry waiting for its time) or running; scheduled jobs whose time came are queued
        first."""
        left = await self._call(self._store.work_left, self.app.engine, self.queues, self.task_names, self.tags)
        if left.scheduled:
            promoted: int = await self._call(self._store.promote_due, self.app.engine)
            if promoted:
                return left._replace(queued=True)
        return left

    async def _outlast_others(self) -> bool:
        """For burst mode, when nothing is left but jobs running in other workers: wait until they have
        ended (True: stop) or left work behind (False: claim it; a failure to retry, a crashed worker's
        jobs recovered). Nothing tells when that happens, so it is looked for often, one probe at a time,
        for a burst to end soon after its last job instead of after a backoff grown long."""
        wait = min(BURST_END_POLL, self.poll_seconds)
        while not self.stopping:
            assert self._wake is not None
            self._wake.clear()
            await self._sleep(wait)
            wait = min(wait * BURST_END_POLL_GROWTH, BURST_END_POLL_MOST, self.poll_seconds)
            left = await self._quietly(self._work_left)
            if left is None or left.queued or left.scheduled:
                return False
            if not left.running:
                return True
        return False

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or until woken (since the wake-up was last cleared)."""
        assert self._wake is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _listen(self) -> Listener | None:
        # A burst worker stops once nothing is left: it has nothing to wait for.
        if not self.app.notify or self.burst:
            return None
        loop = self._loop
        assert loop is not None
        queues = set(self.queues)

        def woken(payload: str) -> None:
            if not payload or queues.intersection(payload.split(",")):
                loop.call_soon_threadsafe(self._wake_up)

        return self._store.backend.listen(self.app.engine, CHANNEL, woken)

    # -- running -----------------------------------------------------------------------------------

    async def _runner(self) -> None:
        assert self._loop is not None
        me = asyncio.current_task()
        while not self._closing:
            if not self._buffer:
                woken: asyncio.Future[bool] = self._loop.create_future()
                self._waiting.append(woken)
                self._wake_up()  # idle: the fetcher may claim a job for this runner
                if not await woken:
                    return
                self._starting -= 1
                continue
            lease = self._buffer.popleft()
            self._wake_runner()
            try:
                await self._run(lease, me)
            except Exception as error:
                # Writing the outcome failed (the database went away). The lease is no longer renewed, so
                # the job runs again once it expires: at least once, never lost.
                self._held.pop(lease.key, None)
                log.warning("could not record the outcome of job %s; it will run again: %s", lease.key[0], error)

    async def _run(self, lease: Lease, runner: asyncio.Task[Any] | None) -> None:
        if self._held.get(lease.key) is not lease:
            return  # its lease was lost before it started
        row = lease.row
        job_id: int = row[ID_AT]
        task = self.app.tasks.get(row[TASK_AT])
        if task is None:
            # The claim takes only this app's tasks by exact name; a database that compares names loosely
            # (a table not yet upgraded) must not make this worker run, or bury, another app's job.
            log.error("job %s is of task %r, which this worker does not have: given back", job_id, row[TASK_AT])
            await self._release([lease])
            return
        raw = row[ARGS_AT]
        args = {} if raw == "{}" else _decoded(raw)
        if isinstance(args, str):  # not arguments at all: written by something other than enqueue
            await self._reject(lease, task, f"the arguments stored for job {job_id} ({task.name}) {args}")
            return
        context = JobContext(job_id, task.name, row[ATTEMPTS_AT], args)
        running = _Running(lease, task, context, runner)
        self._running[job_id] = running
        kwargs = {**args, "context": context} if task.wants_context else args
        started = time.perf_counter()
        try:
            error, formatted = await self._execute(task, kwargs, context)
        finally:
            # Out of _running before anything else is awaited: a cancellation aimed at this job can no
            # longer land in the writes that record its outcome.
            self._running.pop(job_id, None)
        if self.metrics is not None:
            self.metrics.ran(task.name, time.perf_counter() - started)
        misfit = task.misfit(kwargs) if isinstance(error, TypeError) else None
        if misfit is not None:
            # The function was never entered: running it again with the same arguments cannot succeed.
            await self._reject(
                lease,
                task,
                f"the arguments of job {job_id} do not fit task {task.name!r}, which takes {task.parameters}: {misfit}",
            )
            return
        if error is None and context.stop_reason == "cancelled":
            error = asyncio.CancelledError("cancelled")
        if error is not None:
            await self._failed(running, error, formatted)
            return
        self._done.append(lease)
        assert self._done_ready is not None
        self._done_ready.set()

    async def _execute(
        self, task: Task, kwargs: dict[str, Any], context: JobContext
    ) -> tuple[BaseException | None, str]:
        """Run the task's function; returns what it raised (None if it returned) and the traceback."""
        began = time.monotonic()
        try:
            if task.is_async:
                if task.timeout is None:
                    await task.function(**kwargs)
                else:
                    await asyncio.wait_for(task.function(**kwargs), task.timeout)
            else:
                assert self._loop is not None
                call = self._loop.run_in_executor(self._threads, lambda: task.function(**kwargs))
                if task.timeout is not None:
                    await asyncio.wait({call}, timeout=task.timeout)
                    if not call.done():
                        # A thread cannot be stopped from outside: the job is asked to stop and keeps its
                        # lease (renewed) until its function returns, so it never runs twice at once.
                        context.stop("timeout")
                        with contextlib.suppress(Exception):
                            await call
                        raise TimeoutError(f"the job ran longer than its timeout of {task.timeout:g} seconds")
                await call
        except asyncio.CancelledError:
            # Only async jobs are cancelled on purpose (cancel, lease lost, shutdown); anything else is the
            # loop itself going away.
            if context.stop_reason is None or not task.is_async:
                raise
            self._uncancel()
            return asyncio.CancelledError(context.stop_reason), ""
        except asyncio.TimeoutError as error:
            # Since Python 3.11 wait_for's TimeoutError and one the job raised itself (a socket's, an inner
            # wait_for's) are the same class; only wait_for's comes at the job's time limit.
            if context.stop_reason == "timeout":
                return error, ""
            if task.timeout is None or time.monotonic() - began < task.timeout - 0.05:
                return error, traceback.format_exc()
            context.stop("timeout")
            return TimeoutError(f"the job ran longer than its timeout of {task.timeout:g} seconds"), ""
        except Exception as error:
            return error, traceback.format_exc()
        return None, ""

    @staticmethod
    def _uncancel() -> None:
        current = asyncio.current_task()
        if current is not None and hasattr(current, "uncancel"):
            current.uncancel()

    async def _reject(self, lease: Lease, task: Task, problem: str) -> None:
        """Bury a job that can never run as stored (its arguments are not a JSON object, or do not fit the
        function): dead at once, without retries, with the problem as its error."""
        self._held.pop(lease.key, None)
        error = InvalidArgument(f"{problem}; enqueue it again with arguments that fit")
        if not await self._call(self._store.bury, self.app.engine, lease, error_text(error, "")):
            self.stats.lost += 1
            return
        self.stats.dead += 1
        if self.metrics is not None:
            self.metrics.finished(task.name, "dead")
        log.warning("job %s (%s) dead, it cannot run: %s", lease.key[0], task.name, error)

    async def _failed(self, running: _Running, error: BaseException, formatted: str) -> None:
        lease, task = running.lease, running.task
        self._held.pop(lease.key, None)
        reason = running.context.stop_reason
        if reason not in ("lease lost", "cancelled"):
            requested: set[int] = await self._call(self._store.cancel_requests, self.app.engine, [lease.key[0]])
            if requested:
                reason = "cancelled"  # asked to cancel before a heartbeat told this worker: no retry
        attempts = lease.row._mapping["attempts"]
        outcome = failed_outcome(reason, attempts, lease.row._mapping["max_attempts"], task.retry.retries(error))
        if outcome is Outcome.LOST:
            self.stats.lost += 1
            return
        if not await self._record(outcome, lease, task, error_text(error, formatted)):
            self.stats.lost += 1
            return
        setattr(self.stats, outcome.value, getattr(self.stats, outcome.value) + 1)
        if self.metrics is not None:
            self.metrics.finished(task.name, outcome.value)
        log.log(
            logging.WARNING if outcome is Outcome.DEAD else logging.INFO,
            "job %s (%s) attempt %d %s: %s",
            lease.key[0],
            task.name,
            attempts,
            outcome.value,
            f"{type(error).__name__}: {error}",
        )

    async def _record(self, outcome: Outcome, lease: Lease, task: Task, text: str) -> bool:
        """Write a failed run's outcome, fenced by its lease; False if the lease was lost meanwhile."""
        engine = self.app.engine
        if outcome is Outcome.CANCELLED:
            return await self._call(self._store.bury, engine, lease, text, CANCELLED)
        if outcome is Outcome.RETRIED:
            delay = task.retry.delay(lease.row._mapping["attempts"])
            return await self._call(self._store.retry, engine, lease, delay, text)
        if outcome is Outcome.RELEASED:
            return not await self._call(self._store.release, engine, [lease])
        return await self._call(self._store.bury, engine, lease, text)

    # -- finishing ---------------------------------------------------------------------------------

    async def _flusher(self) -> None:
        assert self._done_ready is not None
        while self._flushing:
            await self._done_ready.wait()
            self._done_ready.clear()
            await self._flush()

    async def _flush(self) -> None:
        if not self._done:
            return
        done, self._done = self._done, []
        for lease in done:
            self._held.pop(lease.key, None)
        self._writing += 1
        try:
            try:
                lost = await self._call(self._store.succeed, self.app.engine, done)
            finally:
                self._writing -= 1
        except Exception as error:
            # Kept (and renewed) until a later flush records them.
            if not self._report(error):
                log.warning("recording %d successes failed, will try again: %s", len(done), error)
            for lease in done:
                self._held[lease.key] = lease
            self._done.extend(done)
            await asyncio.sleep(0.5)
            # Try again even if no other job finishes to wake the flusher (these may have been the last).
            assert self._done_ready is not None
            self._done_ready.set()
            return
        self.stats.succeeded += len(done) - len(lost)
        self.stats.lost += len(lost)
        if self.metrics is not None:
            # By key and token: after an outage a batch may hold a job's stale lease and its newer one.
            lost_leases = {(lease.key, lease.token) for lease in lost}
            per_task = Counter(
                lease.row._mapping["task"] for lease in done if (lease.key, lease.token) not in lost_leases
            )
            for task_name, count in per_task.items():
                self.metrics.finished(task_name, "succeeded", count)
        for lease in lost:
            log.warning(
                "job %s finished, but its lease had been taken over: the outcome was not recorded", lease.key[0]
            )
        self._wake_up()

    async def _release(self, leases: list[Lease]) -> None:
        if not leases:
            return
        for lease in leases:
            self._held.pop(lease.key, None)
        try:
            lost = await self._call(self._store.release, self.app.engine, leases)
        except Exception as error:
            # The database is away as the worker stops: the shutdown goes on (running jobs still get their
            # grace), and these jobs are taken again once their leases expire.
            log.warning(
                "could not give back %d unstarted jobs; they run once their leases expire: %s", len(leases), error
            )
            return
        self.stats.released += len(leases) - len(lost)

    # -- heartbeats and upkeep ---------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await self._heartbeat()
            except Exception as error:  # tried again at the next beat, well before the leases expire
                if not self._report(error):
                    log.warning("heartbeat failed, will try again: %s", error)

    async def _heartbeat(self) -> None:
        held = list(self._held.values())
        if held:
            lost = await self._call(self._store.renew, self.app.engine, held, self.lease_seconds)
            for lease in lost:
                self._lose(lease)
        running = list(self._running)
        if running:
            for job_id in await self._call(self._store.cancel_requests, self.app.engine, running):
                self._interrupt(job_id, "cancelled")

    def _lose(self, lease: Lease) -> None:
        if self._held.get(lease.key) is not lease:
            return  # finished (or claimed anew) while the renewal ran: nothing was lost
        log.warning("lost the lease on job %s (it expired and was taken over); stopping it here", lease.key[0])
        self._held.pop(lease.key, None)
        self._interrupt(lease.key[0], "lease lost")

    def _interrupt(self, job_id: int, reason: str) -> None:
        running = self._running.get(job_id)
        if running is None:
            return
        running.context.stop(reason)
        if running.task.is_async and running.runner is not None:
            running.runner.cancel()

    async def _upkeep(self) -> None:
        last_purge = 0.0
        while True:
            try:
                if await self._call(self._store.promote_due, self.app.engine):
                    self._wake_up()
                enqueued = await self._call(self.app.enqueue_periodic) if self.app.schedules else 0
                if enqueued:
                    self._wake_up()
                requeued, dead = await self._call(self._store.recover_expired, self.app.engine)
                if requeued or dead:
                    log.warning(
                        "recovered %d jobs of workers that stopped renewing their lease (%d dead)", requeued, dead
                    )
                    self._wake_up()
                if self.retention is not None and time.monotonic() - last_purge > 60:
                    last_purge = time.monotonic()
                    await self._call(self.app.purge, older_than=self.retention)
                if self.metrics is not None:
                    self.metrics.observe(await self._call(self.app.status))
            except Exception as error:
                if not self._report(error):
                    log.warning("upkeep failed, will try again: %s", error)
            await asyncio.sleep(self.upkeep_seconds)

    # -- shutdown ----------------------------------------------------------------------------------

    async def _shut_down(self, runners: list[asyncio.Task[Any]]) -> None:
        # Jobs of a claim that came back as the worker stopped, not yet started: given back at once.
        unstarted = list(self._buffer)
        self._buffer.clear()
        await self._release(unstarted)
        # Runners idle now end; the others end when their job does.
        self._closing = True
        for woken in self._waiting:
            woken.set_result(False)
        self._waiting.clear()
        deadline = time.monotonic() + (0 if self._hurry else self.grace_seconds)
        while self._running and time.monotonic() < deadline and not self._hurry:
            await asyncio.sleep(0.05)
        for job_id in list(self._running):
            self._interrupt(job_id, "shutdown")
        await asyncio.wait(runners, timeout=1.0)
        self.abandoned = sum(1 for running in self._running.values() if not running.task.is_async)
        await self._flush()
        # Sync jobs still running past the grace period cannot be stopped from here: their leases are no
        # longer renewed, so another worker may run them again once they expire. `dibs worker` ends its
        # process at this point, which stops them.

    def _install_signals(self) -> None:
        self._signals(install=True)

    def _on_signal(self, signum: int) -> None:
        log.info("worker %s got %s: stopping", self.name, signal.Signals(signum).name)
        # A second signal means: don't wait for running jobs.
        self.stop(hurry=self.stopping)

    def _remove_signals(self) -> None:
        self._signals(install=False)

    def _signals(self, *, install: bool) -> None:
        """SIGTERM and SIGINT stop the worker, when it runs in the main thread and was asked to."""
        if self.handle_signals:
            assert self._loop is not None
            handle_stop_signals(self._loop, self._on_signal, install=install)

    def _start_metrics(self) -> None:
        if self.metrics_port is None:
            return
        self.metrics = Metrics.serve(self.metrics_port, self.metrics_address)

    def _report(self, error: Exception) -> bool:
        """Log that the dibs tables are missing, once a minute while they are; False for any other error."""
        if not isinstance(error, SchemaMissing):
            return False
        now = time.monotonic()
        if self._schema_reported is None or now - self._schema_reported > 60:
            self._schema_reported = now
            log.error("worker %s cannot reach its jobs, and keeps trying: %s", self.name, error)
        return True

    async def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking database call on the worker's database threads; a failure because the dibs tables
        are missing raises SchemaMissing, saying what to run."""
        assert self._loop is not None
        try:
            return await self._loop.run_in_executor(self._db, lambda: function(*args, **kwargs))
        except sa.exc.DBAPIError as error:
            problem = await self._loop.run_in_executor(self._db, translated, error, self.app.engine)
            if problem is error:
                raise
            raise problem from error
