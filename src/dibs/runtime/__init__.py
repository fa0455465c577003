"""What every long-running service shares: its lifecycle and signals, its database threads, its wake-ups
(LISTEN or polling with backoff), the lease keeper (heartbeats, lost leases), a timed batch writer and
upkeep chores. Each is one small piece; a service is their wiring plus its own stages."""

from dibs.runtime.backoff import Backoff
from dibs.runtime.batch_writer import BatchWriter
from dibs.runtime.collector import tuned_gc
from dibs.runtime.database import DatabaseThreads
from dibs.runtime.lease_keeper import LeaseKeeper
from dibs.runtime.service import Service
from dibs.runtime.signals import handle_stop_signals
from dibs.runtime.upkeep import Chore, Upkeep, until_done
from dibs.runtime.wakeup import Wakeup

__all__ = [
    "Backoff",
    "BatchWriter",
    "Chore",
    "DatabaseThreads",
    "LeaseKeeper",
    "Service",
    "Upkeep",
    "Wakeup",
    "handle_stop_signals",
    "tuned_gc",
    "until_done",
]
