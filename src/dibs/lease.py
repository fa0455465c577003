"""Fenced leases: a claim that later writes must prove they still hold.

A leased row carries a status, an owner, an expiry on the database clock, a token that goes up by one
at every claim, and an attempt count. Claiming takes ready rows and rows whose lease has expired.
Every later write (renew, complete, fail, release) is guarded by ``pk = :pk AND token = :token AND
status = 'running'``, so a worker whose lease was taken over changes nothing, is told so by
:class:`~dibs.LeaseLost` (or in the list a batched write returns), and stops.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from dibs._checks import checked_seconds, checked_text
from dibs._errors import InvalidArgument, LeaseLost
from dibs.claim import (
    Criteria,
    Ordering,
    arun_claim,
    claim_request,
    column_of,
    ordering,
    resolve_table,
    run_claim,
    whole_number,
)
from dibs.dialects import Backend, ClaimRequest, backend_for, driver
from dibs.dialects.base import constant, resolve_times
from dibs.schema import Timestamp, aware

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from dibs.dialects.base import Then

T = TypeVar("T")
Duration = timedelta | float | int
#: The longest lease owner: the size of the owner column lease_columns() makes.
OWNER_LIMIT = 200


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
        sa.Column(owner, sa.String(OWNER_LIMIT), nullable=True),
        sa.Column(expires_at, Timestamp, nullable=True),
        sa.Column(token, sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(attempts, sa.Integer, nullable=False, server_default="0"),
    ]


class Lease(NamedTuple):
    """One claimed row and the proof of holding it: its key and the token the claim gave it.

    Immutable. A named tuple because a claim makes one per row: one is made in a third of the time of
    a frozen dataclass, and that was the largest part of a big claim's Python time.
    """

    key: tuple[Any, ...]
    token: int
    owner: str
    expires_at: datetime
    row: Row[Any]


#: ``Lease(key, token, owner, expires_at, row)`` from one tuple of the five, without the keyword handling.
_made_lease: Callable[[Any, tuple[Any, ...]], Lease] = tuple.__new__


def _seconds(duration: Duration, name: str = "duration") -> float:
    return checked_seconds(duration, name)


def _owner(owner: object) -> str:
    return checked_text(owner, "owner (the name of the worker)", OWNER_LIMIT)


#: Lease writes go in chunks of at most this many leases, which bounds both the statement's parameters
#: and PostgreSQL's per-row scan of the token array.
WRITE_CHUNK = 1000


@contextmanager
def _transaction(bind: Engine | Connection, backend: Backend, *, one_statement: bool = False) -> Iterator[Connection]:
    """The caller's open transaction if it has one (the write joins it), else one the backend opens and commits.

    ``one_statement``: the work is one statement the database runs atomically on its own, which the backend
    may run without BEGIN and COMMIT (see Backend.one_statement).
    """
    if isinstance(bind, Engine):
        with bind.connect() as conn, _opened(backend, conn, one_statement, owned=True):
            yield conn
    elif bind.in_transaction():
        yield bind
    else:
        with _opened(backend, bind, one_statement, owned=False):
            yield bind


def _opened(backend: Backend, conn: Connection, one_statement: bool, *, owned: bool) -> AbstractContextManager[Any]:
    return backend.one_statement(conn, owned=owned) if one_statement else backend.transaction(conn)


async def _run_async(bind: AsyncEngine | AsyncConnection, work: Callable[..., T], *args: Any) -> T:
    from sqlalchemy.ext.asyncio import AsyncEngine

    if isinstance(bind, AsyncEngine):
        async with bind.connect() as conn:
            return await conn.run_sync(work, *args)
    return await bind.run_sync(work, *args)


_OWNER = "dibs_lease_owner"
_LEASE_SECONDS = "dibs_lease_seconds"


class _SomeLost(Exception):
    """A lease write without RETURNING changed fewer rows than it had leases: some were lost."""


class _LeaseFields(NamedTuple):
    """Where a claimed row holds the key's columns, the token and the expiry."""

    key: tuple[int, ...]
    token: int
    expires_at: int

    @classmethod
    def of(cls, columns: tuple[sa.Column[Any], ...], leases: Leases) -> _LeaseFields:
        names = [column.name for column in columns]
        return cls(
            tuple(names.index(column.name) for column in leases.key_columns),
            names.index(leases.token.name),
            names.index(leases.expires_at.name),
        )


