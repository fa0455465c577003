"""Fenced leases: a claim that later writes must prove they still hold.

A leased row carries a status, an owner, an expiry on the database clock, a token that goes up by one
at every claim, and an attempt count. Claiming takes ready rows and rows whose lease has expired.
Every later write (renew, complete, fail, release) is guarded by ``pk = :pk AND token = :token AND
status = 'running'``, so a worker whose lease was taken over changes nothing, is told so by
:class:`~dibs.LeaseLost` (or in the list a batched write returns), and stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from dibs._errors import InvalidArgument, LeaseLost
from dibs.claim import Criteria, Ordering, aclaim, claim, column_of, resolve_table
from dibs.dialects import backend_for
from dibs.dialects.base import key_of
from dibs.schema import Timestamp

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from dibs.dialects.base import Then

T = TypeVar("T")
Duration = timedelta | float | int


def lease_columns(
    *,
    status: str = "status",
    owner: str = "lease_owner",
    expires_at: str = "lease_expires_at",
    token: str = "lease_token",
    attempts: str = "attempts",
    ready: str = "ready",
) -> list[sa.Column[Any]]:
    """Fresh columns that give a table what :class:`Leases` needs; add them to your Table definition."""
    return [
        sa.Column(status, sa.String(32), nullable=False, server_default=ready),
        sa.Column(owner, sa.String(200), nullable=True),
        sa.Column(expires_at, Timestamp, nullable=True),
        sa.Column(token, sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(attempts, sa.Integer, nullable=False, server_default="0"),
    ]


@dataclass(frozen=True, kw_only=True)
class Lease:
    """One claimed row and the proof of holding it: its key and the token the claim gave it."""

    key: tuple[Any, ...]
    token: int
    owner: str
    expires_at: datetime
    row: Row[Any]


def _seconds(duration: Duration, name: str = "duration") -> float:
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise InvalidArgument(f"{name} must be a positive timedelta or number of seconds, got {duration!r}")
    return float(seconds)


def _aware(moment: datetime) -> datetime:
    """Backends without time zones store UTC; say so on the value."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


