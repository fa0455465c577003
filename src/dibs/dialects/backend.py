"""What every dialect module provides: the :class:`Backend` protocol and the defaults a backend inherits.

A *backend* knows one database family: how to open a claim transaction, what time it is on the
database, which native claim strategy it has for a given server version, how to translate the
driver errors dibs understands, and the capabilities callers would otherwise read from the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement, visitors
from sqlalchemy.sql.elements import BindParameter

from dibs.dialects.batch import PARAMETERS_LIMIT, BatchInsert, ValuesInsert
from dibs.dialects.inserts import Build, Inserted, insert_one_new, insert_rows
from dibs.dialects.keys import fenced_in_list, fenced_in_list_values
from dibs.dialects.values import resolve_times

if TYPE_CHECKING:
    from dibs.dialects.request import ClaimStrategy

#: How a batched guarded UPDATE (a lease write) learns which rows it changed: ``"returning"`` (UPDATE ...
#: RETURNING gives their keys), ``"counting"`` (the driver's row count is exact: when it equals the number of
#: leases, every lease held), ``"locking"`` (neither: the rows are read under lock before the write).
GuardedWrite = Literal["returning", "counting", "locking"]


class Backend(Protocol):
    """What dibs needs to know about one database family."""

    name: str
    #: A single guarded UPDATE may run in autocommit mode, saving the BEGIN and COMMIT round trips.
    atomic_statements: bool
    #: The database connections (one thread each) a worker uses unless told otherwise.
    default_worker_connections: int
    #: CREATE INDEX takes a WHERE clause, so an index can leave out the rows no query looks for.
    partial_indexes: bool
    #: The asyncio driver dibs opens for an engine of this family when it needs an async connection (an
    #: async transactional task's); None where dibs knows none.
    async_driver: str | None

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        """The fastest correct strategy this server supports (warns when it has to fall back)."""
        ...

    def transaction(self, conn: Connection) -> AbstractContextManager[None]:
        """The transaction a multi-statement claim or a transactional job's run takes place in, at READ
        COMMITTED where the database has levels, opened and committed (or rolled back) here."""
        ...

    def begin_writing(self, conn: Connection) -> None:
        """Set the transaction just begun on ``conn`` (an async connection's, through ``run_sync``) up as
        :meth:`transaction` does: take the write lock up front where the database has only one (SQLite), so
        that the transaction waits for it at the start instead of failing at its first write; READ COMMITTED
        where the database has levels."""

    def writing(self, conn: Connection) -> AbstractContextManager[Any]:
        """A transaction of dibs's own that writes (an enqueue, a cancel), opened and committed here."""
        ...

    def one_statement(self, conn: Connection, *, owned: bool) -> AbstractContextManager[None]:
        """Where one statement that is atomic on its own (a guarded lease write) runs, on ``conn`` with no
        transaction open: without BEGIN and COMMIT where :attr:`atomic_statements` allows (one round trip
        instead of three), else in :meth:`transaction`. ``owned``: dibs checked ``conn`` out itself."""
        ...

    def now(self) -> ColumnElement[datetime]:
        """The current time, as the database sees it, as a SQL expression."""
        ...

    def after(self, name: str) -> ColumnElement[datetime]:
        """The current time plus a number of seconds given at execution, as a SQL expression.

        The value of parameter ``name`` comes from :meth:`after_value`.
        """
        ...

    def after_value(self, seconds: float) -> Any:
        """The value of an :meth:`after` parameter for ``seconds`` from now."""
        ...

    def utc_value(self, moment: datetime) -> datetime:
        """An aware datetime as a parameter for this database's DateTime columns: in UTC, without tzinfo
        where the columns hold no time zone."""
        ...

    def guarded_write(self, dialect: Dialect) -> GuardedWrite:
        """How a batched guarded UPDATE learns which rows it changed through this dialect's driver."""
        ...

    def insert_rows(self, conn: Connection, build: Build, rows: Sequence[Mapping[str, Any]]) -> Inserted:
        """Insert ``rows`` on ``conn``, in its transaction, in as few round trips as the driver allows: the
        rows the INSERT returned where the driver returns them, else the id each made (one INSERT each)."""
        ...

    def batch_insert(
        self,
        dialect: Dialect,
        table: sa.Table,
        shared: Mapping[str, ColumnElement[Any]],
        varying: Sequence[str],
        read: Sequence[sa.Column[Any]],
        channel: str | None,
    ) -> BatchInsert | None:
        """An INSERT of many rows that differ only in the ``varying`` columns (the others take the ``shared``
        expressions), giving back their ids in order and the ``read`` columns once per statement; it wakes
        ``channel``'s listeners in the same round trip where the database can and the parameters have a
        ``dibs_payload``. None where the driver cannot return a multi-row INSERT's ids."""
        ...

    def insert_one_new(self, conn: Connection, build: Build, values: Mapping[str, Any]) -> Row[Any] | int | None:
        """Run one INSERT that may leave its row out (see :meth:`insert_new`): the row it returned, or the id
        it made where the driver returns no rows; None when the row was left out."""
        ...

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        """Whether at least ``seconds`` (a SQL expression, per row) have passed since ``since`` on the
        database clock. Raises InvalidArgument where the database has no date arithmetic dibs knows."""
        ...

    def one_of(self, column: sa.Column[Any], name: str) -> ColumnElement[bool]:
        """Whether ``column`` equals one of the values of the list given as parameter ``name`` at execution,
        written so that the planner keeps using an index led by ``column`` for an ORDER BY that starts with
        it, even when the list holds one value."""
        ...

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        """A dibs error for a driver error dibs understands, else None."""
        ...

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options for an engine dibs creates, with this backend's defaults added."""
        ...

    def fenced(self, key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
        """The rows whose (key..., token) is one of the pairs given at execution: the guard of a batched
        lease write. The parameter values come from :meth:`fenced_values`."""
        ...

    def fenced_values(self, key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        """The parameter values of a :meth:`fenced` guard for ``pairs`` of (key..., token)."""
        ...

    def configure(self, engine: Engine, options: Mapping[str, Any]) -> None:
        """Tune an engine dibs creates (never one the caller built) for many concurrent claimers; ``options``
        are the ones its caller gave (before :meth:`engine_options` added this backend's)."""
        ...

    def gather_first_statistics(self, conn: Connection, table: sa.Table) -> bool:
        """Gather the statistics of a table of dibs's that the database has never gathered, once it has grown
        enough for them to change how its statements are planned; True once nothing is left to do (at once
        where a connection does not keep a statement's plan as PostgreSQL does)."""
        ...

    def released(self, conn: Connection) -> None:
        """``conn``, checked out by dibs, goes back to its pool now, its transaction over: a pool that would
        roll it back on return may leave that out (one round trip less per transaction)."""
        ...

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        """An INSERT that leaves out, without an error, each row whose ``unique`` value is already taken
        (``unique`` has a unique index, partial over its non-NULL values where the database allows).

        It never aborts the caller's transaction, so it can run inside one.
        """
        ...

    def make_names_exact(
        self, conn: Connection, table: sa.Table, columns: Sequence[sa.Column[Any]] | None = None
    ) -> None:
        """Bring the :class:`Name` columns of ``table`` (or of ``columns``), made by an earlier dibs, to compare
        byte for byte (nothing where the database's strings always did)."""
        ...

    def keyed_text(self, name: str, key: sa.Column[Any]) -> ColumnElement[str] | None:
        """The text that a JSON object of strings, bound as ``name`` (keys: the ``key`` column's values as
        text), holds for this row, NULL where it holds none; read once per statement, looked up per row.
        None where the database would read the object again for every row (callers then executemany)."""
        ...

    def notify(self, channel: str) -> sa.Executable | None:
        """A statement that wakes the listeners of ``channel`` when its transaction commits (its
        ``dibs_payload`` parameter is the message), or None where the database cannot."""
        ...

    def announcing(self, channel: str) -> ColumnElement[Any] | None:
        """A NULL that, as the value a write sets, wakes the listeners of ``channel`` once (its ``dibs_payload``
        parameter the message) if a row passed the write's conditions, when its transaction commits: a write
        that announces itself, without a statement of its own. (Rarely, a row a concurrent update then takes
        away: a waiter woken for it looks, and waits on.) None where the database cannot."""
        ...

    def listen(self, engine: Engine, channel: str, woken: Callable[[str], None]) -> Listener | None:
        """Start calling ``woken(payload)`` from a thread for every notification on ``channel``; None
        where the database or driver has no notifications (callers then poll)."""
        ...


class Listener(Protocol):
    """A running subscription to database notifications."""

    #: Whether notifications arrive now (False until it listens, and while it reconnects after a drop).
    listening: bool

    def close(self) -> None:
        """Stop listening and release the connection."""
        ...


class BackendDefaults:
    """What a backend does unless it says otherwise: no error translation, no engine tuning, and batched
    lease writes guarded by ``pk IN (...) AND (pk, token) IN (...)``."""

    #: Two: a claim and a write of finished jobs run at once.
    default_worker_connections = 2
    partial_indexes = False
    #: The most parameters one statement may bind.
    parameters_limit = PARAMETERS_LIMIT
    #: How a batch of rows is inserted where the driver returns a multi-row INSERT's ids.
    batch_insert_kind: type[ValuesInsert] = ValuesInsert
    async_driver: str | None = None
    #: The statement that makes the transaction just begun READ COMMITTED, where the database has levels.
    read_committed: str | None = None

    def begin_writing(self, conn: Connection) -> None:
        if self.read_committed is not None:
            conn.exec_driver_sql(self.read_committed)

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        return None

    def utc_value(self, moment: datetime) -> datetime:
        return moment.astimezone(timezone.utc).replace(tzinfo=None)

    def guarded_write(self, dialect: Dialect) -> GuardedWrite:
        if dialect.update_returning:
            return "returning"
        return "counting" if dialect.supports_sane_rowcount else "locking"

    def insert_rows(self, conn: Connection, build: Build, rows: Sequence[Mapping[str, Any]]) -> Inserted:
        return insert_rows(conn, build, rows)

    def insert_one_new(self, conn: Connection, build: Build, values: Mapping[str, Any]) -> Row[Any] | int | None:
        return insert_one_new(conn, build, values)

    def batch_insert(
        self,
        dialect: Dialect,
        table: sa.Table,
        shared: Mapping[str, ColumnElement[Any]],
        varying: Sequence[str],
        read: Sequence[sa.Column[Any]],
        channel: str | None,
    ) -> BatchInsert | None:
        if not dialect.insert_returning:
            return None
        return self.batch_insert_kind(table, shared, varying, read, self.parameters_limit)

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        from dibs._errors import InvalidArgument

        raise InvalidArgument(
            f"intervals that differ per row need date arithmetic dibs knows only on PostgreSQL, MySQL, MariaDB "
            f"and SQLite, not {getattr(self, 'name', 'this database')}; give the interval as a constant"
        )

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def one_of(self, column: sa.Column[Any], name: str) -> ColumnElement[bool]:
        return column.in_(sa.bindparam(name, expanding=True))

    def configure(self, engine: Engine, options: Mapping[str, Any]) -> None:
        return None

    def released(self, conn: Connection) -> None:
        return None

    def gather_first_statistics(self, conn: Connection, table: sa.Table) -> bool:
        return True

    def writing(self, conn: Connection) -> AbstractContextManager[Any]:
        return conn.begin()

    def one_statement(self, conn: Connection, *, owned: bool) -> AbstractContextManager[None]:
        return cast("Backend", self).transaction(conn)

    def fenced(self, key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
        return fenced_in_list(key_columns, token)

    def fenced_values(self, key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        return fenced_in_list_values(key_columns, pairs)

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        # No conflict clause this backend is known to have: a plain INSERT, whose duplicate-key error the
        # caller handles (outside a transaction of its own, where that error is harmless).
        return sa.insert(table)

    def make_names_exact(
        self, conn: Connection, table: sa.Table, columns: Sequence[sa.Column[Any]] | None = None
    ) -> None:
        return None

    def keyed_text(self, name: str, key: sa.Column[Any]) -> ColumnElement[str] | None:
        return None

    def notify(self, channel: str) -> sa.Executable | None:
        return None

    def announcing(self, channel: str) -> ColumnElement[Any] | None:
        return None

    def listen(self, engine: Engine, channel: str, woken: Callable[[str], None]) -> Listener | None:
        return None


def from_now(backend: Backend, seconds: float, name: str = "dibs_from_now") -> ColumnElement[datetime]:
    """The database clock ``seconds`` from now (negative: ago) as a SQL expression, its value bound."""
    value = resolve_times({name: backend.after_value(seconds)})[name]

    # What ClauseElement.params() did; SQLAlchemy 2.1 deprecates it on non-statement elements.
    def bind(parameter: BindParameter[Any]) -> None:
        if parameter.key == name:
            parameter.value, parameter.required = value, False

    return visitors.cloned_traverse(backend.after(name), {"maintain_key": True}, {"bindparam": bind})
