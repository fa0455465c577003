"""The hot statements of claims and lease writes, run on the driver's cursor.

A worker claims and completes in a loop, and for small batches SQLAlchemy's work around each statement
(an execution context, parameters processed by name, a cursor result, Row objects built through result
metadata) costs as much as the database's own work. So each statement dibs runs in a loop is compiled
once per dialect and then run on the DBAPI cursor of the SQLAlchemy connection it was given:

* the connection, its pool, its transaction and its isolation level stay SQLAlchemy's: dibs only runs
  a statement on a connection SQLAlchemy opened and will commit;
* the types' conversions stay SQLAlchemy's too: every parameter goes through its type's bind processor
  and every returned value through its type's result processor, exactly as ``Connection.execute`` would;
* a driver error is raised as SQLAlchemy raises it (a :class:`sqlalchemy.exc.DBAPIError` around the
  driver's), and a dropped connection is invalidated, so the pool never hands it out again;
* on psycopg a small statement's cursor is kept for the connection's next one on the same thread: psycopg
  copies a connection's adapters into each cursor it makes, so adapters belong in a ``connect`` event, set
  before dibs first uses the connection.

A statement is run the ordinary way instead when someone watches the engine (``echo``, a logger of
``sqlalchemy.engine`` at INFO, ``before_cursor_execute``/``after_cursor_execute`` listeners for tracing),
when its parameters are only known at execution (expanding ``IN`` lists), or when the dialect binds
types through ``setinputsizes``.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext, suppress
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Row
from sqlalchemy.engine.interfaces import BindTyping
from sqlalchemy.engine.result import IteratorResult, SimpleResultMetaData

from dibs.dialects.psycopg_connection import (
    forget_kept_cursor,
    is_psycopg,
    kept_cursor,
    pipelines,
    sent_whole,
    small_statement,
)

_NOTHING = object()
#: Converted values that may be shared between rows: no caller can change them in place.
_IMMUTABLE = (str, bytes, int, float, bool, Decimal, datetime, date, time, timedelta, uuid.UUID, type(None))


class DriverStatement:
    """One statement compiled for one dialect, ready to run on a DBAPI cursor.

    ``columns`` are the columns of the rows it returns, in order (none for a statement without rows).
    """

    def __init__(self, statement: sa.Executable, dialect: Dialect, columns: Sequence[sa.ColumnElement[Any]]) -> None:
        self.statement = statement
        compiled: Any = cast(Any, statement).compile(dialect=dialect)
        self.usable = (
            not compiled.post_compile_params
            and not compiled.literal_execute_params
            and not compiled.escaped_bind_names
            and dialect.bind_typing is not BindTyping.SETINPUTSIZES
        )
        self.sql: str = compiled.string
        self.positions: tuple[str, ...] | None = tuple(compiled.positiontup) if compiled.positional else None
        #: The values bound when the statement was built (constants such as a status), by name.
        self.defaults: dict[str, Any] = {}
        #: Values computed at each execution (the application's clock where it stands for the database's).
        self.computed: list[tuple[str, Callable[[], Any]]] = []
        self.processors: list[tuple[str, Callable[[Any], Any]]] = []
        for name in sorted(set(compiled.bind_names.values())):
            bind = compiled.binds[name]
            if bind.callable is not None:
                self.computed.append((name, bind.callable))
            elif not bind.required:
                self.defaults[name] = bind.value
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self.processors.append((name, processor))
        self.returns_rows = bool(columns)
        self._columns = list(columns)
        self._dialect = dialect
        self._metadata = SimpleResultMetaData([str(column.key) for column in columns]) if columns else None
        self._results: list[tuple[int, Callable[[Any], Any]]] | None = None

    def parameters(self, values: Mapping[str, Any]) -> Any:
        """The driver's parameters for these values (the rest from the statement), converted by type."""
        merged = {**self.defaults, **values}
        for name, compute in self.computed:
            if name not in values:
                merged[name] = compute()
        for name, processor in self.processors:
            merged[name] = processor(merged[name])
        if self.positions is None:
            return merged
        return tuple(merged[name] for name in self.positions)

    @property
    def describe(self) -> bool:
        """Whether :meth:`rows` needs the cursor's description (it does once, to choose its processors)."""
        return self.returns_rows and self._results is None

    def values(
        self, fetched: Sequence[Sequence[Any]], description: Sequence[Sequence[Any]] | None
    ) -> list[Sequence[Any]]:
        """What the cursor returned, each value through its type's result processor (no Row objects)."""
        results = self._results
        if results is None:
            assert description is not None
            # Some processors depend on the driver's type code for the column, known from the first result.
            # The list is complete before it is shared: other threads run the same statement.
            results = []
            for position, (column, described) in enumerate(zip(self._columns, description, strict=True)):
                processor = column.type.dialect_impl(self._dialect).result_processor(self._dialect, described[1])
                if processor is not None:
                    results.append((position, processor))
            self._results = results
        if len(results) == 1:
            return _converted_column(fetched, *results[0])
        if results:
            return _converted(fetched, results)
        return list(fetched)

    def rows(self, fetched: Sequence[Sequence[Any]], description: Sequence[Sequence[Any]] | None) -> list[Row[Any]]:
        """SQLAlchemy rows of what the cursor returned, each value through its type's result processor."""
        assert self._metadata is not None
        result: IteratorResult[Any] = IteratorResult(self._metadata, iter(self.values(fetched, description)))
        rows: list[Row[Any]] = list(result.all())
        return rows