@contextmanager
def _transaction(bind: Engine | Connection) -> Iterator[Connection]:
    """The caller's open transaction if it has one (the write joins it), else a new one that commits."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    elif bind.in_transaction():
        yield bind
    else:
        with bind.begin():
            yield bind


async def _run_async(bind: AsyncEngine | AsyncConnection, work: Callable[..., T], *args: Any) -> T:
    from sqlalchemy.ext.asyncio import AsyncEngine

    if isinstance(bind, AsyncEngine):
        async with bind.connect() as conn:
            return await conn.run_sync(work, *args)
    return await bind.run_sync(work, *args)


class Leases:
    """Fenced leases over a table that has the columns :func:`lease_columns` makes (names configurable).

    ``strategy`` picks the claim strategy by name, as :func:`dibs.claim` does; unset, the native one.
    """

    def __init__(
        self,
        table: Any,
        *,
        status: str = "status",
        owner: str = "lease_owner",
        expires_at: str = "lease_expires_at",
        token: str = "lease_token",
        attempts: str = "attempts",
        ready: str = "ready",
        running: str = "running",
        done: str = "done",
        failed: str = "failed",
        strategy: str | None = None,
    ) -> None:
        self.table = resolve_table(table)
        self.strategy = strategy
        self.status = column_of(self.table, status, "Leases(status=)")
        self.owner = column_of(self.table, owner, "Leases(owner=)")
        self.expires_at = column_of(self.table, expires_at, "Leases(expires_at=)")
        self.token = column_of(self.table, token, "Leases(token=)")
        self.attempts = column_of(self.table, attempts, "Leases(attempts=)")
        self.ready, self.running, self.done, self.failed = ready, running, done, failed
        self.key_columns = tuple(self.table.primary_key.columns)

    # -- claim -------------------------------------------------------------------------------------

    def claim(
        self,
        bind: Engine | Connection,
        *,
        owner: str,
        duration: Duration,
        where: Criteria = None,
        limit: int = 1,
        order_by: Ordering = (),
        set: Mapping[Any, Any] | None = None,
        then: Then | None = None,
    ) -> list[Lease]:
        """Lease up to ``limit`` ready or expired rows to ``owner`` for ``duration``; each gets a new token."""
        arguments = self._claim_arguments(bind, owner, duration, where, set)
        rows = claim(bind, self.table, limit=limit, order_by=order_by, then=then, strategy=self.strategy, **arguments)
        return self._leases(rows, owner)

    async def aclaim(
        self,
        bind: AsyncEngine | AsyncConnection,
        *,
        owner: str,
        duration: Duration,
        where: Criteria = None,
        limit: int = 1,
        order_by: Ordering = (),
        set: Mapping[Any, Any] | None = None,
        then: Then | None = None,
    ) -> list[Lease]:
        """claim() for asyncio."""
        arguments = self._claim_arguments(bind, owner, duration, where, set)
        rows = await aclaim(
            bind, self.table, limit=limit, order_by=order_by, then=then, strategy=self.strategy, **arguments
        )
        return self._leases(rows, owner)

    def eligible(self, bind: Any) -> sa.ColumnElement[bool]:
        """Ready rows, and running rows whose lease has expired on the database clock."""
        now = backend_for(bind.dialect).now()
        return sa.or_(
            self.status == self.ready,
            sa.and_(self.status == self.running, self.expires_at < now),
        )

    def _claim_arguments(
        self, bind: Any, owner: str, duration: Duration, where: Criteria, extra: Mapping[Any, Any] | None
    ) -> dict[str, Any]:
        if not isinstance(owner, str) or not owner:
            raise InvalidArgument(f"owner must be a non-empty string naming the worker, got {owner!r}")
        backend = backend_for(bind.dialect)
        criteria: list[Any] = [self.eligible(bind)]
        if where is not None:
            criteria.extend([where] if isinstance(where, sa.ClauseElement) else list(where))
        values: dict[Any, Any] = {
            self.status: self.running,
            self.owner: owner,
            self.expires_at: backend.after(_seconds(duration)),
            self.token: self.token + 1,
            self.attempts: self.attempts + 1,
        }
        values.update(extra or {})
        return {"where": sa.and_(*criteria), "set": values}

    def _leases(self, rows: Iterable[Row[Any]], owner: str) -> list[Lease]:
        return [
            Lease(
                key=key_of(row, self.key_columns),
                token=row._mapping[self.token.name],
                owner=owner,
                expires_at=_aware(row._mapping[self.expires_at.name]),
                row=row,
            )
            for row in rows
        ]

    # -- guarded writes ----------------------------------------------------------------------------

    def renew(self, bind: Engine | Connection, lease: Lease, duration: Duration) -> None:
        """Extend a held lease to ``duration`` from now; raises LeaseLost if it is no longer held."""
        self._raise_lost(self.renew_many(bind, [lease], duration), "renew")

    def renew_many(self, bind: Engine | Connection, leases: Sequence[Lease], duration: Duration) -> list[Lease]:
        """Extend many leases in one statement; returns the leases that were lost (and not renewed)."""
        backend = backend_for(bind.dialect)
        values = {self.expires_at: backend.after(_seconds(duration))}
        return self._write(bind, leases, values, self.running)

    def complete(
        self,
        bind: Engine | Connection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """Finish a held lease (status ``done`` unless given); raises LeaseLost if it is no longer held."""
        self._raise_lost(self.complete_many(bind, [lease], status=status, set=set), "complete")

    def complete_many(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> list[Lease]:
        """Finish many leases in one statement; returns the leases that were lost (and left unchanged)."""
        return self._write(bind, leases, self._finish(status or self.done, set), status or self.done)

    def fail(
        self,
        bind: Engine | Connection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """Mark a held lease failed (status ``failed`` unless given); raises LeaseLost if it is no longer held."""
        self._raise_lost(self.fail_many(bind, [lease], status=status, set=set), "fail")

    def fail_many(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> list[Lease]:
        """Mark many leases failed in one statement; returns the leases that were lost."""
        return self._write(bind, leases, self._finish(status or self.failed, set), status or self.failed)

    def release(self, bind: Engine | Connection, lease: Lease) -> None:
        """Give back a lease whose work never started: ready again at once, and the attempt not counted."""
        self._raise_lost(self.release_many(bind, [lease]), "release")

    def release_many(self, bind: Engine | Connection, leases: Sequence[Lease]) -> list[Lease]:
        """Give back many unstarted leases in one statement; returns the leases that were lost."""
        values = {
            self.status: self.ready,
            self.expires_at: None,
            self.attempts: self.attempts - 1,
        }
        return self._write(bind, leases, values, self.ready)

    def _finish(self, status: str, extra: Mapping[Any, Any] | None) -> dict[Any, Any]:
        values: dict[Any, Any] = {self.status: status, self.expires_at: None}
        values.update({column_of(self.table, key, "set"): value for key, value in (extra or {}).items()})
        return values

    def _write(
        self, bind: Engine | Connection, leases: Sequence[Lease], values: Mapping[Any, Any], after: str
    ) -> list[Lease]:
        if not leases:
            return []
        with _transaction(bind) as conn:
            return self.write_on_connection(conn, leases, values, after)

    def write_on_connection(
        self, conn: Connection, leases: Sequence[Lease], values: Mapping[Any, Any], after: str
    ) -> list[Lease]:
        """One guarded UPDATE for all ``leases``; returns the ones whose token no longer holds the row."""
        held = sa.and_(
            sa.tuple_(*self.key_columns, self.token).in_([(*lease.key, lease.token) for lease in leases]),
            self.status == self.running,
        )
        change = sa.update(self.table).where(held).values(dict(values))
        if conn.dialect.update_returning:
            written = {key_of(row, self.key_columns) for row in conn.execute(change.returning(*self.key_columns))}
        else:
            if conn.execute(change).rowcount == len(leases):
                return []
            # No RETURNING: read back, in this transaction, which of the rows now carry the token and the
            # status this write gave them.
            proof = sa.select(*self.key_columns).where(
                sa.tuple_(*self.key_columns, self.token).in_([(*lease.key, lease.token) for lease in leases]),
                self.status == after,
            )
            written = {tuple(row) for row in conn.execute(proof)}
        return [lease for lease in leases if lease.key not in written]

    @staticmethod
    def _raise_lost(lost: list[Lease], action: str) -> None:
        if lost:
            lease = lost[0]
            raise LeaseLost(
                f"cannot {action}: the lease on row {lease.key!r} with token {lease.token} is no longer held "
                "(it expired and was claimed again, or was already finished or released); nothing was "
                "changed. Stop working on this row.",
                leases=tuple(lost),
            )

    # -- asyncio -----------------------------------------------------------------------------------

    async def arenew(self, bind: AsyncEngine | AsyncConnection, lease: Lease, duration: Duration) -> None:
        """renew() for asyncio."""
        self._raise_lost(await self.arenew_many(bind, [lease], duration), "renew")

    async def arenew_many(
        self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease], duration: Duration
    ) -> list[Lease]:
        """renew_many() for asyncio."""
        return await _run_async(bind, self.renew_many, leases, duration)

    async def acomplete(
        self,
        bind: AsyncEngine | AsyncConnection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """complete() for asyncio."""
        self._raise_lost(await self.acomplete_many(bind, [lease], status=status, set=set), "complete")

    async def acomplete_many(
        self,
        bind: AsyncEngine | AsyncConnection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> list[Lease]:
        """complete_many() for asyncio."""
        return await _run_async(bind, lambda conn: self.complete_many(conn, leases, status=status, set=set))

    async def afail(
        self,
        bind: AsyncEngine | AsyncConnection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """fail() for asyncio."""
        self._raise_lost(await self.afail_many(bind, [lease], status=status, set=set), "fail")

    async def afail_many(
        self,
        bind: AsyncEngine | AsyncConnection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> list[Lease]:
        """fail_many() for asyncio."""
        return await _run_async(bind, lambda conn: self.fail_many(conn, leases, status=status, set=set))

    async def arelease(self, bind: AsyncEngine | AsyncConnection, lease: Lease) -> None:
        """release() for asyncio."""
        self._raise_lost(await self.arelease_many(bind, [lease]), "release")

    async def arelease_many(self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease]) -> list[Lease]:
        """release_many() for asyncio."""
        return await _run_async(bind, self.release_many, leases)
