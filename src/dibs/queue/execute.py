"""Running jobs: ``concurrency`` runners each take the next claimed job and run its task's function, async
ones on the loop and sync ones in a thread pool, within the task's timeout; a job is stopped when it is
cancelled, its lease is lost, or the worker shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from dibs.lease import Lease
from dibs.metrics import Metrics
from dibs.queue.arguments_json import SCAN_JSON
from dibs.queue.fetch import ClaimedJobs
from dibs.queue.job import JobContext
from dibs.queue.progress import ProgressWrites
from dibs.queue.store import ARGS_AT, ATTEMPTS_AT, HAS_PARENTS_AT, HEADERS_AT, ID_AT, QUEUE_AT, TASK_AT
from dibs.queue.task import Task
from dibs.queue.transactional import Ran, TransactionalContext, Transactions
from dibs.queue.typed_arguments import Mismatch
from dibs.queue.writes import JobWrites
from dibs.tracing import Tracing, active

log = logging.getLogger("dibs.worker")

#: What a run raised (None: it returned), its formatted traceback ("" when it says nothing more), and what
#: it returned.
Raised = tuple[BaseException | None, str, Any]


@dataclass
class _Running:
    lease: Lease
    task: Task
    context: JobContext
    runner: asyncio.Task[Any] | None


def decoded(raw: str) -> dict[str, Any] | str:
    """A job's stored arguments, or what is wrong with them."""
    try:
        args, end = SCAN_JSON(raw, 0)
    except (StopIteration, ValueError, TypeError):
        end = -1
    if end != len(raw):  # whitespace around it, more after it, or not JSON: json.loads decides, and says why
        try:
            args = json.loads(raw)
        except ValueError as exc:
            return f"are not valid JSON ({exc})"
    if not isinstance(args, dict):
        kind = "null" if args is None else f"a {type(args).__name__}"
        return f"are not a JSON object of argument names but {kind}"
    return args


def timed_out(task: Task) -> TimeoutError:
    """The error of a run stopped at its task's time limit."""
    return TimeoutError(f"the job ran longer than its timeout of {task.timeout:g} seconds")


