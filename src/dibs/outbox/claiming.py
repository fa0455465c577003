"""The relay's first stage: a lane claims batches of events and hands each to the publishing stage.

A relay runs ``concurrency`` lanes. Each claim takes only the head of each aggregate, so a batch holds at most
one event per aggregate and no two lanes (or relays) publish events of one aggregate at once. An empty claim
waits longer and longer, up to the poll interval, unless new events wake the relay; a database that is away
or busy is tried again the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dibs.lease import Lease
from dibs.outbox.marking import Marks
from dibs.outbox.publishing import Publishing
from dibs.outbox.settings import RelaySettings
from dibs.outbox.stage import RelayOutbox
from dibs.runtime import Backoff, DatabaseThreads, Wakeup
from dibs.schema import FAILED, PROCESSING

log = logging.getLogger("dibs.relay")

#: The first wait after an empty claim, in seconds; it doubles up to the poll interval.
FIRST_WAIT = 0.01


class Lane:
    """One loop of claim, publish and mark, until the relay stops (or, in burst mode, nothing is left)."""

    def __init__(
        self,
        settings: RelaySettings,
        outbox: RelayOutbox,
        publishing: Publishing,
        threads: DatabaseThreads,
        wakeup: Wakeup,
        stopping: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.publishing = publishing
        self.marks: Marks = publishing.marks
        self.threads = threads
        self.wakeup = wakeup
        self.stopping = stopping

    async def run(self) -> None:
        """Claim and publish until the relay stops; in burst mode, return once nothing is left to publish."""
        idle = Backoff(first=FIRST_WAIT, most=self.settings.poll)
        confirming = False  # burst: nothing seemed left; one more claim makes sure
        while not self.stopping():
            # Cleared before the claim: events added while it runs cut the following sleep short.
            self.wakeup.clear()
            try:
                held = await self._claim()
            except Exception as error:  # the database is away or busy: try again, backing off
                wait = idle.next(floor=0.1)
                log.warning("claiming outbox events failed, trying again in %.1f s: %s", wait, error)
                await self.wakeup.sleep(wait)
                continue
            if not held:
                if self.settings.burst and await self._is_nothing_left():
                    if confirming:
                        return
                    confirming = True
                    continue
                confirming = False
                await self.wakeup.sleep(idle.next())
                continue
            idle.reset()
            confirming = False
            await self.publishing.publish(held)
            if self.publishing.outage_wait:
                self.wakeup.clear()
                await self.wakeup.sleep(self.publishing.outage_wait)

    async def _claim(self) -> list[Lease]:
        settings = self.settings
        held = await self.threads.call(
            self.outbox.store.claim,
            self.outbox.engine,
            owner=settings.name,
            limit=settings.batch,
            target=settings.target,
            lease_seconds=settings.lease,
        )
        self.marks.stats.claimed += len(held)
        self.marks.keeper.hold(held)
        return held

    async def _is_nothing_left(self) -> bool:
        """Whether none of the target's events is being published or waits for a retry (pending events behind
        an abandoned head stay, under the block policy)."""
        if self.marks.keeper.held:
            return False
        store, engine = self.outbox.store, self.outbox.engine
        try:
            if await self.threads.call(store.promote_due, engine):
                return False
            counts = await self.threads.call(store.unfinished, engine, self.settings.target)
        except Exception as error:
            log.warning("could not check for remaining events: %s", error)
            return False
        return not counts.get(PROCESSING) and not counts.get(FAILED)
