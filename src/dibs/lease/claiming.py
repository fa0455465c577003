"""Taking leases: the claim that leases ready and expired rows, its statements built once, and the leases
made from its rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from dibs._checks import checked_owner
from dibs.claim import Criteria, Ordering, arun_claim, claim_request, ordering, run_claim, whole_number
from dibs.dialects import Backend, ClaimRequest, backend_for
from dibs.dialects.base import inline
from dibs.lease.table import LeasedTable, LeaseFields
from dibs.lease.value import (
    OWNER_PARAMETER,
    SECONDS_PARAMETER,
    Duration,
    Lease,
    _seconds,
    made_lease,
)
from dibs.schema import aware

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from dibs.dialects.base import Then


def _column_ordering_key(table: sa.Table, order: Sequence[sa.ColumnElement[Any]]) -> tuple[Any, ...] | None:
    """A hashable description of an order made only of the table's columns with asc/desc/nulls modifiers,
    or None for anything else (such orders are not cached: two expressions may look alike and differ)."""
    key: list[Any] = []
    for clause in order:
        element: Any = clause
        modifiers = []
        while isinstance(element, sa.UnaryExpression) and element.modifier is not None:
            modifiers.append(element.modifier.__name__)
            element = element.element
        if not isinstance(element, sa.Column) or element.table is not table:
            return None
        key.append((element.name, *modifiers))
    return tuple(key)


def _simple_order(order_by: Ordering) -> tuple[Any, ...] | None:
    """``order_by`` as a hashable key when it is made of column names and Column objects only (a table has
    a bounded number of them), else None. The key holds the Columns themselves (hashed by identity), so
    none of them can be collected and its id given to another while the key is kept."""
    items = (order_by,) if isinstance(order_by, (str, sa.Column)) else order_by
    if not isinstance(items, (tuple, list)) or not all(isinstance(item, (str, sa.Column)) for item in items):
        return None
    return tuple(items)


class Claiming(LeasedTable):
    """Leases.claim and what it builds on; see :class:`~dibs.Leases`."""

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
        """Lease up to ``limit`` ready or expired rows to ``owner`` for ``duration``; each gets a new token.

        Args:
            bind: An Engine, or a Connection with no transaction open (the claim commits on its own).
            owner: Who holds the leases: a worker's name, 1 to 200 characters.
            duration: How long the leases last (a timedelta or seconds), on the database clock.
            where: More criteria the rows must meet, as for :func:`dibs.claim`.
            limit: The most rows to lease.
            order_by: Which rows to lease first, as for :func:`dibs.claim`.
            set: More columns the claim sets, as for :func:`dibs.claim`.
            then: A function ``then(conn, rows)`` run in the claim's transaction.

        Returns:
            One :class:`~dibs.Lease` per claimed row, in ``order_by`` order.

        Raises:
            InTransaction: ``bind`` is a Connection inside a transaction.
            InvalidArgument: A bad owner, duration, limit or column.
        """
        request = self.claim_request(bind, owner, duration, where, limit, order_by, set, then)
        return self._leases(run_claim(bind, request, self.strategy), owner, self._whole_rows)

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
        """:meth:`claim` for asyncio, on an AsyncEngine or an AsyncConnection with no transaction open.

        Args:
            bind: An AsyncEngine, or an AsyncConnection with no transaction open.
            owner: Who holds the leases.
            duration: How long the leases last (a timedelta or seconds).
            where: More criteria the rows must meet.
            limit: The most rows to lease.
            order_by: Which rows to lease first.
            set: More columns the claim sets.
            then: A function ``then(conn, rows)`` run in the claim's transaction.

        Returns:
            One :class:`~dibs.Lease` per claimed row.
        """
        request = self.claim_request(bind, owner, duration, where, limit, order_by, set, then)
        return self._leases(await arun_claim(bind, request, self.strategy), owner, self._whole_rows)

    def eligible(self, backend: Backend) -> sa.ColumnElement[bool]:
        """The criteria of a claimable row: ready, or running with a lease expired on the database clock.

        Args:
            backend: The backend of the database the criteria run on (its clock).

        Returns:
            The criteria, as a SQL expression.
        """
        if not self.reclaim_expired:
            return self.status == inline(self.ready)
        return sa.or_(
            self.status == inline(self.ready),
            sa.and_(self.status == inline(self.running), self.expires_at < backend.now()),
        )

    def claim_request(
        self,
        bind: Any,
        owner: str,
        duration: Duration,
        where: Criteria,
        limit: int,
        order_by: Ordering,
        values: Mapping[Any, Any] | None,
        then: Then | None,
    ) -> ClaimRequest:
        """The claim for one call. Without ``where`` or ``set`` its statements are built once and reused.

        Args:
            bind: The Engine or Connection (sync or async) the claim runs on.
            owner: Who holds the leases.
            duration: How long the leases last.
            where: More criteria the rows must meet.
            limit: The most rows to lease.
            order_by: Which rows to lease first.
            values: More columns the claim sets (the ``set=`` of :meth:`claim`).
            then: A function run in the claim's transaction.

        Returns:
            The request, ready to run.
        """
        checked_owner(owner)
        backend = backend_for(bind.dialect)
        parameters = {OWNER_PARAMETER: owner, SECONDS_PARAMETER: backend.after_value(_seconds(duration))}
        count = whole_number(limit)
        if where is None and not values:
            template = self._claim_template(backend, order_by)
        else:
            template = self._build_claim(backend, order_by, where, values, shape=None)
        return template.for_call(count, parameters, then)

    def _claim_template(self, backend: Backend, order_by: Ordering) -> ClaimRequest:
        # A claim loop passes the same order every call: a column or a name (or several) finds its template
        # without working out the order again. Other orders (expressions, made anew by each call) are not
        # kept by what the caller passed, which would keep every one of them.
        simple = _simple_order(order_by)
        if simple is not None:
            template = self._templates_by_argument.get((backend.name, simple))
            if template is not None:
                return template
        order = ordering(self.table, order_by)
        order_key = _column_ordering_key(self.table, order)
        if order_key is None:
            return self._build_claim(backend, order, None, None, shape=None)
        key = (backend.name, order_key)
        template = self._claim_templates.get(key)
        if template is None:
            template = self._claim_templates[key] = self._build_claim(backend, order, None, None, shape=object())
        if simple is not None:
            self._templates_by_argument[backend.name, simple] = template
        return template

    def _build_claim(
        self,
        backend: Backend,
        order_by: Ordering,
        where: Criteria,
        values: Mapping[Any, Any] | None,
        shape: object | None,
    ) -> ClaimRequest:
        criteria: list[Any] = [self.eligible(backend)]
        if where is not None:
            criteria.extend([where] if isinstance(where, sa.ClauseElement) else list(where))
        changes: dict[Any, Any] = {
            self.status: inline(self.running),
            self.owner: sa.bindparam(OWNER_PARAMETER, type_=self.owner.type),
            self.expires_at: backend.after(SECONDS_PARAMETER),
            self.token: self.token + inline(1),
            self.attempts: self.attempts + inline(1),
        }
        changes.update(values or {})
        request = claim_request(
            self.table, where=criteria, values=changes, limit=1, order_by=order_by, delete=False, then=None
        )
        return dataclasses.replace(request, shape=shape)

    def _leases(self, rows: Iterable[Row[Any]], owner: str, fields: LeaseFields) -> list[Lease]:
        # Fields are read by position. Building leases is a large part of a big claim's Python time: the
        # rows of one claim share their expiry (one statement, one clock), so it is made aware once.
        key_at, token_at, expires_at = fields
        leases = []
        last_seen: Any = None
        last_aware: Any = None
        single = len(key_at) == 1
        (only,) = key_at if single else (0,)
        for row in rows:
            expiry = row[expires_at]
            if expiry is not last_seen:
                last_seen, last_aware = expiry, aware(expiry)
            key = (row[only],) if single else tuple(row[i] for i in key_at)
            leases.append(made_lease(Lease, (key, row[token_at], owner, last_aware, row)))
        return leases
