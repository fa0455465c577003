"""MySQL 8 and MariaDB 10.6+: a locking read with SKIP LOCKED and the update, in one transaction.

Neither has UPDATE ... RETURNING, so a claim is three statements: ``SELECT pk ... FOR UPDATE SKIP
LOCKED``, ``UPDATE ... WHERE pk IN (...)`` and a read-back. They must share one explicit
transaction: a locking read in autocommit mode drops its locks as soon as it returns, and the update
that follows would then race. READ COMMITTED keeps InnoDB from taking gap locks on the scanned index
range, which would otherwise block every concurrent enqueue into that range.

Times come from ``UTC_TIMESTAMP(6)``, the server's clock in UTC with microseconds.
"""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement

from dibs._errors import FallbackWarning
from dibs.dialects.base import ClaimRequest, ClaimStrategy, in_key_order, key_filter, key_of, run_then
from dibs.dialects.portable import PortableClaim

MYSQL_SKIP_LOCKED_SINCE = (8, 0, 1)
MARIADB_SKIP_LOCKED_SINCE = (10, 6)


class MySQLClaim:
    """Three statements in one READ COMMITTED transaction."""

    name = "mysql"

    def __init__(self, backend: MySQL) -> None:
        self.backend = backend

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        table = request.table
        keys = request.key_columns
        with conn.begin():
            self.backend.begin(conn)
            if request.delete:
                # The rows come back as they were: the locking read fetches them whole.
                rows = list(conn.execute(request.candidates(*table.columns).with_for_update(skip_locked=True)))
                if rows:
                    conn.execute(sa.delete(table).where(key_filter(keys, [key_of(row, keys) for row in rows])))
                return run_then(conn, request, rows)
            picked = [tuple(row) for row in conn.execute(request.candidates(*keys).with_for_update(skip_locked=True))]
            if not picked:
                return []
            chosen = key_filter(keys, picked)
            conn.execute(sa.update(table).where(chosen).values(dict(request.values)))
            rows = list(conn.execute(sa.select(table).where(chosen)))
            return run_then(conn, request, in_key_order(rows, picked, keys))


def _driver_autocommit(dbapi_connection: Any) -> bool:
    """Whether the driver connection (possibly behind SQLAlchemy's asyncio adapter) is in autocommit."""
    for candidate in (dbapi_connection, getattr(dbapi_connection, "_connection", None)):
        get_autocommit = getattr(candidate, "get_autocommit", None)
        if callable(get_autocommit):
            state = get_autocommit()
            if isinstance(state, bool):
                return state
    return False


class MySQL:
    """MySQL 8.0.1+ and MariaDB 10.6+ natively; older servers fall back to the portable strategy."""

    name = "mysql"

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        version = tuple(dialect.server_version_info or ())
        mariadb = bool(getattr(dialect, "is_mariadb", False))
        needed = MARIADB_SKIP_LOCKED_SINCE if mariadb else MYSQL_SKIP_LOCKED_SINCE
        if version and version < needed:
            product = "MariaDB" if mariadb else "MySQL"
            warnings.warn(
                f"{product} {'.'.join(map(str, version))} has no SKIP LOCKED "
                f"({product} {'.'.join(map(str, needed))} and later do); dibs falls back to the portable "
                "guarded-update claim, which is correct but slower.",
                FallbackWarning,
                stacklevel=4,
            )
            return PortableClaim(self)
        return MySQLClaim(self)

    def begin(self, conn: Connection) -> None:
        # SET TRANSACTION applies to the next transaction only, so the caller's session keeps its own
        # isolation level for everything else it does.
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        if _driver_autocommit(conn.connection.dbapi_connection):
            conn.exec_driver_sql("START TRANSACTION")

    def now(self) -> ColumnElement[datetime]:
        return sa.func.utc_timestamp(6, type_=sa.DateTime())

    def after(self, seconds: float) -> ColumnElement[datetime]:
        return sa.func.timestampadd(
            sa.literal_column("MICROSECOND"),
            sa.literal(round(seconds * 1_000_000), sa.BigInteger),
            sa.func.utc_timestamp(6),
            type_=sa.DateTime(),
        )

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        return None

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def configure(self, engine: Engine) -> None:
        return None