class Runners:
    """The runners of one worker and the jobs they run now.

    Args:
        tasks: The app's tasks, by name.
        concurrency: Runners, and so jobs run at once (and threads for sync jobs).
        jobs: Where they take claimed jobs from.
        writes: Where they record what became of each.
    """

    def __init__(
        self,
        *,
        tasks: Mapping[str, Task],
        concurrency: int,
        jobs: ClaimedJobs,
        writes: JobWrites,
        async_options: Mapping[str, Any],
    ) -> None:
        self.tasks = tasks
        self.concurrency = concurrency
        self.jobs = jobs
        self.writes = writes
        #: The jobs running now, by id.
        self.running: dict[int, _Running] = {}
        #: Prometheus metrics, when the worker serves them.
        self.metrics: Metrics | None = None
        self._held, self._drop = writes.keeper.held, writes.keeper.drop
        self._succeeded = writes.successes.add
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix="dibs-task")
        #: Where transactional tasks write.
        self.transactions = Transactions(writes.engine, writes.store, async_options)
        #: What the running jobs report of their progress, written once a second.
        self.progress = ProgressWrites(writes.shared, self._lease_of)
        # Decided once: without the OpenTelemetry API a run costs one comparison more, nothing else.
        self._tracing = active()

    def _lease_of(self, context: JobContext) -> Lease | None:
        """The lease of the job this context belongs to, while it runs here."""
        running = self.running.get(context.job_id)
        return running.lease if running is not None and running.context is context else None

    def start(self) -> list[asyncio.Task[None]]:
        """Start the runners on the running loop."""
        return [asyncio.create_task(self._runner(), name=f"dibs-runner-{n}") for n in range(self.concurrency)]

    def interrupt(self, job_id: int, reason: str) -> None:
        """Ask a running job to stop (``reason``: ``cancelled``, ``lease lost``, ``shutdown``); an async one is
        cancelled, a sync one sees it in its context."""
        running = self.running.get(job_id)
        if running is None:
            return
        if running.context.stop(reason) and running.task.is_async and running.runner is not None:
            running.runner.cancel()

    async def stop(self, runners: list[asyncio.Task[None]], *, grace: float, hurry: Any) -> int:
        """Let running jobs finish within ``grace`` seconds (none if ``hurry()`` says so), stop the rest, and
        return how many sync jobs are still running in their threads (they cannot be stopped from here)."""
        self.jobs.close()
        deadline = time.monotonic() + (0 if hurry() else grace)
        while self.running and time.monotonic() < deadline and not hurry():
            await asyncio.sleep(0.05)
        for job_id in list(self.running):
            self.interrupt(job_id, "shutdown")
        await asyncio.wait(runners, timeout=1.0)
        return sum(1 for running in self.running.values() if not running.task.is_async)

    def shutdown(self) -> None:
        """Let the threads of sync jobs go, without waiting for them."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _runner(self) -> None:
        me = asyncio.current_task()
        jobs = self.jobs
        while not jobs.closing:
            lease = jobs.next()
            if lease is None:
                if not await jobs.idle():
                    return
                continue
            try:
                await self._run(lease, me)
            except Exception as error:
                # Writing the outcome failed (the database went away). The lease is no longer renewed, so
                # the job runs again once it expires: at least once, never lost.
                self._drop(lease)
                log.warning("could not record the outcome of job %s; it will run again: %s", lease.key[0], error)

    async def _run(self, lease: Lease, runner: asyncio.Task[Any] | None) -> None:
        if self._held.get(lease.key) is not lease:
            return  # its lease was lost before it started
        row = lease.row
        job_id: int = row[ID_AT]
        task = self.tasks.get(row[TASK_AT])
        if task is None:
            # The claim takes only this app's tasks by exact name; a database that compares names loosely
            # (a table not yet upgraded) must not make this worker run, or bury, another app's job.
            log.error("job %s is of task %r, which this worker does not have: given back", job_id, row[TASK_AT])
            await self.writes.release([lease])
            return
        args = decoded(row[ARGS_AT])
        if isinstance(args, str):  # not arguments at all: written by something other than enqueue
            await self.writes.reject(lease, task, f"the arguments stored for job {job_id} ({task.name}) {args}")
            return
        context = (TransactionalContext if task.transactional else JobContext)(
            job_id, task.name, row[ATTEMPTS_AT], args
        )
        if task.typed:
            try:
                args = task.loaded(args)
            except Mismatch as exc:  # the task's annotations changed since the job was enqueued
                await self.writes.reject(
                    lease, task, f"the arguments of job {job_id} do not fit task {task.name!r}: {exc}"
                )
                return
        if task.wants_context:
            context.reports_to(self.progress.mark)
        if row[HAS_PARENTS_AT] is not None:  # it waited for other jobs: their results, read once
            writes = self.writes
            context.parent_results = await writes.threads.call(writes.store.parent_results, writes.engine, job_id)
        self.running[job_id] = mine = _Running(lease, task, context, runner)
        kwargs = {**args, "context": context} if task.wants_context else args
        function = task.function
        if task.transactional:
            function = self.transactions.call(lease, function, task.is_async, context)
        logged, tracing = self.jobs.logging, self._tracing
        if logged:
            log.info("job %s (%s) attempt %d started", job_id, task.name, context.attempt, extra=_fields(row))
        started = time.perf_counter()
        try:
            if tracing is None:
                raised = await self._execute(task, function, kwargs, context)
            else:
                raised = await self._traced(tracing, task, function, kwargs, context, row)
        finally:
            # Out of `running` before anything else is awaited: a cancellation aimed at this job can no
            # longer land in the writes that record its outcome. Only this run: one that claimed the job
            # again after this run's lease expired is still running.
            if self.running.get(job_id) is mine:
                del self.running[job_id]
        duration = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.ran(task.name, duration)
        await self._finished(lease, task, kwargs, context, raised, (duration, logged))

    async def _traced(
        self,
        tracing: Tracing,
        task: Task,
        function: Callable[..., Any],
        kwargs: dict[str, Any],
        context: JobContext,
        row: Any,
    ) -> Raised:
        """:meth:`_execute` inside the run's span, which a sync function's thread sees as current too."""
        with tracing.run(context.job_id, task.name, row[QUEUE_AT], context.attempt, row[HEADERS_AT]) as span:
            if not task.is_async:
                function = partial(contextvars.copy_context().run, function)
            raised = await self._execute(task, function, kwargs, context)
            tracing.ran(span, raised[0])
            return raised

    async def _finished(
        self,
        lease: Lease,
        task: Task,
        kwargs: dict[str, Any],
        context: JobContext,
        raised: Raised,
        timed: tuple[float, bool],
    ) -> None:
        """Record what became of a run: what it raised (None if it returned), its traceback, what it returned;
        ``timed``: how long it ran, in seconds, and whether its success is logged."""
        error, formatted, returned = raised
        duration, logged = timed
        job_id = lease.key[0]
        if task.transactional and error is None:
            await self._transacted(lease, task, context, returned, timed)
            return
        if error is None and context.stop_reason != "cancelled":
            if logged:
                _succeeded(lease, context, duration)
            if returned is None:
                self._succeeded(lease)
            else:
                await self.writes.succeeded_with(lease, task, returned)
            return
        misfit = task.misfit(kwargs) if isinstance(error, TypeError) else None
        if misfit is not None:
            # The function was never entered: running it again with the same arguments cannot succeed.
            problem = f"the arguments of job {job_id} do not fit task {task.name!r}, which takes {task.parameters}"
            await self.writes.reject(lease, task, f"{problem}: {misfit}")
            return
        stopped = error if error is not None else asyncio.CancelledError("cancelled")
        await self.writes.failed(lease, task, context.stop_reason, stopped, formatted, duration)

    async def _transacted(
        self, lease: Lease, task: Task, context: JobContext, ran: Ran, timed: tuple[float, bool]
    ) -> None:
        """Record how a transactional run whose function returned ended (its completion, if it committed,
        was written in its transaction); ``timed`` as for :meth:`_finished`."""
        duration, logged = timed
        if ran.ending == "committed":
            if logged:
                _succeeded(lease, context, duration)
            self.writes.committed(lease, task)
        elif ran.ending == "lost":
            self.writes.fenced_out(lease)
        elif ran.problem is not None:
            await self.writes.unkept(lease, task, ran.problem)
        else:
            reason = context.stop_reason
            stopped = timed_out(task) if reason == "timeout" else asyncio.CancelledError(reason)
            await self.writes.failed(lease, task, reason, stopped, "", duration)

    async def _execute(
        self, task: Task, function: Callable[..., Any], kwargs: dict[str, Any], context: JobContext
    ) -> Raised:
        """Run the task's function (or ``function`` standing for it); returns what it raised (None if it
        returned), the traceback, and what it returned."""
        began = time.monotonic()
        try:
            if task.is_async:
                if task.timeout is None:
                    returned = await function(**kwargs)
                else:
                    returned = await asyncio.wait_for(function(**kwargs), task.timeout)
            else:
                # Inline rather than a helper: a sync job's run is the hot path, and a helper coroutine would
                # cost one more object per job.
                call = asyncio.get_running_loop().run_in_executor(self._threads, lambda: function(**kwargs))
                if task.timeout is not None:
                    await asyncio.wait({call}, timeout=task.timeout)
                    # A thread cannot be stopped from outside: the job is asked to stop and keeps its
                    # lease (renewed) until its function returns, so it never runs twice at once. A
                    # transactional job that is committing already cannot be stopped: it finishes.
                    if not call.done() and context.stop("timeout"):
                        with contextlib.suppress(Exception):
                            await call
                        raise timed_out(task)
                returned = await call
        except asyncio.CancelledError:
            # Only async jobs are cancelled on purpose (cancel, lease lost, shutdown); anything else is the
            # loop itself going away.
            if context.stop_reason is None or not task.is_async:
                raise
            _uncancel()
            return asyncio.CancelledError(context.stop_reason), "", None
        except asyncio.TimeoutError as error:
            # Since Python 3.11 wait_for's TimeoutError and one the job raised itself (a socket's, an inner
            # wait_for's) are the same class; only wait_for's comes at the job's time limit.
            if context.stop_reason == "timeout":
                return error, "", None
            if task.timeout is None or time.monotonic() - began < task.timeout - 0.05:
                return error, traceback.format_exc(), None
            context.stop("timeout")
            return timed_out(task), "", None
        except Exception as error:
            return error, traceback.format_exc(), None
        return None, "", returned


def _fields(row: Any) -> dict[str, Any]:
    """What a log line of a job's run carries for log shippers (``--log-format json``)."""
    return {"job_id": row[ID_AT], "task": row[TASK_AT], "attempt": row[ATTEMPTS_AT], "queue": row[QUEUE_AT]}


def _succeeded(lease: Lease, context: JobContext, duration: float) -> None:
    """Log a run that succeeded."""
    extra = {**_fields(lease.row), "duration": round(duration, 6), "outcome": "succeeded"}
    message = "job %s (%s) attempt %d succeeded in %.3f s"
    log.info(message, context.job_id, context.task, context.attempt, duration, extra=extra)


def _uncancel() -> None:
    current = asyncio.current_task()
    if current is not None and hasattr(current, "uncancel"):
        current.uncancel()
