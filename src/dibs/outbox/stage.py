"""What the relay's stages (claim, publish, mark) share: the stats they count in and the outbox they read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.engine import Engine

from dibs.outbox.store import OutboxStore
from dibs.retry import Retry

#: The longest wait, in seconds, between tries while the broker cannot be reached.
OUTAGE_WAIT = 30.0


@dataclass
class RelayStats:
    """What one relay did, event by event."""

    #: Events claimed.
    claimed: int = 0
    #: Events the broker confirmed and the outbox recorded as published.
    published: int = 0
    #: Failed publishes that will be tried again after a backoff.
    retried: int = 0
    #: Events given up on after their last retry, their error kept.
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
