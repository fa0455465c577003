"""The Outbox: events written in the caller's business transaction, and everything done to them from
outside a relay.

::

    outbox = dibs.Outbox("postgresql+psycopg://localhost/shop")

    with engine.begin() as conn:                        # the business change and its event commit together
        conn.execute(orders.insert(), {"id": 42, "total": 990})
        outbox.add(conn, "order", 42, "order.placed", {"total": 990})

    outbox.relay("redis://localhost:6379/0").run()      # publishes them, in order per order
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dibs._checks import checked_count, checked_id, checked_seconds, checked_text
from dibs._errors import EventNotFound, InvalidArgument
from dibs.dialects import backend_for
from dibs.dialects.base import from_now
from dibs.engine import connected, writing
from dibs.outbox.events import CHANNEL, NAME_LIMITS, OutboxEvent, event_from, insert_events, new_event
from dibs.outbox.relay import Relay
from dibs.outbox.settings import RelaySettings
from dibs.outbox.store import FailedHead, OutboxStore, checked_policy
from dibs.retry import Retry
from dibs.schema import (
    ABANDONED,
    EVENT_STATES,
    FAILED,
    PENDING,
    PUBLISHED,
    DibsDatabase,
    aware,
    outbox,
    tables_checked,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from dibs.outbox.publishers import Publisher

#: How a failed publish is retried unless the Outbox is told otherwise: 1 s, 2 s, 4 s ... up to 5 minutes.
DEFAULT_RETRY = Retry(base=1.0, factor=2.0, cap=300.0)


@dataclass(frozen=True, kw_only=True)
class OutboxStatus:
    """How one target stands: events per state, how long the oldest pending event has waited, and how many
    were published per second over the last minute."""

    target: str
    counts: dict[str, int]
    oldest_pending_seconds: float | None
    published_per_second: float


class Outbox(DibsDatabase):
    """The outbox table of one database: events written in the caller's transaction, published by relays.

    Args:
        db: An Engine, a URL, or by default ``$DIBS_DATABASE_URL`` or the SQLite file ``dibs.sqlite``.
        on_failed_head: ``block`` (the default) holds an aggregate's later events while its oldest one fails
            and retries, and after it is abandoned until it is requeued; ``skip`` lets them go ahead.
        max_retries: How many times a failed publish of one event is retried before the event is abandoned,
            its last error kept: an event is published at most ``max_retries + 1`` times (``0``: abandoned
            at its first failure).
        retry: The backoff between the tries, and which errors are retried at all.
        max_payload_bytes: The most bytes of JSON one event's payload may take.
        notify: Wake PostgreSQL relays when events are added.

    Raises:
        InvalidArgument: An option out of range, or a URL that can never work (see :class:`dibs.App`).

    Example:
        >>> outbox = dibs.Outbox("sqlite:///shop.sqlite")
        >>> outbox.init()
        >>> with outbox.engine.begin() as conn:
        ...     outbox.add(conn, "order", 42, "order.placed", {"total": 99})
        >>> outbox.relay("stdout://", burst=True).run()
    """

    def __init__(
        self,
        db: str | Engine | None = None,
        *,
        on_failed_head: FailedHead = "block",
        max_retries: int = 10,
        retry: Retry = DEFAULT_RETRY,
        max_payload_bytes: int = 1_000_000,
        notify: bool = True,
    ) -> None:
        super().__init__(db)
        self.on_failed_head = checked_policy(on_failed_head)
        checked_count(max_retries, "max_retries", minimum=0)
        if not isinstance(retry, Retry):
            raise InvalidArgument(f"retry must be a dibs.Retry, got {retry!r}")
        checked_count(max_payload_bytes, "max_payload_bytes")
        self.max_retries = max_retries
        self.retry = retry
        self.max_payload_bytes = max_payload_bytes
        self.notify = notify
        self._store: OutboxStore | None = None

    # -- database ----------------------------------------------------------------------------------

    @property
    def store(self) -> OutboxStore:
        if self._store is None:
            self._store = OutboxStore(self.engine, self.on_failed_head)
        return self._store

    # -- add ---------------------------------------------------------------------------------------

    def add(
        self,
        conn: Connection | Session,
        aggregate_type: str,
        aggregate_id: str | int,
        event_type: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> int:
        """Write one event in ``conn``'s transaction (a Connection or an ORM Session); returns its id.

        The event is published once that transaction commits, and never if it rolls back. ``payload`` is
        anything JSON can hold; ``headers`` string pairs passed to the broker; ``target`` the relay's target.
        """
        event = new_event(
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            event_type=event_type,
            payload=payload,
            headers=headers,
            target=target,
            max_payload_bytes=self.max_payload_bytes,
        )
        return self._write(conn, [event])[0]

    def add_many(self, conn: Connection | Session, events: Iterable[Mapping[str, Any]]) -> list[int]:
        """Write many events (dicts with add()'s argument names) in one round trip; all or none."""
        return self._write(conn, self._checked(events))

    async def aadd(
        self,
        conn: AsyncConnection | AsyncSession,
        aggregate_type: str,
        aggregate_id: str | int,
        event_type: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> int:
        """add() for asyncio, in an AsyncConnection's or AsyncSession's transaction."""
        event = new_event(
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            event_type=event_type,
            payload=payload,
            headers=headers,
            target=target,
            max_payload_bytes=self.max_payload_bytes,
        )
        return (await self._awrite(conn, [event]))[0]

    async def aadd_many(self, conn: AsyncConnection | AsyncSession, events: Iterable[Mapping[str, Any]]) -> list[int]:
        """add_many() for asyncio."""
        return await self._awrite(conn, self._checked(events))

    def _checked(self, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(events, (Mapping, str, bytes)) or not isinstance(events, Iterable):
            raise InvalidArgument(f"add_many takes a list of event dicts, got {events!r}; for one event use add")
        return [event_from(fields, self.max_payload_bytes) for fields in events]

    def _tables(self) -> AbstractContextManager[None]:
        """Turn a statement's failure into SchemaMissing when the dibs tables are missing or out of date."""
        return tables_checked(self.engine)

    def _channel(self) -> str | None:
        return CHANNEL if self.notify else None

    def _write(self, conn: Any, events: list[dict[str, Any]]) -> list[int]:
        if isinstance(conn, Engine):
            with tables_checked(conn), writing(conn) as connection:
                return insert_events(connection, events, self._channel())
        if isinstance(conn, Connection):
            # Inside the caller's transaction, or the one this statement begins: the caller commits it, with
            # the business change, or rolls both back.
            with tables_checked(conn.engine):
                return insert_events(conn, events, self._channel())
        connection_of = getattr(conn, "connection", None)
        if callable(connection_of) and not asyncio.iscoroutinefunction(connection_of):
            # An ORM Session: join its transaction; the caller commits.
            connection = connection_of()
            with tables_checked(connection.engine):
                return insert_events(connection, events, self._channel())
        raise InvalidArgument(
            "add() writes in the caller's transaction: pass a SQLAlchemy Connection or Session (AsyncConnection "
            f"or AsyncSession to aadd()), got {type(conn).__name__}"
        )

    async def _awrite(self, conn: Any, events: list[dict[str, Any]]) -> list[int]:
        run_sync = getattr(conn, "run_sync", None)
        if run_sync is None:
            raise InvalidArgument(
                f"aadd() writes in the caller's transaction: pass an AsyncConnection or AsyncSession, "
                f"got {type(conn).__name__}"
            )
        ids: list[int] = await run_sync(lambda sync: self._write(sync, events))
        return ids

    # -- inspection --------------------------------------------------------------------------------

    def get(self, event_id: int) -> OutboxEvent:
        """The event with this id; EventNotFound if there is none."""
        event_id = _event_id(event_id)
        with self._tables(), connected(self.engine) as conn:
            row = conn.execute(sa.select(outbox).where(outbox.c.id == event_id)).first()
        if row is None:
            raise EventNotFound(f"there is no outbox event {event_id} (it may have been purged)")
        return OutboxEvent.from_row(row)

    def events(
        self,
        *,
        status: str | Sequence[str] | None = None,
        target: str | None = None,
        aggregate_type: str | None = None,
        aggregate_id: str | int | None = None,
        limit: int = 50,
        newest_first: bool = False,
    ) -> list[OutboxEvent]:
        """Events in creation order (or newest first), filtered by state(s), target and aggregate."""
        order = outbox.c.id.desc() if newest_first else outbox.c.id
        query = sa.select(outbox).order_by(order).limit(checked_count(limit, "limit", minimum=0))
        if status is not None:
            query = query.where(outbox.c.status.in_(_states(status)))
        for column, value in ((outbox.c.target, target), (outbox.c.aggregate_type, aggregate_type)):
            if value is not None:
                query = query.where(column == checked_text(value, column.name, NAME_LIMITS[column.name]))
        if aggregate_id is not None:
            chosen = checked_text(str(aggregate_id), "aggregate_id", NAME_LIMITS["aggregate_id"])
            query = query.where(outbox.c.aggregate_id == chosen)
        with self._tables(), connected(self.engine) as conn:
            return OutboxEvent.from_rows(conn.execute(query).all())

    def status(self) -> list[OutboxStatus]:
        """Per target: events per state, the oldest pending event's wait, and recent throughput."""
        backend = backend_for(self.engine.dialect)
        with self._tables(), connected(self.engine) as conn:
            now = aware(conn.execute(sa.select(backend.now())).scalar_one())
            counts = conn.execute(
                sa.select(outbox.c.target, outbox.c.status, sa.func.count()).group_by(outbox.c.target, outbox.c.status)
            ).all()
            oldest = dict(
                conn.execute(
                    sa.select(outbox.c.target, sa.func.min(outbox.c.created_at))
                    .where(outbox.c.status == PENDING)
                    .group_by(outbox.c.target)
                ).all()
            )
            recent: dict[str, int] = dict(
                conn.execute(
                    sa.select(outbox.c.target, sa.func.count())
                    .where(outbox.c.status == PUBLISHED, outbox.c.published_at >= from_now(backend, -60.0))
                    .group_by(outbox.c.target)
                ).all()
            )
        per_target: dict[str, dict[str, int]] = {}
        for target, state, count in counts:
            per_target.setdefault(target, dict.fromkeys(EVENT_STATES, 0))[state] = count
        return [
            OutboxStatus(
                target=target,
                counts=per_target[target],
                oldest_pending_seconds=(
                    max(0.0, (now - aware(oldest[target])).total_seconds()) if oldest.get(target) else None
                ),
                published_per_second=recent.get(target, 0) / 60.0,
            )
            for target in sorted(per_target)
        ]

    # -- upkeep by hand ----------------------------------------------------------------------------

    def requeue(
        self,
        ids: Iterable[int] | None = None,
        *,
        status: str | Sequence[str] = (FAILED, ABANDONED),
        target: str | None = None,
    ) -> int:
        """Make failed or abandoned events (those of ``ids``, or all of them) pending again, their retries
        counted from zero and their last error kept until they are published; returns how many."""
        wanted = _states(status)
        wrong = set(wanted) - {FAILED, ABANDONED}
        if wrong:
            raise InvalidArgument(f"only failed or abandoned events can be requeued, not {sorted(wrong)}")
        change = (
            sa.update(outbox)
            .where(outbox.c.status.in_(wanted))
            .values(status=PENDING, retry_count=0, next_attempt_at=None)
        )
        if target is not None:
            change = change.where(outbox.c.target == checked_text(target, "target", NAME_LIMITS["target"]))
        chosen = None if ids is None else _event_ids(ids)
        if chosen is not None and not chosen:
            return 0
        with self._tables(), writing(self.engine) as conn:
            if chosen is None:
                return int(conn.execute(change).rowcount)
            return sum(
                int(conn.execute(change.where(outbox.c.id.in_(chosen[i : i + 1000]))).rowcount)
                for i in range(0, len(chosen), 1000)
            )

    def purge(self, *, older_than: timedelta = timedelta(0)) -> int:
        """Delete events published more than ``older_than`` ago; returns how many."""
        older_than = timedelta(seconds=checked_seconds(older_than, "older_than", zero=True))
        total = 0
        with self._tables():
            while purged := self.store.purge(self.engine, older_than):
                total += purged
        return total

    def purgeable(self, *, older_than: timedelta = timedelta(0)) -> int:
        """How many events :meth:`purge` with this age would delete now; nothing is deleted."""
        older_than = timedelta(seconds=checked_seconds(older_than, "older_than", zero=True))
        with self._tables():
            return self.store.purgeable(self.engine, older_than)

    def discard(self, ids: Iterable[int]) -> int:
        """Delete abandoned events for good (under ``block``, this lets their aggregates go on); returns how many."""
        chosen = _event_ids(ids)
        if not chosen:
            return 0
        with self._tables(), writing(self.engine) as conn:
            return int(
                conn.execute(sa.delete(outbox).where(outbox.c.id.in_(chosen), outbox.c.status == ABANDONED)).rowcount
            )

    # -- relays ------------------------------------------------------------------------------------

    def relay(self, publisher: Publisher | str, settings: RelaySettings | None = None, **options: Any) -> Relay:
        """A relay publishing this outbox's events, each at most ``max_retries + 1`` times before it is abandoned.

        Args:
            publisher: A :class:`~dibs.outbox.publishers.Publisher`, or a URL naming one.
            settings: How it runs (default: the defaults of :class:`dibs.RelaySettings`).
            **options: Settings by name, over ``settings``.

        Returns:
            The relay, not yet running: call its ``run()`` or ``await arun()``.
        """
        return Relay(self, publisher, settings, **options)


def _states(status: str | Sequence[str]) -> list[str]:
    if not isinstance(status, (str, Iterable)):
        raise InvalidArgument(f"status must be an outbox event state or a list of them, got {status!r}")
    wanted = [status] if isinstance(status, str) else list(status)
    unknown = set(wanted) - set(EVENT_STATES)
    if unknown or not wanted:
        raise InvalidArgument(f"unknown outbox event state {sorted(unknown)}; states are {', '.join(EVENT_STATES)}")
    return wanted


def _event_id(value: object) -> int:
    return checked_id(value, "an event id")


def _event_ids(ids: object) -> list[int]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InvalidArgument(f"ids must be a list of event ids, got {ids!r}; for one event, pass [{ids!r}]")
    return [_event_id(value) for value in ids]
