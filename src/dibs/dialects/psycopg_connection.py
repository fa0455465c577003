"""What dibs does with psycopg's own connection beyond running a statement on a cursor: one statement in
autocommit, a pipelined statement sent whole, and the cursor kept for a connection's small statements."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection

#: Where a psycopg connection's cursor is kept, with the thread it serves: its pool entry's info, which
#: SQLAlchemy keeps while the driver connection lives and clears when it is replaced.
_KEPT_CURSOR = "dibs_cursor"
#: A kept cursor holds its last statement's parameters and rows until its next one: it is kept only after
#: a statement this small (in rows, and in characters and items of its parameters), where a new cursor's
#: cost counts.
_KEPT_ROWS = 100
_KEPT_SIZE = 65_536


def kept_cursor(info: dict[Any, Any], dbapi_connection: Any) -> Any:
    """The cursor kept with a psycopg connection for this thread, made the first time: a new psycopg cursor
    sets up its adapters and loaders anew, a third of the Python time of a one-row INSERT. The thread
    matters where a pool shares one connection between threads (StaticPool)."""
    thread, cursor = info.get(_KEPT_CURSOR, (None, None))
    if thread != threading.get_ident() or cursor.closed or cursor.connection is not dbapi_connection:
        cursor = dbapi_connection.cursor()
        info[_KEPT_CURSOR] = (threading.get_ident(), cursor)
    return cursor


def forget_kept_cursor(info: dict[Any, Any], cursor: Any) -> None:
    """Let the next statement make a cursor of its own if ``cursor`` is the one kept (a failure left it in
    no known state)."""
    if info.get(_KEPT_CURSOR, (None, None))[1] is cursor:
        del info[_KEPT_CURSOR]


def small_statement(parameters: Any, rows: list[Any]) -> bool:
    """Whether a statement's parameters and rows are small enough for its cursor to keep them."""
    values = parameters.values() if isinstance(parameters, Mapping) else parameters
    size = sum(len(value) for value in values if isinstance(value, (str, bytes, list, tuple)))
    return len(rows) <= _KEPT_ROWS and size <= _KEPT_SIZE


def is_psycopg(dbapi_connection: Any) -> bool:
    """Whether the driver connection is psycopg's own (not an asyncio adapter)."""
    if not type(dbapi_connection).__module__.startswith("psycopg"):
        return False
    import psycopg

    return isinstance(dbapi_connection, psycopg.Connection)


def pipelines(dbapi_connection: Any) -> bool:
    """Whether the driver connection is psycopg's own and libpq has pipeline mode."""
    if not is_psycopg(dbapi_connection):
        return False
    import psycopg

    return psycopg.Pipeline.is_supported()


def sent_whole(dbapi_connection: Any) -> None:
    """Send what psycopg queued in pipeline mode, all of it: it sends the rest of a long statement only when
    the result is read, and the server cannot start on a statement it has not received."""
    from psycopg import generators

    dbapi_connection.wait(generators.send(dbapi_connection.pgconn))


@contextmanager
def autocommit(conn: Connection, *, owned: bool) -> Iterator[None]:
    """Run the one statement of the block, a claim or a lease write that is atomic on its own, without BEGIN
    and COMMIT (one round trip instead of three) on ``conn``, which has no transaction open.

    With psycopg the driver connection is switched to autocommit for the block and back after it: SQLAlchemy
    sees no transaction before the block and none after, as if it had run one, so this holds on a caller's
    connection too. Setting SQLAlchemy's AUTOCOMMIT isolation level instead goes through its connection
    characteristics (set on checkout, reset on return), which cost as much as the statement's own Python
    time; it is still what other drivers get, on connections dibs checked out itself (``owned``). A
    caller's connection with another driver runs the statement in a transaction of its own.
    """
    dialect = conn.dialect
    if conn.in_transaction() or dialect.driver != "psycopg" or dialect.is_async:
        if owned and not conn.in_transaction():
            conn.execution_options(isolation_level="AUTOCOMMIT")
        yield
        return
    dbapi_connection: Any = conn.connection.dbapi_connection
    if dbapi_connection.autocommit:  # the caller's AUTOCOMMIT isolation level: nothing to switch
        yield
        return
    dbapi_connection.autocommit = True
    try:
        yield
    finally:
        if not conn.invalidated:
            try:
                dbapi_connection.autocommit = False
            except Exception:
                # Never hand the pool a connection that would commit every statement of a later transaction.
                conn.invalidate()
