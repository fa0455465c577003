"""The transactional outbox: events written in the caller's business transaction, published by relays
to a broker at least once, in order per aggregate and in parallel across aggregates."""

from dibs.outbox.events import OutboxEvent
from dibs.outbox.outbox import Outbox, OutboxStatus
from dibs.outbox.publishers import BrokerUnavailable, Publisher, publisher_for
from dibs.outbox.relay import Relay, RelayStats
from dibs.outbox.settings import RelaySettings

__all__ = [
    "BrokerUnavailable",
    "Outbox",
    "OutboxEvent",
    "OutboxStatus",
    "Publisher",
    "Relay",
    "RelaySettings",
    "RelayStats",
    "publisher_for",
]
