"""The relay's middle stage: a claimed batch sent to the broker, each event's outcome handed to the marks.

While the broker cannot be reached, batches are given back unpublished (no retry counted) and the lane
waits longer and longer, up to :data:`~dibs.outbox.stage.OUTAGE_WAIT`, before it claims the next.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from dibs._errors import BrokerUnavailable
from dibs.lease import Lease
from dibs.outbox.events import OutboxEvent
from dibs.outbox.marking import Marks
from dibs.outbox.publishers import Publisher
from dibs.outbox.stage import OUTAGE_WAIT
from dibs.runtime import Backoff, Wakeup
from dibs.schema import PROCESSING
from dibs.tracing import active

log = logging.getLogger("dibs.relay")


class Publishing:
    """Publishes batches through one publisher and keeps track of whether its broker can be reached."""

    def __init__(self, publisher: Publisher, marks: Marks, wakeup: Wakeup) -> None:
        self.publisher = publisher
        self.marks = marks
        self.wakeup = wakeup
        #: While the broker cannot be reached: seconds to wait before the next claim; 0 when it can.
        self.outage_wait = 0.0
        self._outage = Backoff(first=0.5, most=OUTAGE_WAIT)
        self._tracing = active()

    async def connect(self, *, give_up: bool, stopping: Callable[[], bool]) -> None:
        """Connect the publisher, waiting for its broker while it cannot be reached, unless ``give_up``."""
        backoff = Backoff(first=0.5, most=OUTAGE_WAIT)
        while True:
            try:
                await self.publisher.connect()
                return
            except BrokerUnavailable as error:
                if give_up:
                    raise
                if stopping():
                    return  # the lanes see the stop and end at once
                wait = backoff.next()
                log.error("%s; trying again in %.1f s", error, wait)
                self.wakeup.clear()
                await self.wakeup.sleep(wait)

    async def publish(self, held: list[Lease]) -> None:
        """Publish these claimed events and have each one's outcome written."""
        events = OutboxEvent.from_rows([lease.row for lease in held], status=PROCESSING)
        if self._tracing is None or not events:
            await self._publish(held, events)
            return
        with self._tracing.publish(events[0].target, events) as span:
            outcomes = await self._publish(held, events)
            self._tracing.published(span, outcomes)

    async def _publish(self, held: list[Lease], events: list[OutboxEvent]) -> Sequence[BaseException | None]:
        """Send the events, have each one's outcome written, and return them (every event failed, for a
        broker that could not be reached)."""
        started = time.perf_counter()
        try:
            outcomes: Sequence[BaseException | None] = await self.publisher.publish(events)
            if len(outcomes) != len(events):
                raise RuntimeError(f"the publisher answered {len(outcomes)} outcomes for {len(events)} events")
        except BrokerUnavailable as error:
            self.outage_wait = self._outage.next()
            log.error(
                "%s; %d events given back unpublished, trying again in %.1f s", error, len(held), self.outage_wait
            )
            await self.marks.give_back(held)
            return [error] * len(events)
        except Exception as error:  # the whole batch failed in a way the publisher did not sort out
            outcomes = [error] * len(events)
        if self.outage_wait:
            log.info("the broker is back: publishing to %s again", self.publisher.description)
            self.outage_wait = 0.0
            self._outage.reset()
        published = [lease for lease, outcome in zip(held, outcomes, strict=True) if outcome is None]
        failed = [(lease, outcome) for lease, outcome in zip(held, outcomes, strict=True) if outcome is not None]
        log.debug(
            "published %d of %d events to %s in %.0f ms",
            len(published),
            len(held),
            self.publisher.description,
            (time.perf_counter() - started) * 1000,
        )
        if published:
            await self.marks.complete(published)
        if failed:
            await self.marks.fail(failed)
        return outcomes
