"""The relay: claims batches of outbox events, publishes them, and records the outcome, fenced by lease.

One asyncio loop runs everything; database calls go to threads of their own.

* lanes: ``concurrency`` loops, each claiming a batch (the head of each aggregate only, so a batch holds
  at most one event per aggregate), publishing it, and marking what the broker confirmed published in
  one token-fenced statement. A failed publish is retried after a backoff, at most the outbox's
  ``max_retries`` times (so an event is published at most ``max_retries + 1`` times); then the event
  is abandoned with its error kept;
* a broker that cannot be reached: the batch is given back unpublished at once, no retry counted, and
  the relay tries again, backing off, until the broker is back;
* heartbeats renew the leases of the batches in flight; a relay that dies leaves its events to be
  claimed again when their leases expire (their broker may see them twice: at least once);
* upkeep, apart from the claim: failed events whose next attempt came are pending again, expired
  leases are recovered, and, if asked, old published events are purged;
* shutdown (SIGTERM, SIGINT or :meth:`Relay.stop`): no more claims; batches in flight get ``grace``
  seconds to finish, and what is left is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dibs._checks import checked_count, checked_seconds, checked_text
from dibs._errors import BrokerUnavailable, InvalidArgument
from dibs._signals import handle_stop_signals
from dibs.dialects.base import Listener
from dibs.lease import OWNER_LIMIT, Lease
from dibs.outbox.events import CHANNEL, NAME_LIMITS, OutboxEvent
from dibs.outbox.failures import sorted_failures
from dibs.outbox.publishers import Publisher, publisher_for
from dibs.outbox.store import OutboxStore
from dibs.retry import Retry
from dibs.schema import DEFAULT_TARGET, FAILED, PROCESSING, outbox, require_current

T = TypeVar("T")
log = logging.getLogger("dibs.relay")

#: The longest wait between tries while the broker cannot be reached.
OUTAGE_WAIT = 30.0


@dataclass
class RelayStats:
    """What one relay did."""

    claimed: int = 0
    published: int = 0
    #: Failed publishes that will be tried again after a backoff.
    retried: int = 0
    abandoned: int = 0
    #: Events given back unpublished (the broker could not be reached, or the relay stopped).
    released: int = 0
    #: Outcomes the database refused because the lease had been taken over: another relay has the event.
    lost: int = 0


class RelayOutbox(Protocol):
    """What a relay reads of the outbox whose events it publishes (a :class:`dibs.Outbox`)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def store(self) -> OutboxStore: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def retry(self) -> Retry: ...
    @property
    def notify(self) -> bool: ...