class _WriteStatements(NamedTuple):
    write: sa.Update  # the guarded UPDATE
    returning: sa.Update  # the same, returning the (key..., token) of each row it changed
    held: sa.Select[Any]  # where there is no RETURNING: lock and read the (key..., token) it will change


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
        reclaim_expired: bool = True,
        finished_at: str | None = None,
    ) -> None:
        self.table = resolve_table(table)
        self.strategy = strategy
        #: Whether a claim also takes running rows whose lease expired. Without it the claim reads only
        #: ready rows (an index on them stays small) and :meth:`recover` puts expired rows back.
        self.reclaim_expired = reclaim_expired
        #: A column every finishing write (complete, fail) sets to the database clock, if given.
        self.finished_at = None if finished_at is None else column_of(self.table, finished_at, "Leases(finished_at=)")
        self.status = column_of(self.table, status, "Leases(status=)")
        self.owner = column_of(self.table, owner, "Leases(owner=)")
        self.expires_at = column_of(self.table, expires_at, "Leases(expires_at=)")
        self.token = column_of(self.table, token, "Leases(token=)")
        self.attempts = column_of(self.table, attempts, "Leases(attempts=)")
        self.ready, self.running, self.done, self.failed = ready, running, done, failed
        self.key_columns = tuple(self.table.primary_key.columns)
        self._whole_rows = _LeaseFields.of(tuple(self.table.columns), self)
        self._claim_templates: dict[tuple[Any, ...], ClaimRequest] = {}
        #: The same templates by the order_by a caller passed, where that is column names and Columns.
        self._templates_by_argument: dict[tuple[Any, ...], ClaimRequest] = {}
        self._write_templates: OrderedDict[tuple[Any, ...], _WriteStatements] = OrderedDict()

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
        """claim() for asyncio."""
        request = self.claim_request(bind, owner, duration, where, limit, order_by, set, then)
        return self._leases(await arun_claim(bind, request, self.strategy), owner, self._whole_rows)

    def eligible(self, backend: Backend) -> sa.ColumnElement[bool]:
        """Ready rows, and running rows whose lease has expired on the database clock."""
        if not self.reclaim_expired:
            return self.status == constant(self.ready)
        return sa.or_(
            self.status == constant(self.ready),
            sa.and_(self.status == constant(self.running), self.expires_at < backend.now()),
        )

    def claim_request(
        self,
        bind: Any,
        owner: str,
        duration: Duration,
        where: Criteria,
        limit: int,
        order_by: Ordering,
        extra: Mapping[Any, Any] | None,
        then: Then | None,
    ) -> ClaimRequest:
        """The claim for one call. Without ``where`` or ``set`` its statements are built once and reused."""
        _owner(owner)
        backend = backend_for(bind.dialect)
        parameters = {_OWNER: owner, _LEASE_SECONDS: backend.after_value(_seconds(duration))}
        count = whole_number(limit)
        if where is None and not extra:
            template = self._claim_template(backend, order_by)
        else:
            template = self._build_claim(backend, order_by, where, extra, shape=None)
        return template.for_call(count, parameters, then)

    def claimer(
        self,
        *,
        where: Criteria = None,
        order_by: Ordering = (),
        set: Mapping[Any, Any] | None = None,
        columns: Sequence[Any] | None = None,
    ) -> Claimer:
        r"""A claim whose criteria, order and values are fixed, built once per database and reused.

        Values that change from call to call go in ``where`` and ``set`` as named ``sa.bindparam``\ s and
        are given to :meth:`Claimer.claim` as ``parameters``. ``columns`` limits what each lease's row holds
        (the key, token and expiry are always among them): fewer columns, less to decode.
        """
        return Claimer(self, where, order_by, set, columns)

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
        extra: Mapping[Any, Any] | None,
        shape: object | None,
    ) -> ClaimRequest:
        criteria: list[Any] = [self.eligible(backend)]
        if where is not None:
            criteria.extend([where] if isinstance(where, sa.ClauseElement) else list(where))
        values: dict[Any, Any] = {
            self.status: constant(self.running),
            self.owner: sa.bindparam(_OWNER, type_=self.owner.type),
            self.expires_at: backend.after(_LEASE_SECONDS),
            self.token: self.token + constant(1),
            self.attempts: self.attempts + constant(1),
        }
        values.update(extra or {})
        request = claim_request(
            self.table, where=criteria, values=values, limit=1, order_by=order_by, delete=False, then=None
        )
        return dataclasses.replace(request, shape=shape)

    def _leases(self, rows: Iterable[Row[Any]], owner: str, fields: _LeaseFields) -> list[Lease]:
        # Fields are read by position. Building leases is a large part of a big claim's Python time: the
        # rows of one claim share their expiry (one statement, one clock), so it is made aware once.
        key_at, token_at, expires_at = fields
        leases = []
        last_seen: Any = None
        last_aware: Any = None
        single = len(key_at) == 1
        (only,) = key_at if single else (0,)
        for row in rows:
            moment = row[expires_at]
            if moment is not last_seen:
                last_seen, last_aware = moment, aware(moment)
            key = (row[only],) if single else tuple(row[i] for i in key_at)
            leases.append(_made_lease(Lease, (key, row[token_at], owner, last_aware, row)))
        return leases

    # -- expired leases ----------------------------------------------------------------------------

    def recover(
        self,
        bind: Engine | Connection,
        *,
        where: Criteria = None,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        batch: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """Put running rows whose lease expired back to ``status`` (ready unless given); returns their keys.

        A later write by the lost holder finds the row no longer running and changes nothing.

        ``batch``: recover in statements of at most that many rows, longest expired first, until one finds
        fewer. Given an index on the lease's expiry, each then reads it in order, even where the
        database's statistics (taken while most rows were running) would plan the unordered read as a
        scan of the whole table. Outside a transaction of the caller's each statement commits on its own:
        if one fails, the rows of those before it stay recovered.
        """
        size = None if batch is None else whole_number(batch, "batch")
        if size is not None and size <= 0:
            raise InvalidArgument(f"batch must be a positive whole number of rows, got {batch!r}")
        backend = backend_for(bind.dialect)
        criteria: list[Any] = [self.status == constant(self.running), self.expires_at < backend.now()]
        if where is not None:
            criteria.extend([where] if isinstance(where, sa.ClauseElement) else list(where))
        values: dict[Any, Any] = {self.status: status or self.ready, self.expires_at: None, self.owner: None}
        if self.finished_at is not None and (status or self.ready) != self.ready:
            values[self.finished_at] = backend.now()
        extra = {column_of(self.table, key, "set"): value for key, value in (set or {}).items()}
        for column in extra:
            if column is self.status or column is self.expires_at:
                raise InvalidArgument(
                    f"set must not name {column.name}: recover sets the status (pass status=) and clears the "
                    "lease's expiry itself"
                )
        values.update(extra)
        found = sa.select(*self.key_columns).where(*criteria).with_for_update(skip_locked=True)
        if size is not None:
            found = found.order_by(self.expires_at).limit(size)
        recovered: list[tuple[Any, ...]] = []
        while True:
            with _transaction(bind, backend) as conn:
                keys = list(map(tuple, conn.execute(found)))
                if keys:
                    held = (
                        sa.tuple_(*self.key_columns).in_(keys)
                        if len(self.key_columns) > 1
                        else self.key_columns[0].in_([key[0] for key in keys])
                    )
                    # The criteria again: a row renewed between the read and the write is left alone.
                    conn.execute(sa.update(self.table).where(held, *criteria).values(values))
            recovered.extend(keys)
            if size is None or len(keys) < size:
                return recovered

    # -- guarded writes ----------------------------------------------------------------------------

    def renew(self, bind: Engine | Connection, lease: Lease, duration: Duration) -> None:
        """Extend a held lease to ``duration`` from now; raises LeaseLost if it is no longer held."""
        self._raise_lost(self.renew_many(bind, [lease], duration), "renew")

    def renew_many(self, bind: Engine | Connection, leases: Sequence[Lease], duration: Duration) -> list[Lease]:
        """Extend many leases in one statement; returns the leases that were lost (and not renewed)."""
        backend = backend_for(bind.dialect)
        return self._write(
            bind, leases, "renew", self.running, {_LEASE_SECONDS: backend.after_value(_seconds(duration))}
        )

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
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        r"""Finish many leases in one statement; returns the leases that were lost (and left unchanged).

        ``parameters`` gives values to named ``sa.bindparam``\ s inside SQL expressions in ``set``.
        """
        return self._write(bind, leases, "finish", status or self.done, dict(parameters or {}), set)

    def fail(
        self,
        bind: Engine | Connection,
        lease: Lease,
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
    ) -> None:
        """Mark a held lease failed (status ``failed`` unless given); raises LeaseLost if no longer held."""
        self._raise_lost(self.fail_many(bind, [lease], status=status, set=set), "fail")

    def fail_many(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        *,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """Mark many leases failed in one statement; returns the leases that were lost."""
        return self._write(bind, leases, "finish", status or self.failed, dict(parameters or {}), set)

    def release(self, bind: Engine | Connection, lease: Lease) -> None:
        """Give back a lease whose work never started: ready again at once, and the attempt not counted."""
        self._raise_lost(self.release_many(bind, [lease]), "release")

    def release_many(self, bind: Engine | Connection, leases: Sequence[Lease]) -> list[Lease]:
        """Give back many unstarted leases in one statement; returns the leases that were lost."""
        return self._write(bind, leases, "release", self.ready, {})

    def _write(
        self,
        bind: Engine | Connection,
        leases: Sequence[Lease],
        action: str,
        status: str,
        parameters: dict[str, Any],
        extra: Mapping[Any, Any] | None = None,
    ) -> list[Lease]:
        if isinstance(leases, Lease):  # a lease is a tuple: iterating it would give its fields
            raise InvalidArgument(
                "the *_many() lease methods take a list of leases, got one Lease; pass [lease], or call the "
                "method for one lease (complete, fail, release, renew)"
            )
        if not leases:
            return []
        backend = backend_for(bind.dialect)
        extra_values = {column_of(self.table, key, "set"): value for key, value in (extra or {}).items()}
        statements = self._write_statements(backend, action, status, extra_values)
        parameters = {
            **parameters,
            **{
                f"dibs_set_{column.name}": value
                for column, value in extra_values.items()
                if not isinstance(value, sa.ClauseElement)
            },
        }
        resolve_times(parameters)
        way = backend.guarded_write(bind.dialect)
        if way == "returning":
            return self._write_returning(bind, backend, statements.returning, leases, parameters)
        # Counting needs a transaction of its own, which it rolls back when a lease was lost.
        if way == "counting" and (isinstance(bind, Engine) or not bind.in_transaction()):
            try:
                return self._write_counting(bind, backend, statements.write, leases, parameters)
            except _SomeLost:
                pass  # rolled back: the locking read below finds out which
        return self._write_locking(bind, backend, statements, leases, parameters)

    def _chunks(
        self, backend: Backend, leases: Sequence[Lease], parameters: dict[str, Any]
    ) -> Iterator[tuple[Sequence[Lease], dict[str, Any]]]:
        """The leases in chunks of at most WRITE_CHUNK, each with its statement's parameters."""
        for start in range(0, len(leases), WRITE_CHUNK):
            chunk = leases[start : start + WRITE_CHUNK]
            pairs = [(*lease.key, lease.token) for lease in chunk]
            yield chunk, {**parameters, **backend.fenced_values(self.key_columns, pairs)}

    def _write_returning(
        self,
        bind: Engine | Connection,
        backend: Backend,
        statement: sa.Update,
        leases: Sequence[Lease],
        parameters: dict[str, Any],
    ) -> list[Lease]:
        """One statement per chunk, returning the (key..., token) of the rows it changed."""
        fenced_columns = (*self.key_columns, self.token)
        lost: list[Lease] = []
        # One statement: atomic on its own, so it may run in autocommit where the backend allows; elsewhere in
        # the backend's transaction (on SQLite one that takes the write lock, in turn, before the statement).
        with _transaction(bind, backend, one_statement=True) as conn:
            for chunk, chunk_parameters in self._chunks(backend, leases, parameters):
                changed = driver.fetch_values(conn, statement, chunk_parameters, fenced_columns)
                # A row changes once however often its lease is listed: as many rows as leases means every
                # lease was held (the common case, told without matching them up).
                if len(changed) != len(chunk):
                    done = set(map(tuple, changed))
                    lost.extend(lease for lease in chunk if (*lease.key, lease.token) not in done)
        return lost

    def _write_counting(
        self,
        bind: Engine | Connection,
        backend: Backend,
        statement: sa.Update,
        leases: Sequence[Lease],
        parameters: dict[str, Any],
    ) -> list[Lease]:
        """Where there is no RETURNING and the write is a transaction of its own: the UPDATE alone, which
        changed as many rows as there are distinct leases exactly when every lease was held (the common
        case, in one round trip instead of a locking read and the write). Otherwise it is rolled back and
        _SomeLost raised."""
        with _transaction(bind, backend) as conn:
            for chunk, chunk_parameters in self._chunks(backend, leases, parameters):
                distinct = len({(*lease.key, lease.token) for lease in chunk})
                if conn.execute(statement, chunk_parameters).rowcount != distinct:
                    raise _SomeLost
        return []

    def _write_locking(
        self,
        bind: Engine | Connection,
        backend: Backend,
        statements: _WriteStatements,
        leases: Sequence[Lease],
        parameters: dict[str, Any],
    ) -> list[Lease]:
        """Where there is no RETURNING: lock and read the (key..., token) of the rows still held, then write
        exactly those. A locking read sees the latest committed rows whatever the caller's snapshot, and the
        backend's own transaction, real even in autocommit mode, keeps its locks until the write."""
        written: set[tuple[Any, ...]] = set()
        with _transaction(bind, backend) as conn:
            for _, chunk_parameters in self._chunks(backend, leases, parameters):
                held = set(map(tuple, conn.execute(statements.held, chunk_parameters)))
                if held:
                    conn.execute(statements.write, chunk_parameters)
                written |= held
        return [lease for lease in leases if (*lease.key, lease.token) not in written]

    def _write_statements(
        self, backend: Backend, action: str, status: str, extra: Mapping[sa.Column[Any], Any]
    ) -> _WriteStatements:
        """The guarded UPDATE for one kind of write, built once. Extra plain values are bound; extra SQL
        expressions are part of the statement, which is kept for as long as the caller keeps passing the
        same expression object (the stores build theirs once)."""
        shape = tuple(
            sorted(
                (column.name, id(value) if isinstance(value, sa.ClauseElement) else None)
                for column, value in extra.items()
            )
        )
        key = (backend.name, action, status, shape)
        found = self._write_templates.get(key)
        if found is not None:
            self._write_templates.move_to_end(key)
            return found
        values: dict[Any, Any] = {self.status: constant(status)}
        if action == "renew":
            values = {self.expires_at: backend.after(_LEASE_SECONDS)}
        elif action == "release":
            # Ready again and nobody's, as recover() leaves an expired row.
            values.update({self.expires_at: None, self.owner: None, self.attempts: self.attempts - constant(1)})
        else:
            values[self.expires_at] = None
            if self.finished_at is not None:
                values[self.finished_at] = backend.now()
        for column, value in extra.items():
            bound = not isinstance(value, sa.ClauseElement)
            values[column] = sa.bindparam(f"dibs_set_{column.name}", type_=column.type) if bound else value
        held = sa.and_(backend.fenced(self.key_columns, self.token), self.status == constant(self.running))
        change = sa.update(self.table).where(held).values(values)
        statements = _WriteStatements(
            write=change,
            returning=change.returning(*self.key_columns, self.token),
            held=sa.select(*self.key_columns, self.token).where(held).with_for_update(),
        )
        self._write_templates[key] = statements
        if len(self._write_templates) > 256:  # expressions made anew for every call: keep the recent ones
            self._write_templates.popitem(last=False)
        return statements

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
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """complete_many() for asyncio."""
        return await _run_async(
            bind, lambda conn: self.complete_many(conn, leases, status=status, set=set, parameters=parameters)
        )

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
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """fail_many() for asyncio."""
        return await _run_async(
            bind, lambda conn: self.fail_many(conn, leases, status=status, set=set, parameters=parameters)
        )

    async def arecover(
        self,
        bind: AsyncEngine | AsyncConnection,
        *,
        where: Criteria = None,
        status: str | None = None,
        set: Mapping[Any, Any] | None = None,
        batch: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """recover() for asyncio."""
        return await _run_async(bind, lambda conn: self.recover(conn, where=where, status=status, set=set, batch=batch))

    async def arelease(self, bind: AsyncEngine | AsyncConnection, lease: Lease) -> None:
        """release() for asyncio."""
        self._raise_lost(await self.arelease_many(bind, [lease]), "release")

    async def arelease_many(self, bind: AsyncEngine | AsyncConnection, leases: Sequence[Lease]) -> list[Lease]:
        """release_many() for asyncio."""
        return await _run_async(bind, self.release_many, leases)


class Claimer:
    """A lease claim with fixed criteria, order and values (see :meth:`Leases.claimer`)."""

    def __init__(
        self,
        leases: Leases,
        where: Criteria,
        order_by: Ordering,
        values: Mapping[Any, Any] | None,
        columns: Sequence[Any] | None,
    ) -> None:
        self.leases = leases
        self._where = where
        self._order = ordering(leases.table, order_by)
        self._values = dict(values or {})
        self._templates: dict[str, ClaimRequest] = {}
        self._columns: tuple[sa.Column[Any], ...] = ()
        if columns is not None:
            # The key, token and expiry come back whatever else is asked for: a lease needs them.
            needed = [*leases.key_columns, leases.token, leases.expires_at]
            asked = [column_of(leases.table, column, "Leases.claimer(columns=)") for column in columns]
            self._columns = tuple(dict.fromkeys([*needed, *asked]))
        self._fields = _LeaseFields.of(self._columns or tuple(leases.table.columns), leases)

    def claim(
        self,
        bind: Engine | Connection,
        *,
        owner: str,
        duration: Duration,
        limit: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """Lease up to ``limit`` rows to ``owner`` for ``duration``."""
        request = self._request(bind, owner, duration, limit, parameters)
        return self.leases._leases(run_claim(bind, request, self.leases.strategy), owner, self._fields)

    async def aclaim(
        self,
        bind: AsyncEngine | AsyncConnection,
        *,
        owner: str,
        duration: Duration,
        limit: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Lease]:
        """claim() for asyncio."""
        request = self._request(bind, owner, duration, limit, parameters)
        return self.leases._leases(await arun_claim(bind, request, self.leases.strategy), owner, self._fields)

    def _request(
        self, bind: Any, owner: str, duration: Duration, limit: int, parameters: Mapping[str, Any] | None
    ) -> ClaimRequest:
        _owner(owner)
        backend = backend_for(bind.dialect)
        template = self._templates.get(backend.name)
        if template is None:
            template = self._templates[backend.name] = dataclasses.replace(
                self.leases._build_claim(backend, self._order, self._where, self._values, shape=object()),
                columns=self._columns,
            )
        values = {_OWNER: owner, _LEASE_SECONDS: backend.after_value(_seconds(duration)), **(parameters or {})}
        return template.for_call(whole_number(limit), values)
