"""The relay's chores beside its lanes: heartbeats for the events in flight, and the outbox's upkeep.

Upkeep makes failed events whose next attempt came pending again, recovers the events of relays that stopped
renewing their leases, and, with a retention, purges old published events (once a minute).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dibs.outbox.marking import Marks
from dibs.outbox.settings import RelaySettings
from dibs.outbox.stage import DatabaseCall, RelayOutbox

log = logging.getLogger("dibs.relay")

#: Seconds between purges of old published events.
PURGE_EVERY = 60.0


async def heartbeats(settings: RelaySettings, outbox: RelayOutbox, marks: Marks, call: DatabaseCall) -> None:
    """Renew the leases of the events in flight every heartbeat, until cancelled."""
    while True:
        await asyncio.sleep(settings.heartbeat_seconds)
        held = list(marks.in_flight.values())
        if not held:
            continue
        try:
            lost = await call(outbox.store.renew, outbox.engine, held, settings.lease)
        except Exception as error:  # tried again at the next beat, well before the leases expire
            log.warning("heartbeat failed, will try again: %s", error)
            continue
        for lease in lost:
            if marks.in_flight.get(lease.key) is lease:
                log.warning("lost the lease on event %s (it expired and was taken over)", lease.key[0])


async def upkeep(settings: RelaySettings, outbox: RelayOutbox, call: DatabaseCall, wake: Callable[[], None]) -> None:
    """Do the outbox's upkeep every ``upkeep_every`` seconds, until cancelled; wake the lanes when events became
    publishable."""
    store, engine = outbox.store, outbox.engine
    last_purge = 0.0
    while True:
        try:
            if await call(store.promote_due, engine):
                wake()
            if recovered := await call(store.recover_expired, engine):
                log.warning("recovered %d events of relays that stopped renewing their lease", recovered)
                wake()
            if settings.retention is not None and time.monotonic() - last_purge > PURGE_EVERY:
                last_purge = time.monotonic()
                await call(store.purge, engine, settings.retention)
        except Exception as error:
            log.warning("outbox upkeep failed, will try again: %s", error)
        await asyncio.sleep(settings.upkeep_every)
