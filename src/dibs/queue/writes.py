"""A worker's writes of what became of its jobs, each fenced by the job's lease.

Successes are many and alike: they go to a :class:`~dibs.runtime.BatchWriter` and are written together,
one statement per batch (and, for the jobs that returned a value, one executemany of their results before
it, in the same transaction). Failures are few and each different (a retry has its own delay, a dead job
its own error): each is written alone, after :func:`~dibs.queue.outcome.failed_outcome` decided what it
becomes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from dibs._errors import InvalidArgument, SchemaMissing
from dibs.lease import Lease
from dibs.metrics import Metrics
from dibs.queue.outcome import Outcome, failed_outcome
from dibs.queue.results import encoded_result
from dibs.queue.stage import Shared
from dibs.queue.store import HAS_CHILDREN_AT, error_text
from dibs.queue.task import Task
from dibs.runtime import BatchWriter
from dibs.schema import CANCELLED

log = logging.getLogger("dibs.worker")


class JobWrites:
    """Records jobs' outcomes for one worker: successes in batches, failures one by one.

    Args:
        shared: The worker's parts. A job's lease is dropped from its keeper as its outcome is written, and
            held again if the write fails (it is tried again later); its wakeup is woken when a batch of
            successes is written (runners are free for more jobs).
    """

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.store, self.engine, self.threads = shared.store, shared.engine, shared.threads
        self.keeper, self.stats = shared.keeper, shared.stats
        #: Prometheus metrics, when the worker serves them.
        self.metrics: Metrics | None = None
        self.successes: BatchWriter[Lease] = BatchWriter(self.write_successes, failed=self._not_written)
        #: The JSON results of the successes waiting for their batch, by job id and lease token.
        self.results: dict[tuple[int, int], str] = {}
        #: Outcomes being written one by one now (with the jobs waiting for them settled): a burst worker
        #: does not end while one may still queue a job.
        self.recording = 0

    # -- successes ---------------------------------------------------------------------------------------

    async def write_successes(self, done: list[Lease]) -> None:
        """Record these jobs as succeeded in one write; a job whose lease was taken over is counted lost."""
        drop = self.keeper.drop
        for lease in done:
            drop(lease)
        pending = self.results
        # Looked up only when some success of the worker returned a value: a None costs nothing here.
        results = (
            [(lease, pending[lease.key[0], lease.token]) for lease in done if (lease.key[0], lease.token) in pending]
            if pending
            else []
        )
        try:
            lost = await self.threads.call(self.store.succeed, self.engine, done, results)
        except SchemaMissing:
            # The jobs table was dropped, and these rows with it. Kept, the writes would land in a table made
            # again, whose new jobs reuse their ids and tokens, and mark them succeeded unrun: they are lost.
            for lease, _ in results:
                del pending[lease.key[0], lease.token]
            self.stats.lost += len(done)
            log.warning("the successes of %d jobs were not recorded: the jobs table was dropped", len(done))
            return
        except Exception:
            # Kept, and renewed, until a later flush records them (with their results).
            self.keeper.keep(done)
            raise
        for lease, _ in results:
            del pending[lease.key[0], lease.token]
        self.stats.succeeded += len(done) - len(lost)
        self.stats.lost += len(lost)
        await self._settle(done, lost)
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
        self.shared.wakeup.wake()

    async def succeeded_with(self, lease: Lease, task: Task, returned: object) -> None:
        """Record a success whose task returned a value: the result goes with the completion in the next batch.
        A result that is not JSON, or too large, makes the job dead with that error, and nothing else stored."""
        try:
            text = encoded_result(returned)
        except InvalidArgument as problem:
            await self.unkept(lease, task, problem)
            return
        self.results[lease.key[0], lease.token] = text
        self.successes.add(lease)

    async def _unkept(self, lease: Lease, task: Task, problem: InvalidArgument) -> None:
        self.keeper.drop(lease)
        if not await self.threads.call(self.store.bury, self.engine, lease, error_text(problem, "")):
            self.stats.lost += 1
            return
        self.stats.dead += 1
        if self.metrics is not None:
            self.metrics.finished(task.name, "dead")
        log.warning("job %s (%s) dead, its result cannot be kept: %s", lease.key[0], task.name, problem)
        await self._settle([lease])

    async def unkept(self, lease: Lease, task: Task, problem: InvalidArgument) -> None:
        """Record a run whose result cannot be kept (not JSON, or too large): dead, with that error."""
        self.recording += 1
        try:
            await self._unkept(lease, task, problem)
        finally:
            self.recording -= 1

    def committed(self, lease: Lease, task: Task) -> None:
        """Count a transactional job whose completion committed with its writes (its children settled in
        that transaction)."""
        self.keeper.drop(lease)
        self.stats.succeeded += 1
        if self.metrics is not None:
            self.metrics.finished(task.name, "succeeded")
        self.shared.wakeup.wake()

    def fenced_out(self, lease: Lease) -> None:
        """Count a transactional job whose lease was taken over before it committed: its writes rolled back."""
        self.keeper.drop(lease)
        self.stats.lost += 1
        log.warning("job %s finished, but its lease had been taken over: its writes were rolled back", lease.key[0])

    async def _settle(self, finished: list[Lease], lost: Sequence[Lease] = ()) -> None:
        """Queue or cancel the jobs waiting for these finished ones (but the ``lost``), if they had any when
        claimed (upkeep settles the rest: jobs that gained a child while they ran, or whose worker died in
        between). One pass over the batch; the lost are looked at only for a job that had children."""
        parents = [lease.key[0] for lease in finished if lease.row[HAS_CHILDREN_AT] and lease not in lost]
        if parents:
            try:
                await self.threads.call(self.store.settle_children, self.engine, parents)
            except Exception as error:
                log.warning(
                    "could not queue the jobs waiting for %d finished jobs; upkeep will: %s", len(parents), error
                )
            self.shared.wakeup.wake()

    def _not_written(self, error: Exception, done: list[Lease]) -> None:
        if not self.shared.missing.report(error):
            log.warning("recording %d successes failed, will try again: %s", len(done), error)

    # -- failures ----------------------------------------------------------------------------------------

    async def failed(
        self, lease: Lease, task: Task, reason: str | None, error: BaseException, formatted: str, duration: float = 0.0
    ) -> None:
        """Record a run that raised or was stopped (``reason``: why the worker stopped it, if it did) after
        ``duration`` seconds."""
        self.recording += 1
        try:
            await self._failed(lease, task, reason, error, formatted, duration)
        finally:
            self.recording -= 1

    async def _failed(
        self, lease: Lease, task: Task, reason: str | None, error: BaseException, formatted: str, duration: float
    ) -> None:
        self.keeper.drop(lease)
        if reason not in ("lease lost", "cancelled"):
            requested = await self.threads.call(self.store.cancel_requests, self.engine, [lease.key[0]])
            if requested:
                reason = "cancelled"  # asked to cancel before a heartbeat told this worker: no retry
        mapping = lease.row._mapping
        attempts = mapping["attempts"]
        outcome = failed_outcome(reason, attempts, mapping["max_attempts"], task.retry.retries(error))
        if outcome is Outcome.LOST or not await self._record(outcome, lease, task, error_text(error, formatted)):
            self.stats.lost += 1
            return
        setattr(self.stats, outcome.value, getattr(self.stats, outcome.value) + 1)
        if outcome in (Outcome.DEAD, Outcome.CANCELLED):
            await self._settle([lease])
        if self.metrics is not None:
            self.metrics.finished(task.name, outcome.value)
        fields = {"job_id": lease.key[0], "task": task.name, "attempt": attempts, "queue": mapping["queue"]}
        log.log(
            logging.WARNING if outcome is Outcome.DEAD else logging.INFO,
            "job %s (%s) attempt %d %s in %.3f s: %s",
            lease.key[0],
            task.name,
            attempts,
            outcome.value,
            duration,
            f"{type(error).__name__}: {error}",
            extra={**fields, "duration": round(duration, 6), "outcome": outcome.value, "error": type(error).__name__},
        )

    async def _record(self, outcome: Outcome, lease: Lease, task: Task, text: str) -> bool:
        """Write a failed run's outcome, fenced by its lease; False if the lease was lost meanwhile."""
        call, store, engine = self.threads.call, self.store, self.engine
        if outcome is Outcome.CANCELLED:
            return await call(store.bury, engine, lease, text, CANCELLED)
        if outcome is Outcome.RETRIED:
            return await call(store.retry, engine, lease, task.retry.delay(lease.row._mapping["attempts"]), text)
        if outcome is Outcome.RELEASED:
            return not await call(store.release, engine, [lease])
        return await call(store.bury, engine, lease, text)

    async def reject(self, lease: Lease, task: Task, problem: str) -> None:
        """Bury a job that can never run as stored (its arguments are not a JSON object, or do not fit the
        function): dead at once, without retries, with the problem as its error."""
        self.keeper.drop(lease)
        error = InvalidArgument(f"{problem}; enqueue it again with arguments that fit")
        if not await self.threads.call(self.store.bury, self.engine, lease, error_text(error, "")):
            self.stats.lost += 1
            return
        self.stats.dead += 1
        if self.metrics is not None:
            self.metrics.finished(task.name, "dead")
        log.warning("job %s (%s) dead, it cannot run: %s", lease.key[0], task.name, error)
        await self._settle([lease])

    # -- giving back -------------------------------------------------------------------------------------

    async def release(self, leases: Sequence[Lease]) -> None:
        """Give unstarted jobs back at once, with no attempt spent (a failure leaves them to their leases)."""
        if not leases:
            return
        drop = self.keeper.drop
        for lease in leases:
            drop(lease)
        try:
            lost = await self.threads.call(self.store.release, self.engine, list(leases))
        except Exception as error:
            # The database is away as the worker stops: the shutdown goes on (running jobs still get their
            # grace), and these jobs are taken again once their leases expire.
            log.warning(
                "could not give back %d unstarted jobs; they run once their leases expire: %s", len(leases), error
            )
            return
        self.stats.released += len(leases) - len(lost)
