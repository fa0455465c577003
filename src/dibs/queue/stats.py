"""What one worker did, counted as it goes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerStats:
    """What one worker did."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    released: int = 0
    #: Outcomes the database refused because the lease had been taken over: the job runs elsewhere.
    lost: int = 0
