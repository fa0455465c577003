"""Transactions dibs opens itself, including on a driver connection in autocommit mode."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy.engine import Connection, Engine


@contextmanager
def checked_out(engine: Engine, released: Callable[[Connection], None]) -> Iterator[Connection]:
    """A connection of dibs's own from ``engine``'s pool, given back when the block ends. ``released``
    (the backend's :meth:`~dibs.dialects.Backend.released`) hears of a block that ended without an error,
    its transaction over, just before the connection goes back."""
    with engine.connect() as conn:
        yield conn
        released(conn)


@contextmanager
def explicit_transaction(conn: Connection, begin: Sequence[str], prepare: Sequence[str] = ()) -> Iterator[None]:
    """A transaction on ``conn``: SQLAlchemy's, preceded by the ``prepare`` statements; or, when the driver is
    in autocommit mode and SQLAlchemy's transaction would send nothing, a real one opened with the ``begin``
    statements and ended with an explicit COMMIT or ROLLBACK (asyncio adapters do not end it otherwise)."""
    with conn.begin():
        if not driver_autocommit(conn.connection.dbapi_connection):
            for statement in prepare:
                conn.exec_driver_sql(statement)
            yield
            return
        for statement in begin:
            conn.exec_driver_sql(statement)
        try:
            yield
        except BaseException:
            # The original error is what the caller needs to see. A connection SQLAlchemy has already
            # invalidated (a cancelled task, a lost server) rolled back on its own, when it closed.
            if not conn.invalidated:
                with suppress(Exception):
                    conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")


def driver_autocommit(dbapi_connection: Any) -> bool:
    """Whether a driver connection (possibly behind SQLAlchemy's asyncio adapter) is in autocommit mode."""
    for candidate in (dbapi_connection, getattr(dbapi_connection, "_connection", None)):
        get_autocommit = getattr(candidate, "get_autocommit", None)
        state = get_autocommit() if callable(get_autocommit) else getattr(candidate, "autocommit", None)
        if isinstance(state, bool):
            return state
    return False
