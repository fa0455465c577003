"""Heartbeats: the leases a service holds, renewed before they expire, and the ones it lost, reported.

A lease lasts ``lease`` seconds from its last renewal; renewing every third of it leaves two beats to fail
before another service may take the row over. A renewal the database refuses (the lease expired and was
taken over, or the row was finished elsewhere) means the row is no longer this service's to work on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dibs.lease import Lease
from dibs.runtime.database import DatabaseThreads

#: Renews the leases given (blocking) and returns those it could not renew.
Renew = Callable[[list[Lease]], Sequence[Lease]]


class LeaseKeeper:
    """Holds a set of leases and renews them every ``every`` seconds until they are dropped.

    Holding and dropping are dictionary writes, made on the service's loop (or, for :meth:`in_thread`, from
    any thread: a renewal works on a copy taken at once).

    Args:
        renew: Renews a list of leases on the database (blocking); returns the ones it could not renew.
        every: Seconds between renewals.
        lost: Called, on the loop, with each lease that was held and could not be renewed, or whose row was
            claimed again (see :meth:`hold`); it is no longer held when called.
        failed: Called with the error when a renewal fails as a whole (it is tried again at the next beat,
            well before the leases expire).
        also: Awaited after each renewal, on the same beat (a worker looks for cancelled jobs then).

    Example:
        >>> keeper = LeaseKeeper(lambda leases: [], every=10.0, lost=print)
        >>> keeper.held
        {}
    """

    def __init__(
        self,
        renew: Renew,
        *,
        every: float,
        lost: Callable[[Lease], None],
        failed: Callable[[Exception], None] | None = None,
        also: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.every = every
        #: The leases held, by row key.
        self.held: dict[tuple[Any, ...], Lease] = {}
        self._renew = renew
        self._lost = lost
        self._failed = failed
        self._also = also

    def hold(self, leases: Iterable[Lease]) -> None:
        """Renew these leases, just claimed, from now on.

        An older lease held on one of their rows expired before the row was claimed again: it is lost, and
        reported so (its run is stopped), as a renewal would have found.
        """
        held, lost = self.held, self._lost
        for lease in leases:
            older = held.get(lease.key)
            held[lease.key] = lease
            if older is not None and older is not lease:
                lost(older)

    def keep(self, leases: Iterable[Lease]) -> None:
        """Renew these leases again (the write of their outcome failed and is tried later), but none over a
        newer lease of its row (a higher token): that one's run owns the row now."""
        held = self.held
        for lease in leases:
            current = held.get(lease.key)
            if current is None or current.token < lease.token:
                held[lease.key] = lease

    def drop(self, lease: Lease) -> None:
        """Renew this lease no more (its row is finished, given back or lost).

        Only this very lease: a newer one of its row (claimed again once this one expired) is still renewed.
        """
        if self.held.get(lease.key) is lease:
            del self.held[lease.key]

    def holds(self, lease: Lease) -> bool:
        """Whether this very lease (not an older or newer one of its row) is held."""
        return self.held.get(lease.key) is lease

    async def run(self, threads: DatabaseThreads) -> None:
        """Renew the leases held every ``every`` seconds until cancelled; a failed beat is tried again at the next."""
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.beat(threads)
            except Exception as error:
                if self._failed is not None:
                    self._failed(error)

    async def beat(self, threads: DatabaseThreads) -> None:
        """Renew every lease held now, once, on ``threads``; report the ones lost."""
        held = list(self.held.values())
        if held:
            self._report(await threads.call(self._renew, held))
        if self._also is not None:
            await self._also()

    @contextmanager
    def in_thread(self, name: str = "dibs-lease-keeper") -> Iterator[LeaseKeeper]:
        """Renew the leases held from a thread of its own for the block, for a service with no event loop.

        ``lost`` and ``failed`` are called on that thread; ``also`` is not used.
        """
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.every):
                held = list(self.held.copy().values())
                if not held:
                    continue
                try:
                    self._report(self._renew(held))
                except Exception as error:
                    if self._failed is not None:
                        self._failed(error)

        thread = threading.Thread(target=beat, name=name, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def _report(self, lost: Sequence[Lease]) -> None:
        for lease in lost:
            # Finished (or claimed anew) while the renewal ran: nothing was lost.
            if self.holds(lease):
                self.drop(lease)
                self._lost(lease)
