"""The relay: publishes an outbox's events of one target to a broker, at least once, in order per aggregate.

The relay is a :class:`~dibs.runtime.Service` wired from its three stages, all on one asyncio loop, with
database calls on threads of their own:

* claim (:mod:`~dibs.outbox.claiming`): ``concurrency`` lanes, each claiming a batch of aggregate heads;
* publish (:mod:`~dibs.outbox.publishing`): the batch sent to the broker; while the broker cannot be
  reached, batches are given back unpublished and the relay tries again, backing off;
* mark (:mod:`~dibs.outbox.marking`): each event completed, retried after a backoff (at most the outbox's
  ``max_retries`` times), abandoned with its error kept, or given back, in token-fenced statements.

Beside them, a lease keeper renews the leases in flight, and upkeep (:mod:`~dibs.outbox.upkeep`) makes
failed events due again, recovers the events of relays that died and purges. Shutdown (SIGTERM, SIGINT or
:meth:`Relay.stop`): no more claims; batches in flight get ``grace`` seconds to finish (none on a second
signal, or ``stop(hurry=True)``), and what is left is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from dibs._errors import InvalidArgument
from dibs.lease import Lease
from dibs.outbox.claiming import Lane
from dibs.outbox.events import CHANNEL
from dibs.outbox.marking import Marks
from dibs.outbox.publishers import Publisher, publisher_for
from dibs.outbox.publishing import Publishing
from dibs.outbox.settings import RelaySettings
from dibs.outbox.stage import RelayOutbox, RelayStats
from dibs.outbox.upkeep import outbox_chores, upkeep_failed
from dibs.runtime import DatabaseThreads, LeaseKeeper, Service, Upkeep
from dibs.schema import require_current

__all__ = ["Relay", "RelayOutbox", "RelaySettings", "RelayStats"]

log = logging.getLogger("dibs.relay")


class Relay(Service[RelayStats]):
    """Publishes an outbox's events of one target until stopped (or, with ``burst=True``, until none is left
    to publish).

    A failed publish is retried up to the outbox's ``max_retries`` times, so an event is published at most
    ``max_retries + 1`` times before it is abandoned. Logs (``dibs.relay``): start and stop at INFO, failures
    at WARNING in one line per batch and kind of failure, each batch at DEBUG.

    Args:
        outbox: The outbox whose events it publishes (a :class:`dibs.Outbox`).
        publisher: A :class:`~dibs.outbox.publishers.Publisher`, or a URL naming one (``redis://``,
            ``nats://``, ``amqp://``, ``http(s)://``, ``log://``, ``stdout://``).
        settings: How it runs; see :class:`~dibs.RelaySettings` (default: its defaults).
        **options: Settings by name (``batch=``, ``concurrency=``, ``lease=`` ...), over ``settings``.

    Raises:
        InvalidArgument: For a publisher URL no publisher takes, or a setting out of range.

    Example:
        >>> relay = dibs.Relay(outbox, "redis://localhost:6379/0", batch=500, burst=True)
        >>> relay.run().published
        1200
    """

    def __init__(
        self, outbox: RelayOutbox, publisher: Publisher | str, settings: RelaySettings | None = None, **options: Any
    ) -> None:
        unknown = sorted(set(options) - {field.name for field in dataclasses.fields(RelaySettings)})
        if unknown:
            known = ", ".join(field.name for field in dataclasses.fields(RelaySettings))
            raise InvalidArgument(f"the relay has no setting {', '.join(unknown)}; its settings are: {known}")
        if settings is None:
            settings = RelaySettings(**options)
        elif options:
            settings = dataclasses.replace(settings, **options)
        chosen = publisher_for(publisher) if isinstance(publisher, str) else publisher
        if not isinstance(chosen, Publisher):
            raise InvalidArgument(f"publisher must be a URL or a dibs Publisher, got {publisher!r}")
        threads = DatabaseThreads(settings.concurrency + 2, name="dibs-relay-db")
        super().__init__(name=settings.name, threads=threads, handle_signals=settings.handle_signals, log=log)
        self.settings = settings
        self.outbox = outbox
        self.publisher = chosen
        self.stats = RelayStats()
        self.keeper = LeaseKeeper(self._renew, every=settings.heartbeat_seconds, lost=_lost, failed=_beat_failed)
        self.upkeep = Upkeep(outbox_chores(settings, outbox, threads, self.wakeup.wake), failed=upkeep_failed)
        self._marks = Marks(outbox, self.stats, threads, self.keeper)
        self._publishing = Publishing(chosen, self._marks, self.wakeup)
        self._stopped: asyncio.Event | None = None
        self._hurried: asyncio.Event | None = None
        self._chores: list[asyncio.Task[None]] = []

    # -- the service's hooks -----------------------------------------------------------------------

    async def start(self) -> None:
        """Check the tables, connect the publisher (waiting for its broker) and listen for new events."""
        self._stopped, self._hurried = asyncio.Event(), asyncio.Event()
        if self.stopping:
            self._stopped.set()
        await self.threads.call(require_current, self.outbox.engine)
        await self._publishing.connect(give_up=self.settings.burst, stopping=lambda: self.stopping)
        if self.outbox.notify:
            target = self.settings.target
            await self.threads.call(
                self.wakeup.listen,
                self.outbox.store.backend,
                self.outbox.engine,
                CHANNEL,
                lambda payload: not payload or target in payload.split(","),
            )

    async def serve(self) -> RelayStats:
        """Run the lanes until stopped (or, in burst mode, until one finds nothing left), then give them the
        grace."""
        assert self._stopped is not None
        settings = self.settings
        lanes = [
            asyncio.create_task(self._lane().run(), name=f"dibs-relay-lane-{n}") for n in range(settings.concurrency)
        ]
        self._chores = [
            asyncio.create_task(self.keeper.run(self.threads), name="dibs-relay-heartbeats"),
            asyncio.create_task(self.upkeep.run(), name="dibs-relay-upkeep"),
        ]
        log.info("relay %s started: target %s, publisher %s", self.name, settings.target, self.publisher.description)
        stopped = asyncio.create_task(self._stopped.wait())
        await asyncio.wait([stopped, *lanes], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        self.stop()
        await self._grace(lanes)
        for result in await asyncio.gather(*lanes, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("a relay lane failed: %r", result)
        return self.stats

    async def _grace(self, lanes: list[asyncio.Task[None]]) -> None:
        """Give the lanes the grace to finish their batches, cut short by a stop in a hurry; cancel the late."""
        assert self._hurried is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.grace
        hurried = asyncio.create_task(self._hurried.wait())
        late = {lane for lane in lanes if not lane.done()}
        while late and not self.hurry and (left := deadline - loop.time()) > 0:
            await asyncio.wait([hurried, *late], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            late = {lane for lane in late if not lane.done()}
        hurried.cancel()
        for lane in late:
            lane.cancel()

    async def close(self) -> None:
        """Stop the chores, give back what is in flight, stop listening and close the publisher."""
        for chore in self._chores:
            chore.cancel()
        await asyncio.gather(*self._chores, return_exceptions=True)
        await self._marks.give_back_all()
        await self.threads.call(self.wakeup.close)
        with contextlib.suppress(Exception):
            await self.publisher.close()
        log.info("relay %s stopped: %s", self.name, self.stats)

    def on_stop(self) -> None:
        """End the wait in :meth:`serve` (and, in a hurry, the grace) and wake the lanes, so that they see the
        stop."""
        if self._stopped is not None:
            self._stopped.set()
        if self.hurry and self._hurried is not None:
            self._hurried.set()
        super().on_stop()

    # -- wiring ------------------------------------------------------------------------------------

    def _lane(self) -> Lane:
        return Lane(self.settings, self.outbox, self._publishing, self.threads, self.wakeup, lambda: self.stopping)

    def _renew(self, leases: list[Lease]) -> list[Lease]:
        return self.outbox.store.renew(self.outbox.engine, leases, self.settings.lease)


def _lost(lease: Lease) -> None:
    log.warning("lost the lease on event %s (it expired and was taken over)", lease.key[0])


def _beat_failed(error: Exception) -> None:
    log.warning("heartbeat failed, will try again: %s", error)