# Claimed rows often share a value (the lease's expiry, its owner): each column remembers its last
# conversion, reused for the next row's raw value if it is equal and of the same type (1 == True), when
# the result cannot be changed in place. Only raw values whose equality means sameness are remembered:
# 0.0 == -0.0, Decimal("1.0") == Decimal("1.00") and one instant in two time zones are equal, yet may
# convert differently.
_EXACT_RAW = frozenset({str, bytes, int, bool, type(None)})


def _remembered(value: Any, done: Any) -> Any:
    """``value`` if its conversion ``done`` may be reused for an equal raw value, else a marker no value is."""
    return value if type(value) in _EXACT_RAW and isinstance(done, _IMMUTABLE) else _NOTHING


def _converted(fetched: Sequence[Sequence[Any]], results: list[tuple[int, Callable[[Any], Any]]]) -> list[Any]:
    """The rows with the values at the results' positions converted."""
    converted = []
    last: list[tuple[Any, Any]] = [(_NOTHING, None)] * len(results)
    for raw in fetched:
        row = list(raw)
        for index, (position, convert) in enumerate(results):
            value = row[position]
            seen, done = last[index]
            if value is seen or (type(value) is type(seen) and value == seen):
                row[position] = done
                continue
            row[position] = done = convert(value)
            last[index] = (_remembered(value, done), done)
        converted.append(row)
    return converted


def _converted_column(fetched: Sequence[Sequence[Any]], position: int, convert: Callable[[Any], Any]) -> list[Any]:
    """_converted for a single column to convert (as a claim's expiry often is), in half the time."""
    converted = []
    seen: Any = _NOTHING
    done: Any = None
    for raw in fetched:
        row = list(raw)
        value = row[position]
        if value is not seen and not (type(value) is type(seen) and value == seen):
            done = convert(value)
            seen = _remembered(value, done)
        row[position] = done
        converted.append(row)
    return converted


class DriverStatements:
    """Statements compiled once per dialect (kept while the dialect's engine lives)."""

    def __init__(self) -> None:
        self._compiled: weakref.WeakKeyDictionary[Dialect, dict[int, DriverStatement]] = weakref.WeakKeyDictionary()

    def get(
        self, statement: sa.Executable, dialect: Dialect, columns: Sequence[sa.ColumnElement[Any]]
    ) -> DriverStatement:
        per_dialect = self._compiled.get(dialect)
        if per_dialect is None:
            per_dialect = self._compiled[dialect] = {}
        found = per_dialect.get(id(statement))
        # The statement itself is kept with its compiled form, so its id cannot be reused by another.
        if found is None or found.statement is not statement:
            found = per_dialect[id(statement)] = DriverStatement(statement, dialect, columns)
        return found


_STATEMENTS = DriverStatements()


def watched(conn: Connection) -> bool:
    """Whether someone sees the statements run on this connection: SQLAlchemy's own tests before it runs a
    statement (statement logging, taken when the connection was made; cursor event listeners)."""
    engine: Any = conn.engine
    return bool(getattr(conn, "_echo", True) or getattr(conn, "_has_events", True) or engine._has_events)


def fetch(
    conn: Connection,
    statement: sa.Executable,
    values: Mapping[str, Any],
    columns: Sequence[sa.ColumnElement[Any]],
    *,
    reused: bool = True,
) -> list[Row[Any]]:
    """The rows ``statement`` returns (its columns given), run in the transaction ``conn`` has open.

    ``reused``: the caller keeps this statement and runs it again (so compiling it once pays off).
    """
    prepared = _prepared(conn, statement, columns) if reused else None
    if prepared is None:
        return list(conn.execute(statement, dict(values)).all())
    rows, description, _ = _run(conn, prepared, values, fetch_rows=True)
    return prepared.rows(rows, description)


def fetch_values(
    conn: Connection, statement: sa.Executable, values: Mapping[str, Any], columns: Sequence[sa.ColumnElement[Any]]
) -> list[Sequence[Any]]:
    """fetch() for a caller that reads the values only: each row as a sequence, without making Row objects
    (a lease write's changed keys and tokens)."""
    prepared = _prepared(conn, statement, columns)
    if prepared is None:
        return list(conn.execute(statement, dict(values)).all())
    rows, description, _ = _run(conn, prepared, values, fetch_rows=True)
    return prepared.values(rows, description)


