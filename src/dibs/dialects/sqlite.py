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

import warnings
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement

from dibs._errors import Busy, FallbackWarning
from dibs.dialects.base import ClaimRequest, ClaimStrategy, in_key_order, key_filter, run_then
from dibs.dialects.portable import app_now

RETURNING_SINCE = (3, 35)
BUSY_TIMEOUT_SECONDS = 10.0
_BUSY_CODES = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED (primary result codes)


class SQLiteClaim:
    """BEGIN IMMEDIATE; read the picked keys; UPDATE ... RETURNING (or UPDATE, then read back); COMMIT."""

    def __init__(self, backend: SQLite, *, returning: bool) -> None:
        self.backend = backend
        self.returning = returning
        self.name = "sqlite" if returning else "sqlite-legacy"

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        table = request.table
        keys = request.key_columns
        with conn.begin():
            self.backend.begin(conn)
            picked = [tuple(row) for row in conn.execute(request.candidates(*keys))]
            if not picked:
                return []
            chosen = key_filter(keys, picked)
            if request.delete:
                if self.returning:
                    rows = list(conn.execute(sa.delete(table).where(chosen).returning(*table.columns)))
                else:
                    rows = list(conn.execute(sa.select(table).where(chosen)))
                    conn.execute(sa.delete(table).where(chosen))
            else:
                change = sa.update(table).where(chosen).values(dict(request.values))
                if self.returning:
                    rows = list(conn.execute(change.returning(*table.columns)))
                else:
                    conn.execute(change)
                    rows = list(conn.execute(sa.select(table).where(chosen)))
            return run_then(conn, request, in_key_order(rows, picked, keys))


def _driver_in_transaction(dbapi_connection: Any) -> bool:
    """Whether the sqlite3 connection (possibly behind aiosqlite's adapter) already has a transaction."""
    for candidate in (dbapi_connection, getattr(dbapi_connection, "_connection", None)):
        state = getattr(candidate, "in_transaction", None)
        if isinstance(state, bool):
            return state
    return False


class SQLite:
    """SQLite 3.35 and later with RETURNING; older versions read the claimed rows back."""

    name = "sqlite"

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        version = tuple(dialect.server_version_info or ())
        if version and version < RETURNING_SINCE:
            warnings.warn(
                f"SQLite {'.'.join(map(str, version))} has no RETURNING (3.35 and later do); dibs reads "
                "claimed rows back in the same transaction instead, which is correct but slower.",
                FallbackWarning,
                stacklevel=4,
            )
            return SQLiteClaim(self, returning=False)
        return SQLiteClaim(self, returning=True)

    def begin(self, conn: Connection) -> None:
        # A transaction the driver already opened (Python 3.12's autocommit=False, or an engine that
        # emits its own BEGIN) is deferred; the claim is still correct there because SQLite refuses a
        # write on a stale read snapshot, but it cannot wait on the busy handler.
        if not _driver_in_transaction(conn.connection.dbapi_connection):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    def now(self) -> ColumnElement[datetime]:
        return sa.literal(app_now(), sa.DateTime())

    def after(self, seconds: float) -> ColumnElement[datetime]:
        return sa.literal(app_now() + timedelta(seconds=seconds), sa.DateTime())

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

    def configure(self, engine: Engine) -> None:
        """WAL (readers never block the writer) and fsync at checkpoints only."""

        @event.listens_for(engine, "connect")
        def _tune(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
            finally:
                cursor.close()
