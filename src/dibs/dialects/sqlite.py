"""SQLite: one writer at a time, taken up front with BEGIN IMMEDIATE.

SQLite serializes writers. A deferred transaction that reads and then writes fails with SQLITE_BUSY
at once when another writer got in between, without waiting on the busy handler; BEGIN IMMEDIATE
takes the write lock first, so the busy timeout applies and nothing can change between the read of
the candidates and their update. pysqlite opens transactions lazily on its own; dibs emits BEGIN
IMMEDIATE itself before the first statement, which pysqlite then leaves alone.

The claim reads the picked keys in claim order, then updates them with RETURNING (SQLite 3.35 and
later) or updates and reads them back (older SQLite), and sorts the rows by the picked order: SQLite
returns RETURNING rows in no promised order and lets RETURNING name only the updated table.

SQLite runs in the application's process, so its clock is the application's clock.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement

from dibs._errors import Busy
from dibs.dialects import driver
from dibs.dialects.backend import BackendDefaults
from dibs.dialects.batch import SelectedValuesInsert
from dibs.dialects.keys import PICKED, fenced_in_list, fenced_in_list_values, in_key_order, key_values, keys_in
from dibs.dialects.ordering import SortKey, in_order, python_order
from dibs.dialects.portable import AppClock
from dibs.dialects.request import ClaimRequest, ClaimStrategy, StatementCache, run_then
from dibs.dialects.turns import TIMEOUT_INFO, take_turns, writer_turn
from dibs.dialects.versions import server_version, warn_fallback

RETURNING_SINCE = (3, 35)
JSON_BUILT_IN = sqlite3.sqlite_version_info >= (3, 38)
BUSY_TIMEOUT_SECONDS = 10.0
_BEGIN_IMMEDIATE = sa.text("BEGIN IMMEDIATE")
_FENCED_TOKENS = "dibs_fenced_tokens"
_BUSY_CODES = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED (primary result codes)


class _Statements(NamedTuple):
    pick: sa.Select[Any]
    change: sa.Update | sa.Delete  # of the picked keys, with RETURNING where the version has it
    read: sa.Select[Any] | None  # of the picked keys, where there is no RETURNING
    #: Where the claim is one statement that picks, changes and returns (None: pick first, then change),
    #: and how its rows are put back in order.
    single: sa.Update | sa.Delete | None = None
    order: tuple[SortKey, ...] = ()


#: Column types whose Python values sort as SQLite sorts what SQLAlchemy stored for them.
_SORTABLE = (sa.Integer, sa.Float, sa.Numeric, sa.DateTime, sa.Date, sa.Boolean)


class SQLiteClaim:
    """BEGIN IMMEDIATE; UPDATE ... WHERE pk IN (SELECT pk ... ORDER BY ... LIMIT n) RETURNING; COMMIT.

    RETURNING gives rows in no promised order, so the rows are sorted afterwards: in Python when the order
    is by columns the claim returns and does not change (their values sort in Python as SQLite sorts
    them), else by reading the picked keys first, in order, and updating those.
    """

    single_statement = False

    def __init__(self, backend: SQLite, *, returning: bool) -> None:
        self.backend = backend
        self.returning = returning
        self.name = "sqlite" if returning else "sqlite-legacy"
        self.statements = StatementCache(self.build)

    def build(self, request: ClaimRequest) -> _Statements:
        keys = request.key_columns
        pick = request.candidates(*keys)
        chosen = json_keys_in(keys) if json_keys(keys) else keys_in(keys)
        if not self.returning:
            change = _change(request, chosen)
            return _Statements(pick, change, sa.select(*request.returned).where(chosen))
        statements = _Statements(pick, _change(request, chosen).returning(*request.returned), None)
        # SQLite sorts NULLs first in ascending order; text in its own BINARY collation, code-point order.
        order = python_order(request, _SORTABLE, text=True, nulls_first_ascending=True)
        if order is None:
            return statements
        picked = (keys[0] if len(keys) == 1 else sa.tuple_(*keys)).in_(
            pick.scalar_subquery() if len(keys) == 1 else pick
        )
        return statements._replace(single=_change(request, picked).returning(*request.returned), order=order)

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        keys = request.key_columns
        statements = self.statements(request)
        reused = request.shape is not None
        with self.backend.transaction(conn):
            parameters = request.execution()
            if statements.single is not None:
                rows = driver.fetch(conn, statements.single, parameters, request.returned, reused=reused)
                return run_then(conn, request, in_order(rows, statements.order))
            picked = [tuple(row) for row in driver.fetch(conn, statements.pick, parameters, keys, reused=reused)]
            if not picked:
                return []
            parameters[PICKED] = json.dumps([key[0] for key in picked]) if json_keys(keys) else key_values(keys, picked)
            if statements.read is None:
                rows = driver.fetch(conn, statements.change, parameters, request.returned, reused=reused)
            elif request.delete:
                rows = list(conn.execute(statements.read, parameters))
                conn.execute(statements.change, parameters)
            else:
                conn.execute(statements.change, parameters)
                rows = list(conn.execute(statements.read, parameters))
            return run_then(conn, request, in_key_order(rows, picked, request.key_positions))


def _change(request: ClaimRequest, chosen: ColumnElement[bool]) -> sa.Update | sa.Delete:
    if request.delete:
        return sa.delete(request.table).where(chosen)
    return sa.update(request.table).where(chosen).values(dict(request.values))


def json_keys(key_columns: Sequence[sa.Column[Any]]) -> bool:
    """Whether lists of these keys go to SQLite as one JSON array (read with json_each) rather than one
    parameter per key: a single plain integer key, which JSON carries exactly and SQLite compares as the
    column stores it, on SQLite 3.38 or later (JSON built in). One parameter keeps the statement text the
    same whatever the batch size, so neither SQLAlchemy nor SQLite prepares it anew. Other keys (text,
    whose NUL bytes JSON would cut; types that convert values on the way in) keep a parameter each."""
    return (
        JSON_BUILT_IN
        and len(key_columns) == 1
        and type(key_columns[0].type) in (sa.Integer, sa.BigInteger, sa.SmallInteger, sa.INTEGER, sa.BIGINT)
    )


def json_keys_in(key_columns: Sequence[sa.Column[Any]]) -> ColumnElement[bool]:
    """``pk IN (SELECT value FROM json_each(:dibs_picked))``."""
    listed = sa.func.json_each(sa.bindparam(PICKED, type_=sa.String)).table_valued("value")
    return key_columns[0].in_(sa.select(listed.c.value))


def _driver_in_transaction(dbapi_connection: Any) -> bool:
    """Whether the sqlite3 connection (possibly behind aiosqlite's adapter) already has a transaction."""
    for candidate in (dbapi_connection, getattr(dbapi_connection, "_connection", None)):
        state = getattr(candidate, "in_transaction", None)
        if isinstance(state, bool):
            return state
    return False


class SQLite(AppClock, BackendDefaults):
    """SQLite 3.35 and later with RETURNING; older versions read the claimed rows back."""

    name = "sqlite"
    atomic_statements = True
    #: One: SQLite takes one writer at a time, so two threads of one worker writing at once (a claim and a
    #: write of finished jobs) would make one wait in SQLite's busy handler, which sleeps a millisecond and
    #: more; in one thread they take turns at once.
    default_worker_connections = 1
    partial_indexes = True
    parameters_limit = 32_766 if sqlite3.sqlite_version_info >= (3, 32) else 999
    #: The values a batch's rows share bound once per statement (see SelectedValuesInsert).
    batch_insert_kind = SelectedValuesInsert
    async_driver: str | None = "aiosqlite"

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        version = server_version(dialect)
        if version and version < RETURNING_SINCE:
            warn_fallback(
                "SQLite", version, "RETURNING", RETURNING_SINCE, "reads claimed rows back in the same transaction"
            )
            return SQLiteClaim(self, returning=False)
        return SQLiteClaim(self, returning=True)

    @contextmanager
    def transaction(self, conn: Connection) -> Iterator[None]:
        # pysqlite and aiosqlite commit a transaction opened by hand. One the driver already opened (Python
        # 3.12's autocommit=False, or an engine that emits its own BEGIN) is deferred; the claim is still
        # correct there because SQLite refuses a write on a stale read snapshot, but it cannot wait on the
        # busy handler.
        with writer_turn(conn), conn.begin():
            if not _driver_in_transaction(conn.connection.dbapi_connection):
                driver.execute(conn, _BEGIN_IMMEDIATE, {})
            yield

    @contextmanager
    def one_statement(self, conn: Connection, *, owned: bool) -> Iterator[None]:
        # A writing statement run outside a transaction takes the write lock at its start, waiting on the
        # busy handler as BEGIN IMMEDIATE does, and commits with it: one call into SQLite instead of three.
        # pysqlite runs it so while its isolation_level is None; SQLAlchemy's transaction then sends nothing.
        dbapi_connection = conn.connection.dbapi_connection
        if (
            not isinstance(dbapi_connection, sqlite3.Connection)  # aiosqlite's adapter, through run_sync
            or dbapi_connection.in_transaction
            or getattr(dbapi_connection, "autocommit", None) is False  # Python 3.12's driver-kept transactions
        ):
            with self.transaction(conn):
                yield
            return
        level = dbapi_connection.isolation_level
        with writer_turn(conn):
            dbapi_connection.isolation_level = None
            try:
                with conn.begin():
                    yield
            finally:
                dbapi_connection.isolation_level = level

    def begin_writing(self, conn: Connection) -> None:
        """``BEGIN IMMEDIATE``, unless the driver already opened the transaction (see transaction)."""
        if not _driver_in_transaction(conn.connection.dbapi_connection):
            driver.execute(conn, _BEGIN_IMMEDIATE, {})

    def writing(self, conn: Connection) -> AbstractContextManager[None]:
        """The write lock taken up front, in turn (see transaction)."""
        return self.transaction(conn)

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        original = exc.orig
        code = getattr(original, "sqlite_errorcode", None)
        busy = ((code & 0xFF) in _BUSY_CODES) if isinstance(code, int) else "locked" in str(original)
        if isinstance(exc, sa.exc.OperationalError) and busy:
            return Busy(
                "SQLite stayed locked by another writer past its busy timeout; nothing was claimed. "
                "Retry, raise the timeout (connect_args={'timeout': seconds}), or move the "
                "workload to PostgreSQL."
            )
        return None

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Wait up to ten seconds for another writer unless the caller set its own ``timeout``."""
        connect_args = {"timeout": BUSY_TIMEOUT_SECONDS, **options.get("connect_args", {})}
        return {**options, "connect_args": connect_args}

    def fenced(self, key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
        """A join with the held tokens, given as one JSON object from each key to its token: a lease write
        becomes ``UPDATE t ... FROM json_each(:tokens) AS held WHERE t.pk = CAST(held.key AS INTEGER) AND
        t.token = held.value``, which reads the JSON once and finds each row by its primary key. One
        parameter keeps the statement the same for every batch size; it took a third of the time of a
        row-value ``IN`` over an array of pairs, and less than a ``VALUES`` list of bound pairs."""
        if not json_keys(key_columns):
            return fenced_in_list(key_columns, token)
        held = sa.func.json_each(sa.bindparam(_FENCED_TOKENS, type_=sa.String)).table_valued("key", "value")
        held = held.alias("dibs_held")
        return sa.and_(key_columns[0] == sa.cast(held.c.key, sa.Integer), token == held.c.value)

    def fenced_values(self, key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        if not json_keys(key_columns):
            return fenced_in_list_values(key_columns, pairs)
        tokens = dict(pairs)
        if len(tokens) != len(pairs):
            # One token per key: tokens only grow, so of two leases on one row only the newer can still hold.
            tokens = {}
            for key, token in pairs:
                if key not in tokens or token > tokens[key]:
                    tokens[key] = token
        return {_FENCED_TOKENS: json.dumps(tokens)}  # integer keys become the object's names

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        # Times are ISO text: compared as Julian days, to the microsecond's order of magnitude.
        return sa.func.julianday(since) <= sa.func.julianday(self.now()) - seconds / 86400.0

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        return sqlite_insert(table).on_conflict_do_nothing(index_elements=[unique], index_where=unique.is_not(None))

    def configure(self, engine: Engine, options: Mapping[str, Any]) -> None:
        """WAL (readers never block the writer), fsync at checkpoints only, and dibs's writers taking turns
        (see dibs.dialects.turns)."""
        turns = take_turns(engine)

        @event.listens_for(engine, "connect")
        def _tune(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
                if turns:  # a writer waits for its turn as long as it would wait on SQLite's lock
                    record.info[TIMEOUT_INFO] = cursor.execute("PRAGMA busy_timeout").fetchone()[0] / 1000
            finally:
                cursor.close()


def private_to_each_connection(url: sa.URL) -> bool:
    """Whether ``url`` names an SQLite database in memory that each connection gets afresh: the tables one
    connection creates are not there for the next."""
    if url.get_backend_name() != "sqlite":
        return False
    database = url.database or ""
    if database in ("", ":memory:"):
        return True
    shared = url.query.get("cache") == "shared" or "cache=shared" in database
    return (url.query.get("mode") == "memory" or "mode=memory" in database) and not shared