def fetch_text(conn: Connection, sql: str, parameters: Sequence[Any]) -> list[Sequence[Any]]:
    """The rows of ``sql``, a statement in the driver's own paramstyle with ``parameters`` by position, run
    in the transaction ``conn`` has open: the rows of a batch INSERT, without SQLAlchemy's result (which
    took a third of the INSERT's time on SQLite)."""
    if not conn.in_transaction() or watched(conn):
        return list(conn.exec_driver_sql(sql, tuple(parameters)).all())
    return _cursor_run(conn, sql, parameters, fetch_rows=True, describe=False)[0]


def execute(conn: Connection, statement: sa.Executable, values: Mapping[str, Any], *, reused: bool = True) -> int:
    """Run ``statement`` (no rows returned) in the transaction ``conn`` has open; the rows it changed."""
    prepared = _prepared(conn, statement, ()) if reused else None
    if prepared is None:
        return int(getattr(conn.execute(statement, dict(values)), "rowcount", -1))
    return _run(conn, prepared, values, fetch_rows=False)[2]


def _prepared(
    conn: Connection, statement: sa.Executable, columns: Sequence[sa.ColumnElement[Any]]
) -> DriverStatement | None:
    # Outside a transaction SQLAlchemy would not know of the one the driver begins: run it the usual way.
    if not conn.in_transaction() or watched(conn):
        return None
    prepared = _STATEMENTS.get(statement, conn.dialect, columns)
    return prepared if prepared.usable else None


def _run(
    conn: Connection, prepared: DriverStatement, values: Mapping[str, Any], *, fetch_rows: bool
) -> tuple[list[Any], Any, int]:
    """Rows (if asked for), their description and the count of rows changed."""
    return _cursor_run(conn, prepared.sql, prepared.parameters(values), fetch_rows=fetch_rows,
                       describe=prepared.describe)  # fmt: skip


def _cursor_run(
    conn: Connection,
    sql: str,
    parameters: Any,
    *,
    fetch_rows: bool,
    describe: bool,
    meanwhile: Callable[[], None] | None = None,
) -> tuple[list[Any], Any, int]:
    dialect = conn.dialect
    pooled = conn.connection
    dbapi_connection: Any = pooled.dbapi_connection
    kept = is_psycopg(dbapi_connection)
    info = pooled.info
    cursor = kept_cursor(info, dbapi_connection) if kept else dbapi_connection.cursor()
    keep = False
    try:
        with nullcontext() if meanwhile is None else dbapi_connection.pipeline():
            cursor.execute(sql, parameters)
            if meanwhile is not None:
                sent_whole(dbapi_connection)
                meanwhile()
            rows = list(cursor.fetchall()) if fetch_rows else []
            # The description only the first time: psycopg builds it anew on every read.
            described = cursor.description if describe else None
        keep = kept and meanwhile is None and small_statement(parameters, rows)
        return rows, described, cursor.rowcount
    except dialect.loaded_dbapi.Error as error:
        if kept:  # before an invalidation gives the pool entry back
            forget_kept_cursor(info, cursor)
        # As SQLAlchemy does: a connection the server dropped is invalidated, and the error wrapped.
        lost = dialect.is_disconnect(error, dbapi_connection, cursor)
        if lost:
            conn.invalidate(error)
        raise sa.exc.DBAPIError.instance(
            sql,
            parameters,
            error,
            dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=dialect,
        ) from error
    finally:
        if not keep:  # after a failure too: a fresh cursor next time, whatever state this one was left in
            if kept:
                forget_kept_cursor(info, cursor)
            with suppress(Exception):  # a cursor of a connection that just died may fail to close
                cursor.close()


def fetch_values_meanwhile(
    conn: Connection,
    statement: sa.Executable,
    values: Mapping[str, Any],
    columns: Sequence[sa.ColumnElement[Any]],
    meanwhile: Callable[[], None],
) -> list[Sequence[Any]]:
    """fetch_values(), calling ``meanwhile`` (Python work that does not use ``conn``) while the database runs
    the statement: psycopg sends it in pipeline mode and reads its rows once ``meanwhile`` returns, so that
    the server and Python work at once; elsewhere ``meanwhile`` runs first."""
    prepared = _prepared(conn, statement, columns)
    if prepared is None or not pipelines(conn.connection.dbapi_connection):
        meanwhile()
        return fetch_values(conn, statement, values, columns)
    rows, description, _ = _cursor_run(conn, prepared.sql, prepared.parameters(values), fetch_rows=True,
                                       describe=prepared.describe, meanwhile=meanwhile)  # fmt: skip
    return prepared.values(rows, description)
