"""The relay: publishes an outbox's events of one target to a broker, at least once, in order per aggregate.

The relay is wiring around its three stages, all on one asyncio loop, with database calls on threads of
their own:

* claim (:mod:`~dibs.outbox.claiming`): ``concurrency`` lanes, each claiming a batch of aggregate heads;
* publish (:mod:`~dibs.outbox.publishing`): the batch sent to the broker; while the broker cannot be
  reached, batches are given back unpublished and the relay tries again, backing off;
* mark (:mod:`~dibs.outbox.marking`): each event completed, retried after a backoff (at most the outbox's
  ``max_retries`` times), abandoned with its error kept, or given back, in token-fenced statements.

Beside them, heartbeats renew the leases in flight and upkeep (:mod:`~dibs.outbox.upkeep`) makes failed
events due again, recovers the events of relays that died and purges. Shutdown (SIGTERM, SIGINT or
:meth:`Relay.stop`): no more claims; batches in flight get ``grace`` seconds to finish, and what is left
is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dibs._errors import InvalidArgument
from dibs._signals import handle_stop_signals
from dibs.dialects.base import Listener
from dibs.outbox.claiming import Lane
from dibs.outbox.events import CHANNEL
from dibs.outbox.marking import Marks
from dibs.outbox.publishers import Publisher, publisher_for
from dibs.outbox.publishing import Publishing
from dibs.outbox.settings import RelaySettings
from dibs.outbox.stage import RelayOutbox, RelayStats
from dibs.outbox.upkeep import heartbeats, upkeep
from dibs.schema import require_current

__all__ = ["Relay", "RelayOutbox", "RelaySettings", "RelayStats"]

T = TypeVar("T")
log = logging.getLogger("dibs.relay")


class Relay:
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
        if settings is None:
            settings = RelaySettings(**options)
        elif options:
            settings = dataclasses.replace(settings, **options)
        self.settings = settings
        self.outbox = outbox
        self.publisher = publisher_for(publisher) if isinstance(publisher, str) else publisher
        if not isinstance(self.publisher, Publisher):
            raise InvalidArgument(f"publisher must be a URL or a dibs Publisher, got {publisher!r}")
        self.stats = RelayStats()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._db = ThreadPoolExecutor(settings.concurrency + 2, thread_name_prefix="dibs-relay-db")
        self._marks = Marks(outbox, self.stats, self._call)
        self._publishing = Publishing(self.publisher, self._marks, self._sleep)

    @property
    def name(self) -> str:
        """Its lease owner name, unique to it."""
        return self.settings.name

    # -- control -----------------------------------------------------------------------------------

    def run(self) -> RelayStats:
        """Run until stopped.

        Returns:
            What it did.
        """
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
        """Whether it was told to stop."""
        return self._stopping.is_set()

    def _stop_now(self) -> None:
        if self._stopped is not None:
            self._stopped.set()
        self._wake_up()

    async def arun(self) -> RelayStats:
        """:meth:`run` on the caller's event loop.

        Returns:
            What it did.
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        if self.stopping:
            self._stopped.set()
        try:
            await self._call(require_current, self.outbox.engine)
            await self._publishing.connect(give_up=self.settings.burst, stopping=lambda: self.stopping)
        except BaseException:
            self._db.shutdown(wait=True)
            raise
        self._signals(install=True)
        listener = self._listen()
        settings = self.settings
        lanes = [
            asyncio.create_task(self._lane().run(), name=f"dibs-relay-lane-{n}") for n in range(settings.concurrency)
        ]
        chores = [
            asyncio.create_task(heartbeats(settings, self.outbox, self._marks, self._call), name="dibs-relay-beats"),
            asyncio.create_task(upkeep(settings, self.outbox, self._call, self._wake_up), name="dibs-relay-upkeep"),
        ]
        log.info("relay %s started: target %s, publisher %s", self.name, settings.target, self.publisher.description)
        try:
            await self._until_stopped(lanes)
        finally:
            for chore in chores:
                chore.cancel()
            await asyncio.gather(*chores, return_exceptions=True)
            await self._marks.give_back_all()
            if listener is not None:
                await self._call(listener.close)
            self._signals(install=False)
            with contextlib.suppress(Exception):
                await self.publisher.close()
            self._db.shutdown(wait=True)
        log.info("relay %s stopped: %s", self.name, self.stats)
        return self.stats

    def _lane(self) -> Lane:
        return Lane(self.settings, self.outbox, self._publishing, self._call, self._sleep, lambda: self.stopping)

    async def _until_stopped(self, lanes: list[asyncio.Task[None]]) -> None:
        """Wait for a stop (or a lane's end: a burst found nothing left), then give the lanes the grace."""
        assert self._stopped is not None
        stopped = asyncio.create_task(self._stopped.wait())
        await asyncio.wait([stopped, *lanes], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        self._stopping.set()
        self._wake_up()
        _, late = await asyncio.wait(lanes, timeout=self.settings.grace) if lanes else (set(), set())
        for lane in late:
            lane.cancel()
        results = await asyncio.gather(*lanes, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.error("a relay lane failed: %r", result)

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
        target = self.settings.target

        def woken(payload: str) -> None:
            if not payload or target in payload.split(","):
                loop.call_soon_threadsafe(self._wake_up)

        return self.outbox.store.backend.listen(self.outbox.engine, CHANNEL, woken)

    # -- plumbing ----------------------------------------------------------------------------------

    def _signals(self, *, install: bool) -> None:
        if self.settings.handle_signals:
            assert self._loop is not None
            handle_stop_signals(self._loop, self._on_signal, install=install)

    def _on_signal(self, signum: int) -> None:
        log.info("relay %s got signal %d: stopping", self.name, signum)
        self.stop()

    async def _call(self, function: Callable[..., T], /, *args: Any) -> T:
        """Run a blocking database call on the relay's database threads."""
        assert self._loop is not None
        return await self._loop.run_in_executor(self._db, function, *args)