class Relay:
    """Publishes an outbox's events of one ``target`` until stopped (or, with ``burst=True``, until none is
    left to publish).

    ``publisher``: a :class:`~dibs.outbox.publishers.Publisher` or a URL naming one (``redis://``,
    ``nats://``, ``amqp://``, ``http(s)://``, ``log://``, ``stdout://``). ``batch``: most events claimed per
    round trip. ``concurrency``: batches in flight at once. ``lease``: seconds a claim is held before
    another relay may take its events over; renewed every ``heartbeat`` seconds. ``poll``: the longest
    wait between looks for events when idle. ``grace``: seconds batches in flight get at shutdown.
    ``retention``: purge published events older than this.

    A failed publish is retried up to the outbox's ``max_retries`` times, so an event is published at most
    ``max_retries + 1`` times before it is abandoned. Logs (``dibs.relay``): start and stop at INFO, failures
    at WARNING in one line per batch and kind of failure, each batch at DEBUG.
    """

    def __init__(
        self,
        outbox: RelayOutbox,
        publisher: Publisher | str,
        *,
        target: str = DEFAULT_TARGET,
        batch: int = 200,
        concurrency: int = 1,
        lease: float = 30.0,
        heartbeat: float | None = None,
        poll: float = 1.0,
        grace: float = 10.0,
        upkeep_every: float = 1.0,
        retention: timedelta | None = None,
        burst: bool = False,
        name: str | None = None,
        handle_signals: bool = True,
    ) -> None:
        checked_count(batch, "batch")
        checked_count(concurrency, "concurrency")
        checked_text(target, "target", NAME_LIMITS["target"])
        self.lease_seconds = checked_seconds(lease, "lease")
        self.heartbeat_seconds = (
            self.lease_seconds / 3 if heartbeat is None else checked_seconds(heartbeat, "heartbeat")
        )
        if self.heartbeat_seconds >= self.lease_seconds:
            raise InvalidArgument(
                f"heartbeat must be shorter than the lease ({self.lease_seconds:g} s), got {heartbeat!r}; "
                "a third of the lease (the default) renews it twice before it could expire"
            )
        self.poll_seconds = checked_seconds(poll, "poll")
        self.upkeep_seconds = checked_seconds(upkeep_every, "upkeep_every")
        self.grace_seconds = checked_seconds(grace, "grace", zero=True)
        if retention is not None:
            retention = timedelta(seconds=checked_seconds(retention, "retention", zero=True))
        self.outbox = outbox
        self.publisher = publisher_for(publisher) if isinstance(publisher, str) else publisher
        if not isinstance(self.publisher, Publisher):
            raise InvalidArgument(f"publisher must be a URL or a dibs Publisher, got {publisher!r}")
        self.target = target
        self.batch = batch
        self.concurrency = concurrency
        self.retention = retention
        self.burst = burst
        self.name = checked_text(
            name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}", "name", OWNER_LIMIT
        )
        self.handle_signals = handle_signals
        self.stats = RelayStats()
        self._store = outbox.store
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._held: dict[tuple[Any, ...], Lease] = {}  # claimed and not yet finished
        self._outage_wait = 0.0  # while the broker cannot be reached: the wait before the next try
        self._db = ThreadPoolExecutor(concurrency + 2, thread_name_prefix="dibs-relay-db")

    # -- control -----------------------------------------------------------------------------------

    def run(self) -> RelayStats:
        """Run until stopped; returns what was done."""
        return asyncio.run(self.arun())

    def stop(self) -> None:
        """Stop gracefully, from any thread: claim no more, let batches in flight finish within the grace."""
        self._stopping.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._stop_now)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _stop_now(self) -> None:
        if self._stopped is not None:
            self._stopped.set()
        self._wake_up()

    async def arun(self) -> RelayStats:
        """run() on the caller's event loop."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        if self.stopping:
            self._stopped.set()
        try:
            await self._call(require_current, self.outbox.engine)
            await self._connect()
        except BaseException:
            self._db.shutdown(wait=True)
            raise
        self._signals(install=True)
        listener = self._listen()
        lanes = [asyncio.create_task(self._lane(), name=f"dibs-relay-lane-{n}") for n in range(self.concurrency)]
        chores = [
            asyncio.create_task(self._heartbeats(), name="dibs-relay-heartbeats"),
            asyncio.create_task(self._upkeep(), name="dibs-relay-upkeep"),
        ]
        log.info("relay %s started: target %s, publisher %s", self.name, self.target, self.publisher.description)
        try:
            stopped = asyncio.create_task(self._stopped.wait())
            await asyncio.wait([stopped, *lanes], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            self._stopping.set()
            self._wake_up()
            _, late = await asyncio.wait(lanes, timeout=self.grace_seconds) if lanes else (set(), set())
            for lane in late:
                lane.cancel()
            results = await asyncio.gather(*lanes, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.error("a relay lane failed: %r", result)
        finally:
            for chore in chores:
                chore.cancel()
            await asyncio.gather(*chores, return_exceptions=True)
            await self._give_back(list(self._held.values()))
            if listener is not None:
                await self._call(listener.close)
            self._signals(install=False)
            with contextlib.suppress(Exception):
                await self.publisher.close()
            self._db.shutdown(wait=True)
        log.info("relay %s stopped: %s", self.name, self.stats)
        return self.stats

    async def _connect(self) -> None:
        """Connect the publisher, waiting for the broker while it cannot be reached (a burst relay gives up)."""
        wait = 0.5
        while True:
            try:
                await self.publisher.connect()
                return
            except BrokerUnavailable as error:
                if self.burst:
                    raise
                if self.stopping:
                    return  # the lanes see the stop and end at once
                log.error("%s; trying again in %.1f s", error, wait)
                await self._sleep(wait)
                wait = min(wait * 2, OUTAGE_WAIT)

    # -- lanes -------------------------------------------------------------------------------------

    async def _lane(self) -> None:
        idle = 0.01
        confirming = False  # burst: nothing seemed left; one more claim makes sure
        while not self.stopping:
            try:
                held = await self._call(
                    self._store.claim_batch,
                    self.outbox.engine,
                    worker_id=self.name,
                    limit=self.batch,
                    target=self.target,
                    lease_seconds=self.lease_seconds,
                )
            except Exception as error:  # the database is away or busy: try again, backing off
                log.warning("claiming outbox events failed, trying again in %.1f s: %s", idle, error)
                await self._sleep(idle)
                idle = min(max(idle * 2, 0.1), self.poll_seconds)
                continue
            if not held:
                if self.burst and await self._nothing_left():
                    if confirming:
                        self.stop()
                        return
                    confirming = True
                    continue
                confirming = False
                await self._sleep(idle)
                idle = min(idle * 2, self.poll_seconds)
                continue
            idle, confirming = 0.01, False
            self.stats.claimed += len(held)
            for lease in held:
                self._held[lease.key] = lease
            await self._publish(held)
            if self._outage_wait:
                await self._sleep(self._outage_wait)

    async def _publish(self, held: list[Lease]) -> None:
        events = OutboxEvent.from_rows([lease.row for lease in held], status=PROCESSING)
        started = time.perf_counter()
        try:
            outcomes: Sequence[BaseException | None] = await self.publisher.publish(events)
            if len(outcomes) != len(events):
                raise RuntimeError(f"the publisher answered {len(outcomes)} outcomes for {len(events)} events")
        except BrokerUnavailable as error:
            self._outage_wait = min(max(self._outage_wait * 2, 0.5), OUTAGE_WAIT)
            log.error(
                "%s; %d events given back unpublished, trying again in %.1f s", error, len(held), self._outage_wait
            )
            await self._give_back(held)
            return
        except Exception as error:  # the whole batch failed in a way the publisher did not sort out
            outcomes = [error] * len(events)
        if self._outage_wait:
            log.info("the broker is back: publishing to %s again", self.publisher.description)
            self._outage_wait = 0.0
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
            await self._record(published, "published", self._store.published)
        if failed:
            await self._failed(failed)

    async def _record(self, held: list[Lease], outcome: str, write: Callable[..., list[Lease]], *args: Any) -> None:
        """Write one outcome for these leases; counted in the stats, the lost ones logged."""
        for lease in held:
            self._held.pop(lease.key, None)
        try:
            lost = await self._call(write, self.outbox.engine, held, *args)
        except Exception as error:
            # Not recorded: the leases expire and the events go out again (at least once, never lost).
            log.warning("could not record %d events as %s; they will be published again: %s", len(held), outcome, error)
            return
        setattr(self.stats, outcome, getattr(self.stats, outcome) + len(held) - len(lost))
        self.stats.lost += len(lost)
        for lease in lost:
            log.warning("event %s was %s, but its lease had been taken over: not recorded", lease.key[0], outcome)

    async def _failed(self, failed: list[tuple[Lease, BaseException]]) -> None:
        """Retry each failed event after its backoff, or abandon it; one log line per kind of failure, and one
        write per error."""
        max_retries = self.outbox.max_retries
        groups = sorted_failures(
            [(lease, lease.row._mapping["retry_count"], error) for lease, error in failed],
            max_retries=max_retries,
            retry=self.outbox.retry,
        )
        for group in groups:
            log.warning("%s", group.describe(max_retries))
            for text, leases in group.by_error.items():
                if group.abandoned:
                    await self._record(leases, "abandoned", self._store.abandon, text)
                else:
                    delay = self.outbox.retry.delay(group.failures)
                    await self._record(leases, "retried", self._store.failed, delay, text)

    async def _give_back(self, held: list[Lease]) -> None:
        if not held:
            return
        for lease in held:
            self._held.pop(lease.key, None)
        try:
            lost = await self._call(self._store.release, self.outbox.engine, held)
        except Exception as error:
            log.warning("could not give back %d events; they go out once their leases expire: %s", len(held), error)
            return
        self.stats.released += len(held) - len(lost)

    async def _nothing_left(self) -> bool:
        """For burst mode: none of the target's events is being published or waits for a retry (pending
        events behind an abandoned head stay, under the block policy)."""
        if self._held:
            return False
        try:
            if await self._call(self._store.promote_due, self.outbox.engine):
                return False
            counts = await self._call(self._counts)
        except Exception as error:
            log.warning("could not check for remaining events: %s", error)
            return False
        return not counts.get(PROCESSING) and not counts.get(FAILED)

    def _counts(self) -> dict[str, int]:
        query = (
            sa.select(outbox.c.status, sa.func.count())
            .where(outbox.c.target == self.target, outbox.c.status.in_([PROCESSING, FAILED]))
            .group_by(outbox.c.status)
        )
        with self.outbox.engine.connect() as conn:
            return dict(conn.execute(query).all())

    # -- waiting -----------------------------------------------------------------------------------

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _listen(self) -> Listener | None:
        if not self.outbox.notify:
            return None
        loop = self._loop
        assert loop is not None
        target = self.target

        def woken(payload: str) -> None:
            if not payload or target in payload.split(","):
                loop.call_soon_threadsafe(self._wake_up)

        return self._store.backend.listen(self.outbox.engine, CHANNEL, woken)

    # -- heartbeats and upkeep ---------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            held = list(self._held.values())
            if not held:
                continue
            try:
                lost = await self._call(self._store.renew, self.outbox.engine, held, self.lease_seconds)
            except Exception as error:  # tried again at the next beat, well before the leases expire
                log.warning("heartbeat failed, will try again: %s", error)
                continue
            for lease in lost:
                if self._held.get(lease.key) is lease:
                    log.warning("lost the lease on event %s (it expired and was taken over)", lease.key[0])

    async def _upkeep(self) -> None:
        last_purge = 0.0
        while True:
            try:
                if await self._call(self._store.promote_due, self.outbox.engine):
                    self._wake_up()
                if recovered := await self._call(self._store.recover_expired, self.outbox.engine):
                    log.warning("recovered %d events of relays that stopped renewing their lease", recovered)
                    self._wake_up()
                if self.retention is not None and time.monotonic() - last_purge > 60:
                    last_purge = time.monotonic()
                    await self._call(self._store.purge, self.outbox.engine, self.retention)
            except Exception as error:
                log.warning("outbox upkeep failed, will try again: %s", error)
            await asyncio.sleep(self.upkeep_seconds)

    # -- plumbing ----------------------------------------------------------------------------------

    def _signals(self, *, install: bool) -> None:
        if self.handle_signals:
            assert self._loop is not None
            handle_stop_signals(self._loop, self._on_signal, install=install)

    def _on_signal(self, signum: int) -> None:
        log.info("relay %s got signal %d: stopping", self.name, signum)
        self.stop()

    async def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking database call on the relay's database threads."""
        assert self._loop is not None
        return await self._loop.run_in_executor(self._db, lambda: function(*args, **kwargs))
