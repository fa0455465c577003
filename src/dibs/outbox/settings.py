"""A relay's settings, checked once: what :class:`~dibs.outbox.relay.Relay` takes, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from dibs._checks import checked_count, checked_seconds, checked_text, default_owner
from dibs._errors import InvalidArgument
from dibs.lease import OWNER_LIMIT
from dibs.outbox.events import NAME_LIMITS
from dibs.schema import DEFAULT_TARGET


@dataclass(frozen=True, kw_only=True)
class RelaySettings:
    """How a relay runs, checked when made: an out-of-range value raises :class:`~dibs.InvalidArgument` saying
    what fits. Durations are seconds (a timedelta is taken too) and are kept as seconds.

    Example:
        >>> settings = dibs.RelaySettings(batch=500, concurrency=2, lease=60)
        >>> settings.heartbeat_seconds
        20.0
        >>> relay = outbox.relay("redis://localhost:6379/0", settings=settings)
    """

    #: The target whose events the relay publishes.
    target: str = DEFAULT_TARGET
    #: Most events claimed per round trip.
    batch: int = 200
    #: Batches in flight at once.
    concurrency: int = 1
    #: Seconds a claim is held before another relay may take its events over.
    lease: float = 30.0
    #: Seconds between renewals of the leases in flight, below the lease (None: a third of the lease, which
    #: it is once the settings are made).
    heartbeat: float | None = None
    #: The longest wait, in seconds, between looks for events when idle.
    poll: float = 1.0
    #: Seconds the batches in flight get to finish at shutdown.
    grace: float = 10.0
    #: Seconds between upkeep rounds (failed events due again, expired leases recovered, purges).
    upkeep_every: float = 1.0
    #: Purge published events older than this (None: keep them).
    retention: timedelta | None = None
    #: Stop once no event is left to publish, instead of waiting for more.
    burst: bool = False
    #: The relay's lease owner name, unique to it (default: host, process id and a random part).
    name: str = field(default_factory=default_owner)
    #: Stop gracefully on SIGTERM and SIGINT (only where the relay runs in the main thread).
    handle_signals: bool = True

    def __post_init__(self) -> None:
        checked_text(self.target, "target", NAME_LIMITS["target"])
        checked_count(self.batch, "batch")
        checked_count(self.concurrency, "concurrency")
        lease = checked_seconds(self.lease, "lease")
        heartbeat = lease / 3 if self.heartbeat is None else checked_seconds(self.heartbeat, "heartbeat")
        if heartbeat >= lease:
            raise InvalidArgument(
                f"heartbeat must be shorter than the lease ({lease:g} s), got {self.heartbeat!r}; "
                "a third of the lease (the default) renews it twice before it could expire"
            )
        retention = self.retention
        if retention is not None:
            retention = timedelta(seconds=checked_seconds(retention, "retention", zero=True))
        for name, value in (
            ("lease", lease),
            ("heartbeat", heartbeat),
            ("poll", checked_seconds(self.poll, "poll")),
            ("grace", checked_seconds(self.grace, "grace", zero=True)),
            ("upkeep_every", checked_seconds(self.upkeep_every, "upkeep_every")),
            ("retention", retention),
            ("name", checked_text(self.name, "name", OWNER_LIMIT)),
        ):
            # Frozen: the checked, normalised value replaces the given one once, here.
            object.__setattr__(self, name, value)

    @property
    def heartbeat_seconds(self) -> float:
        """Seconds between renewals of the leases in flight: :attr:`heartbeat`, or a third of the lease."""
        return self.lease / 3 if self.heartbeat is None else self.heartbeat
