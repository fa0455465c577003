"""Fetching jobs: claimed in batches into a buffer the runners take from, and the end of a burst.

A claim takes at most as many jobs as there are idle runners, so that every job claimed starts at once (a
claim counts an attempt: a job must not lose one waiting behind others in a worker that then dies). When
nothing is runnable the fetcher waits for a notification, a finished job, or the next poll, backing off
while idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from dibs._errors import SchemaMissing
from dibs.lease import Lease
from dibs.metrics import Metrics
from dibs.queue.maintenance import WorkLeft
from dibs.queue.settings import WorkerSettings
from dibs.queue.stage import Shared
from dibs.queue.store import HEADERS_AT
from dibs.queue.writes import JobWrites
from dibs.runtime import Backoff, Wakeup
from dibs.tracing import active

log = logging.getLogger("dibs.worker")

#: Seconds between looks of a burst worker that has nothing left to do but wait for jobs running in other
#: workers to end (it stays until they have: a failed one is retried, a crashed worker's is recovered):
#: the first wait, grown by half at each look up to the second (or the worker's poll, if shorter). Workers
#: draining one backlog end within tens of milliseconds of each other, and each look is one read of three
#: indexes, so the first looks come quickly; many burst workers behind one long job still do not probe the
#: database more than a few times a second each.
BURST_END_POLL = 0.01
BURST_END_POLL_GROWTH = 1.5
BURST_END_POLL_MOST = 0.4
#: The first wait of an idle fetcher, doubled at each empty claim up to the worker's poll.
IDLE_FIRST_WAIT = 0.01
#: The shortest wait after a claim failed: a database that is away is not asked again at once.
FAILED_CLAIM_WAIT = 0.1


class ClaimedJobs:
    """The jobs claimed and not yet started, and the runners idle for them.

    A runner that takes a job and finds more left wakes one more runner, so that a job that waits (for I/O,
    or in a thread) holds up no other; jobs that never wait are run back to back by the runner already awake,
    without a switch each.

    Args:
        wakeup: Woken when a runner goes idle: the fetcher may claim a job for it.
    """

    def __init__(self, wakeup: Wakeup) -> None:
        self.buffer: deque[Lease] = deque()
        #: Set as the worker stops: idle runners end, and take no more jobs.
        self.closing = False
        self._wakeup = wakeup
        self._waiting: list[asyncio.Future[bool]] = []  # idle runners' wake-ups (False: shut down)
        self._starting = 0  # runners woken and not yet running
        #: Whether runs are logged (INFO on ``dibs.worker``): looked at once per claimed batch, not per job.
        self.logging = log.isEnabledFor(logging.INFO)

    def room(self) -> int:
        """How many jobs a claim may take now: one for each idle runner, less the jobs already claimed for them."""
        return len(self._waiting) + self._starting - len(self.buffer)

    def put(self, leases: list[Lease]) -> None:
        """Hand claimed jobs to the runners."""
        self.logging = log.isEnabledFor(logging.INFO)
        self.buffer.extend(leases)
        self._wake_runner()

    def next(self) -> Lease | None:
        """The next job for a runner (waking another runner if more are left), or None if there is none."""
        if not self.buffer:
            return None
        lease = self.buffer.popleft()
        self._wake_runner()
        return lease

    async def idle(self) -> bool:
        """Wait, as an idle runner, for a job; False when the worker is shutting down instead."""
        woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(woken)
        self._wakeup.wake()
        if not await woken:
            return False
        self._starting -= 1
        return True

    def unstarted(self) -> list[Lease]:
        """Take every job not yet started out of the buffer (to give them back)."""
        leases = list(self.buffer)
        self.buffer.clear()
        return leases

    def close(self) -> None:
        """No more jobs: idle runners end now, busy ones once their job does."""
        self.closing = True
        for woken in self._waiting:
            woken.set_result(False)
        self._waiting.clear()

    def _wake_runner(self) -> None:
        if self.buffer and not self._starting and self._waiting:
            self._starting += 1
            self._waiting.pop().set_result(True)


class Fetcher:
    """The claim loop of one worker: claims jobs for its idle runners until it stops, or a burst is done."""

    def __init__(
        self,
        shared: Shared,
        *,
        settings: WorkerSettings,
        task_names: list[str],
        jobs: ClaimedJobs,
        writes: JobWrites,
        stopping: Callable[[], bool],
    ) -> None:
        self.store, self.engine, self.threads = shared.store, shared.engine, shared.threads
        self.wakeup, self.keeper, self.stats, self.missing = shared.wakeup, shared.keeper, shared.stats, shared.missing
        self.settings = settings
        self.task_names = task_names
        self.jobs = jobs
        self.writes = writes
        self.stopping = stopping
        #: Prometheus metrics, when the worker serves them.
        self.metrics: Metrics | None = None
        self._tracing = active()

    async def run(self) -> None:
        """Claim and hand over jobs until the worker stops (or, in a burst, until no job is left)."""
        settings, wakeup, jobs, held = self.settings, self.wakeup, self.jobs, self.keeper.held
        backoff = Backoff(first=IDLE_FIRST_WAIT, most=settings.poll_seconds)
        while not self.stopping():
            # Cleared before the state is looked at (not when a wait begins): a notification or a finished
            # job that comes while a claim runs still cuts the wait after it short.
            wakeup.clear()
            room = jobs.room()
            if room == 0:
                await wakeup.sleep(settings.poll_seconds)  # every runner has a job: wait until one ends
                continue
            claimed = await self._claim(min(room, settings.batch), backoff)
            if claimed is None:
                continue
            if self.stopping() and claimed:
                await self.writes.release(claimed)
                break
            self.stats.claimed += len(claimed)
            if claimed:
                self.keeper.hold(claimed)
                jobs.put(claimed)
                backoff.reset()
                continue
            if settings.burst and not held and not self.writes.successes.writing and not self.writes.recording:
                left = await self._work_left()
                if left is not None and not left.queued and not left.scheduled:
                    # Nothing is left for this worker; jobs still running elsewhere may yet leave some.
                    if not left.running or await self._outlast_others():
                        break
                    continue
            await wakeup.sleep(backoff.next())  # idle: wait for a notification, a finished job, or a poll

    async def _claim(self, limit: int, backoff: Backoff) -> list[Lease] | None:
        """Claim up to ``limit`` jobs; None when the claim failed (after waiting before the next try)."""
        started = time.perf_counter()
        began = time.time_ns() if self._tracing is not None else 0
        settings = self.settings
        try:
            claimed = await self.threads.call(
                self.store.claim,
                self.engine,
                owner=settings.name,
                lease_seconds=settings.lease_seconds,
                limit=limit,
                queues=settings.queues,
                tasks=self.task_names,
                tags=settings.tags,
            )
        except SchemaMissing as error:  # the tables were dropped: wait for `dibs init`, polling
            self._traced(began, [], error)
            self.missing.report(error)
            await self.wakeup.sleep(settings.poll_seconds)
            return None
        except Exception as error:  # the database is away or busy: try again, backing off
            self._traced(began, [], error)
            wait = backoff.next(floor=FAILED_CLAIM_WAIT)
            log.warning("claim failed, trying again in %.1fs: %s", wait, error)
            await self.wakeup.sleep(wait)
            return None
        self.missing.clear()
        if self.metrics is not None:
            self.metrics.claimed(len(claimed), time.perf_counter() - started)
        if claimed:
            self._traced(began, claimed, None)
        return claimed

    def _traced(self, began: int, claimed: list[Lease], error: BaseException | None) -> None:
        """Record a claim that took jobs, or failed, as a span (an empty claim, which idle polling repeats, is
        not one)."""
        if self._tracing is not None:
            headers = [lease.row[HEADERS_AT] for lease in claimed]
            self._tracing.claimed(self.settings.queues, began, headers, error)

    # -- the end of a burst ------------------------------------------------------------------------------

    async def _work_left(self) -> WorkLeft | None:
        """Which jobs of ours (of our queues and tasks, untagged or of our tags) are queued, scheduled (a retry
        waiting for its time) or running, scheduled ones whose time came and waiting ones whose parents
        finished queued first; None if the database could not say (logged)."""
        settings, call = self.settings, self.threads.call

        def ours() -> WorkLeft:
            return self.store.work_left(self.engine, settings.queues, self.task_names, settings.tags)

        try:
            left = await call(ours)
            if left.scheduled:
                promoted: int = await call(self.store.promote_due, self.engine)
                if promoted:
                    return left._replace(queued=True)
            # Children enqueued while their parent ran, whose settling is left to upkeep: settled now, or
            # the burst could end with them waiting for parents that finished. Those settled may be of
            # other queues, so what is left for this worker is looked at again.
            if not left.queued:
                settled: int = await call(self.store.settle_unsettled, self.engine)
                if settled:
                    left = await call(ours)
        except Exception as error:
            log.warning("could not check for remaining work: %s", error)
            return None
        return left

    async def _outlast_others(self) -> bool:
        """When nothing is left but jobs running in other workers: wait until they have ended (True: stop) or
        left work behind (False: claim it; a failure to retry, a crashed worker's jobs recovered). Nothing
        tells when that happens, so it is looked for often, one probe at a time, for a burst to end soon
        after its last job instead of after a backoff grown long."""
        poll = self.settings.poll_seconds
        backoff = Backoff(first=BURST_END_POLL, most=min(BURST_END_POLL_MOST, poll), growth=BURST_END_POLL_GROWTH)
        while not self.stopping():
            self.wakeup.clear()
            await self.wakeup.sleep(backoff.next())
            left = await self._work_left()
            if left is None or left.queued or left.scheduled:
                return False
            if not left.running:
                return True
        return False
