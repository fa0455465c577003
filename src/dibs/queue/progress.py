"""Writing what running jobs report of their progress: the latest report of each job, once a second, all of
them in one transaction.

A task may report in a tight loop, from its own thread: a report only marks its job, under a lock, and the
writer takes the marked jobs once a second and writes each one's latest report, fenced by its lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from dibs.lease import Lease
from dibs.queue.job import JobContext
from dibs.queue.stage import Shared

log = logging.getLogger("dibs.worker")

#: Seconds between writes of the progress reported meanwhile.
PROGRESS_EVERY = 1.0


class ProgressWrites:
    """The progress reports of one worker's running jobs, written at most once every ``every`` seconds.

    Args:
        shared: The worker's parts (its store, engine and database threads).
        running: The lease a job runs under now, given its context; None once it ended (its report is dropped).
        every: Seconds between writes.
    """

    def __init__(
        self, shared: Shared, running: Callable[[JobContext], Lease | None], every: float = PROGRESS_EVERY
    ) -> None:
        self.shared = shared
        self.every = every
        self._running = running
        self._marked: dict[int, JobContext] = {}
        self._lock = threading.Lock()

    def mark(self, context: JobContext) -> None:
        """Note that this job reported (from any thread): its latest report goes in the next write."""
        with self._lock:
            self._marked[context.job_id] = context

    async def run(self) -> None:
        """Write the reports marked meanwhile every ``every`` seconds until cancelled; a failed write is
        logged and its reports dropped (the jobs' next reports are written instead)."""
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.flush()
            except Exception as error:
                log.warning("could not write the progress of running jobs: %s", error)

    async def flush(self) -> None:
        """Write the latest report of every job marked since the last write, if it still runs here."""
        with self._lock:
            marked, self._marked = self._marked, {}
        reports = []
        for context in marked.values():
            lease = self._running(context)
            if lease is not None and context.reported is not None:
                reports.append((lease, *context.reported))
        if reports:
            shared = self.shared
            await shared.threads.call(shared.store.write_progress, shared.engine, reports)
