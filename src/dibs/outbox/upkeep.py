"""The outbox's upkeep, run by each relay beside its lanes, apart from the claim.

Failed events whose next attempt came are pending again, the events of relays that stopped renewing their
leases (they died) are recovered, a new outbox table is analyzed on PostgreSQL if autovacuum has not yet,
and, with a retention, old published events are purged once a minute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dibs.outbox.settings import RelaySettings
from dibs.outbox.stage import RelayOutbox
from dibs.runtime import Chore, DatabaseThreads, until_done

log = logging.getLogger("dibs.relay")

#: Seconds between purges of old published events.
PURGE_EVERY = 60.0


def outbox_chores(
    settings: RelaySettings, outbox: RelayOutbox, threads: DatabaseThreads, wake: Callable[[], None]
) -> list[Chore]:
    """The relay's chores; ``wake`` is called when events became publishable, so that idle lanes claim them."""
    store, engine = outbox.store, outbox.engine

    async def retry_due() -> None:
        if await threads.call(store.promote_due, engine):
            wake()

    async def recover() -> None:
        if recovered := await threads.call(store.recover_expired, engine):
            log.warning("recovered %d events of relays that stopped renewing their lease", recovered)
            wake()

    chores = [
        Chore("retry due events", settings.upkeep_every, retry_due),
        Chore("recover", settings.upkeep_every, recover),
        # Once they are there, the database keeps them.
        until_done("statistics", settings.upkeep_every, lambda: threads.call(store.gather_first_statistics, engine)),
    ]
    retention = settings.retention
    if retention is not None:

        async def purge() -> None:
            await threads.call(store.purge, engine, retention)

        chores.append(Chore("purge", PURGE_EVERY, purge))
    return chores


def upkeep_failed(chore: Chore, error: Exception) -> None:
    """Log a chore that failed; it is tried again at its next turn."""
    log.warning("outbox upkeep failed (%s), will try again: %s", chore.name, error)
