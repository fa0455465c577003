"""The outbox's reads and writes for relays, all through claim and fenced leases.

* claim: pending events of one target, oldest first, each the head of its aggregate: no older event
  of the aggregate is still unfinished (pending, failed or abandoned, as the policy says) and none is
  being published. Events of one aggregate are then published one at a time, in creation order, by
  however many relays; different aggregates go in parallel.
* finish: completed, that is published (in batches, one token-fenced statement each), failed (retried after a backoff),
  abandoned after the last retry, or released unpublished (the broker could not be reached).
* upkeep, apart from the claim: failed events whose next attempt came are pending again, events held
  by a relay that died are pending again once its lease expired, and published events are purged.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._checks import ERROR_LIMIT
from dibs._errors import InvalidArgument
from dibs.claim import claim
from dibs.dialects import backend_for
from dibs.dialects.base import from_now, inline
from dibs.engine import connected
from dibs.lease import Lease, Leases
from dibs.schema import ABANDONED, FAILED, PENDING, PROCESSING, PUBLISHED, outbox

#: What a failed head of an aggregate does to the events behind it: ``block`` holds them until it is
#: published (after retries) or, once abandoned, requeued or discarded by hand; ``skip`` lets them go
#: ahead while it waits for its next attempt, and after it is abandoned.
FailedHead = Literal["block", "skip"]
FAILED_HEAD_POLICIES = ("block", "skip")

UPKEEP_BATCH = 1000
_DELAY = "dibs_retry_delay"
_TARGET = "dibs_target"

leases = Leases(
    outbox,
    ready=PENDING,
    running=PROCESSING,
    done=PUBLISHED,
    failed=FAILED,
    reclaim_expired=False,
)


def _at_head(policy: FailedHead) -> list[sa.ColumnElement[bool]]:
    """Whether the event heads its aggregate: no older one is unfinished (under ``skip``, failed and abandoned
    events are out of the line), and none is being published now.

    Two conditions, not one EXISTS with an OR (with the OR PostgreSQL hash-joined the whole table: a second
    per claim at 100,000 pending events): an anti-join probing the aggregate's unfinished events below this
    id, and the aggregates in flight read once per claim, through the index of processing events.
    """
    waiting = [PENDING, FAILED, ABANDONED] if policy == "block" else [PENDING]
    older = outbox.alias("dibs_older")
    in_flight = outbox.alias("dibs_in_flight")
    return [
        ~sa.exists(
            sa.select(older.c.id).where(
                older.c.target == outbox.c.target,
                older.c.aggregate_type == outbox.c.aggregate_type,
                older.c.aggregate_id == outbox.c.aggregate_id,
                older.c.status.in_(waiting),
                older.c.id < outbox.c.id,
            )
        ),
        # The aggregates in flight, read once per claim (PostgreSQL hashes them) rather than probed per event.
        sa.tuple_(outbox.c.target, outbox.c.aggregate_type, outbox.c.aggregate_id).not_in(
            sa.select(in_flight.c.target, in_flight.c.aggregate_type, in_flight.c.aggregate_id).where(
                in_flight.c.status == PROCESSING
            )
        ),
    ]


def checked_policy(policy: object) -> FailedHead:
    if policy not in FAILED_HEAD_POLICIES:
        raise InvalidArgument(f"on_failed_head must be 'block' or 'skip', got {policy!r}")
    return policy  # type: ignore[return-value]


class OutboxStore:
    """The relay's statements for one engine and one failed-head policy."""

    def __init__(self, engine: Engine, policy: FailedHead = "block") -> None:
        self.engine = engine
        self.backend = backend_for(engine.dialect)
        self.policy = checked_policy(policy)
        # The expressions of the lease writes, made once: a write is built and compiled once per expression.
        self._published_at = self.backend.now()
        self._next_attempt_at = self.backend.after(_DELAY)
        self._one_more_retry = outbox.c.retry_count + 1
        self.claimer = leases.claimer(
            # Ordered by the pending index's columns, (target, id): the events of one target in creation order.
            where=[self.backend.one_of(outbox.c.target, _TARGET), *_at_head(self.policy)],
            order_by=[outbox.c.target, outbox.c.id],
            columns=[
                outbox.c.target,
                outbox.c.aggregate_type,
                outbox.c.aggregate_id,
                outbox.c.event_type,
                outbox.c.payload,
                outbox.c.headers,
                outbox.c.created_at,
                outbox.c.retry_count,
                outbox.c.attempts,
            ],
        )

    def claim(
        self, conn: Engine | Connection, *, owner: str, limit: int, target: str, lease_seconds: float
    ) -> list[Lease]:
        """Lease up to ``limit`` publishable events of ``target`` to ``owner``, at most one per aggregate.

        Args:
            conn: The outbox's database.
            owner: The relay's lease owner name.
            limit: The most events claimed.
            target: The target whose events are claimed.
            lease_seconds: How long the leases last unless renewed.

        Returns:
            The leases, oldest event first, each with its row (the columns a publisher needs).
        """
        return self.claimer.claim(
            conn, owner=owner, duration=lease_seconds, limit=limit, parameters={_TARGET: [target]}
        )

    def complete(self, conn: Engine | Connection, held: Sequence[Lease]) -> list[Lease]:
        """Record events as published, in one token-fenced statement.

        Returns:
            The leases that were lost (those writes changed nothing).
        """
        return leases.complete_many(
            conn, held, status=PUBLISHED, set={outbox.c.published_at: self._published_at, outbox.c.last_error: None}
        )

    def fail(self, conn: Engine | Connection, held: Sequence[Lease], delay: timedelta, error: str) -> list[Lease]:
        """Count a failed publish and try the events again ``delay`` from now, the error kept.

        Returns:
            The leases that were lost (those writes changed nothing).
        """
        return leases.fail_many(
            conn,
            held,
            status=FAILED,
            set={
                outbox.c.next_attempt_at: self._next_attempt_at,
                outbox.c.retry_count: self._one_more_retry,
                outbox.c.last_error: error[:ERROR_LIMIT],
            },
            parameters={_DELAY: self.backend.after_value(delay.total_seconds())},
        )

    def abandon(self, conn: Engine | Connection, held: Sequence[Lease], error: str) -> list[Lease]:
        """Give up on events after their last retry, the error kept; returns the leases that were lost."""
        return leases.fail_many(
            conn,
            held,
            status=ABANDONED,
            set={outbox.c.retry_count: self._one_more_retry, outbox.c.last_error: error[:ERROR_LIMIT]},
        )

    def release(self, conn: Engine | Connection, held: Sequence[Lease]) -> list[Lease]:
        """Give back events that were not published (nothing counted): pending again at once."""
        return leases.release_many(conn, held)

    def renew(self, conn: Engine | Connection, held: Sequence[Lease], lease_seconds: float) -> list[Lease]:
        """Extend leases; returns those lost."""
        return leases.renew_many(conn, held, lease_seconds)

    def unfinished(self, conn: Engine | Connection, target: str) -> dict[str, int]:
        """How many events of ``target`` are being published or wait for a retry, by state (absent: none)."""
        query = (
            sa.select(outbox.c.status, sa.func.count())
            .where(outbox.c.target == target, outbox.c.status.in_([PROCESSING, FAILED]))
            .group_by(outbox.c.status)
        )
        with connected(conn) as connection:
            return {status: int(count) for status, count in connection.execute(query).all()}

    # -- upkeep ------------------------------------------------------------------------------------

    def promote_due(self, conn: Engine | Connection, limit: int = UPKEEP_BATCH) -> int:
        """Failed events whose next attempt has come are pending again; returns how many."""
        rows = claim(
            conn,
            outbox,
            where=[outbox.c.status == inline(FAILED), outbox.c.next_attempt_at <= self.backend.now()],
            set={outbox.c.status: PENDING},
            limit=limit,
            # In the due index's order: the database reads it from the index whatever its statistics say.
            order_by=[outbox.c.next_attempt_at],
        )
        return len(rows)

    def recover_expired(self, conn: Engine | Connection) -> int:
        """Events held by a relay that stopped renewing its lease (it died) are pending again."""
        return len(leases.recover(conn, status=PENDING, batch=UPKEEP_BATCH))

    def gather_first_statistics(self, conn: Engine | Connection) -> bool:
        """Analyze the outbox table if the database never has and it has grown; True once nothing is left to do
        (see :mod:`dibs.dialects.statistics`)."""
        with connected(conn) as connection:
            return self.backend.gather_first_statistics(connection, outbox)

    def purge(self, conn: Engine | Connection, older_than: timedelta, limit: int = 10_000) -> int:
        """Delete up to ``limit`` events published more than ``older_than`` ago; returns how many."""
        rows = claim(conn, outbox, where=self._purged(older_than), delete=True, limit=limit)
        return len(rows)

    def purgeable(self, conn: Engine | Connection, older_than: timedelta) -> int:
        """How many events purge() with this age would delete."""
        query = sa.select(sa.func.count()).select_from(outbox).where(*self._purged(older_than))
        with connected(conn) as connection:
            return int(connection.execute(query).scalar_one())

    def _purged(self, older_than: timedelta) -> list[sa.ColumnElement[bool]]:
        cutoff = from_now(self.backend, -older_than.total_seconds())
        return [outbox.c.status == PUBLISHED, outbox.c.published_at < cutoff]
