"""The relay's last stage: each event's outcome written to the outbox, fenced by its lease.

An event is completed (published), retried after a backoff, abandoned after its last retry, or given back
unpublished. A write whose lease was taken over changes nothing and is counted as lost; a write that fails
leaves its events to go out again once their leases expire: published at least once, never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dibs.lease import Lease
from dibs.outbox.failures import sorted_failures
from dibs.outbox.stage import RelayOutbox, RelayStats
from dibs.runtime import DatabaseThreads, LeaseKeeper

log = logging.getLogger("dibs.relay")


class Marks:
    """Writes what became of each event in flight; the lease keeper holds their leases until then."""

    def __init__(self, outbox: RelayOutbox, stats: RelayStats, threads: DatabaseThreads, keeper: LeaseKeeper) -> None:
        self.outbox = outbox
        self.stats = stats
        self.threads = threads
        self.keeper = keeper

    async def complete(self, leases: list[Lease]) -> None:
        """Record events as published."""
        await self._write(leases, "published", self.outbox.store.complete)

    async def fail(self, failed: list[tuple[Lease, BaseException]]) -> None:
        """Retry each failed event after its backoff, or abandon it; one log line per kind of failure, and one
        write per error."""
        max_retries, retry = self.outbox.max_retries, self.outbox.retry
        groups = sorted_failures(
            [(lease, lease.row._mapping["retry_count"], error) for lease, error in failed],
            max_retries=max_retries,
            retry=retry,
        )
        store = self.outbox.store
        for group in groups:
            log.warning("%s", group.describe(max_retries))
            for text, leases in group.by_error.items():
                if group.abandoned:
                    await self._write(leases, "abandoned", store.abandon, text)
                else:
                    await self._write(leases, "retried", store.fail, retry.delay(group.failures), text)

    async def give_back(self, leases: list[Lease]) -> None:
        """Make events pending again at once, unpublished and with no retry counted."""
        if not leases:
            return
        self._drop(leases)
        try:
            lost = await self.threads.call(self.outbox.store.release, self.outbox.engine, leases)
        except Exception as error:
            log.warning("could not give back %d events; they go out once their leases expire: %s", len(leases), error)
            return
        self.stats.released += len(leases) - len(lost)

    async def give_back_all(self) -> None:
        """Give back every event still in flight (the relay is stopping)."""
        await self.give_back(list(self.keeper.held.values()))

    def _drop(self, leases: list[Lease]) -> None:
        for lease in leases:
            self.keeper.drop(lease)

    async def _write(self, leases: list[Lease], outcome: str, write: Callable[..., list[Lease]], *args: Any) -> None:
        """Write one outcome for these leases; counted in the stats, the lost ones logged."""
        self._drop(leases)
        try:
            lost = await self.threads.call(write, self.outbox.engine, leases, *args)
        except Exception as error:
            log.warning(
                "could not record %d events as %s; they will be published again: %s", len(leases), outcome, error
            )
            return
        setattr(self.stats, outcome, getattr(self.stats, outcome) + len(leases) - len(lost))
        self.stats.lost += len(lost)
        for lease in lost:
            log.warning("event %s was %s, but its lease had been taken over: not recorded", lease.key[0], outcome)
