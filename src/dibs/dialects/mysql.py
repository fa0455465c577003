"""MySQL 8 and MariaDB 10.6+: a locking read with SKIP LOCKED and the update, in one transaction.

Neither has UPDATE ... RETURNING, so a claim is three statements: ``SELECT pk ... FOR UPDATE SKIP
LOCKED``, ``UPDATE ... WHERE pk IN (...)`` and a read-back. They must share one explicit
transaction: a locking read in autocommit mode drops its locks as soon as it returns, and the update
that follows would then race. READ COMMITTED keeps InnoDB from taking gap locks on the scanned index
range, which would otherwise block every concurrent enqueue into that range.

Times come from ``UTC_TIMESTAMP(6)``, the server's clock in UTC with microseconds.

Names and keys (:class:`~dibs.dialects.values.Name` columns) get a binary collation without trailing-space
padding: the servers' default collations fold case and accents, and their ``utf8mb4_bin`` still takes
``'k'`` and ``'k '`` for equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.pool import PoolResetState
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql import ColumnElement

from dibs.dialects.backend import BackendDefaults
from dibs.dialects.keys import PICKED, in_key_order, key_of, key_values, keys_in
from dibs.dialects.portable import PORTABLE_INSTEAD, PortableClaim
from dibs.dialects.request import ClaimRequest, ClaimStrategy, StatementCache, run_then
from dibs.dialects.transactions import explicit_transaction
from dibs.dialects.values import Name
from dibs.dialects.versions import server_version, warn_fallback

MYSQL_SKIP_LOCKED_SINCE = (8, 0, 1)
MARIADB_SKIP_LOCKED_SINCE = (10, 6)
#: The binary collations that compare trailing spaces too, and the first versions that have them. Older
#: servers get ``utf8mb4_bin``, where only trailing spaces are ignored.
MARIADB_NO_PAD = ("utf8mb4_nopad_bin", (10, 2, 2))
MYSQL_NO_PAD = ("utf8mb4_0900_bin", (8, 0, 17))
PAD_SPACE_BIN = "utf8mb4_bin"


def exact_collation(dialect: Dialect) -> str:
    """The collation that compares names byte for byte on this server (the newest kind before the first
    connection, when the version is not known yet)."""
    collation, since = MARIADB_NO_PAD if getattr(dialect, "is_mariadb", False) else MYSQL_NO_PAD
    version = server_version(dialect)
    return collation if not version or version >= since else PAD_SPACE_BIN


@compiles(Name, "mysql")
@compiles(Name, "mariadb")
def _name_ddl(name: Name, compiler: Any, **_: Any) -> str:
    return f"VARCHAR({name.length}) CHARACTER SET utf8mb4 COLLATE {exact_collation(compiler.dialect)}"


class _Statements(NamedTuple):
    pick: sa.Select[Any]  # locks the picked rows (whole rows, when claiming by delete)
    change: sa.Update | sa.Delete  # of the picked keys
    read: sa.Select[Any]  # the picked rows after the update


class MySQLClaim:
    """Three statements in one READ COMMITTED transaction."""

    name = "mysql"
    single_statement = False

    def __init__(self, backend: MySQL) -> None:
        self.backend = backend
        self.statements = StatementCache(self.build)

    def build(self, request: ClaimRequest) -> _Statements:
        table = request.table
        keys = request.key_columns
        chosen = keys_in(keys)
        # Claiming by delete returns the rows as they were: the locking read fetches them whole.
        pick = request.candidates(*(request.returned if request.delete else keys)).with_for_update(skip_locked=True)
        change: sa.Update | sa.Delete = (
            sa.delete(table).where(chosen)
            if request.delete
            else sa.update(table).where(chosen).values(dict(request.values))
        )
        return _Statements(pick, change, sa.select(*request.returned).where(chosen))

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        keys = request.key_columns
        statements = self.statements(request)
        with self.backend.transaction(conn):
            parameters = request.execution()
            picked_rows = list(conn.execute(statements.pick, parameters))
            if not picked_rows:
                return []
            positions = request.key_positions
            picked = [key_of(row, positions) if request.delete else tuple(row) for row in picked_rows]
            parameters[PICKED] = key_values(keys, picked)
            conn.execute(statements.change, parameters)
            if request.delete:
                return run_then(conn, request, picked_rows)
            rows = list(conn.execute(statements.read, parameters))
            return run_then(conn, request, in_key_order(rows, picked, positions))


#: Set on a pooled connection's record when dibs gives it back with its transaction over (see MySQL.configure).
_RELEASED = "dibs_released"


def _reset_unless_released(dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
    """The pool's reset on return, as SQLAlchemy's rollback-on-return does it, left out for a connection
    dibs released (its transaction committed or rolled back, nothing run since)."""
    released = record.info.pop(_RELEASED, False) if record is not None else False
    if released or state.transaction_was_reset or state.terminate_only or not state.asyncio_safe:
        return
    dbapi_connection.rollback()


class MySQL(BackendDefaults):
    """MySQL 8.0.1+ and MariaDB 10.6+ natively; older servers fall back to the portable strategy."""

    name = "mysql"
    async_driver: str | None = "asyncmy"
    read_committed: str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
    atomic_statements = False

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        version = server_version(dialect)
        mariadb = bool(getattr(dialect, "is_mariadb", False))
        needed = MARIADB_SKIP_LOCKED_SINCE if mariadb else MYSQL_SKIP_LOCKED_SINCE
        if version and version < needed:
            warn_fallback("MariaDB" if mariadb else "MySQL", version, "SKIP LOCKED", needed, PORTABLE_INSTEAD)
            return PortableClaim(self)
        return MySQLClaim(self)

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        # The pool's own reset is replaced by dibs's (see configure), unless the caller chose one.
        if "pool_reset_on_return" in options:
            return options
        return {**options, "pool_reset_on_return": None}

    def configure(self, engine: Engine, options: Mapping[str, Any]) -> None:
        """Roll back a connection coming back to the pool unless dibs just ended its transaction: the
        drivers send ROLLBACK whether or not a transaction is open, which after dibs's COMMIT is a third
        round trip for an enqueue that needs two. Left alone when the caller chose the pool's reset."""
        if "pool_reset_on_return" in options:
            return
        event.listen(engine.pool, "reset", _reset_unless_released)

    def released(self, conn: Connection) -> None:
        if not conn.in_transaction() and not conn.invalidated:
            conn.connection.info[_RELEASED] = True

    def transaction(self, conn: Connection) -> AbstractContextManager[None]:
        # SET TRANSACTION applies to the next transaction only, so the caller's session keeps its own
        # isolation level for everything else it does.
        level = self.read_committed
        return explicit_transaction(conn, [level, "START TRANSACTION"], [level])

    def now(self) -> ColumnElement[datetime]:
        return sa.func.utc_timestamp(6, type_=sa.DateTime())

    def after(self, name: str) -> ColumnElement[datetime]:
        return sa.func.timestampadd(
            sa.literal_column("MICROSECOND"),
            sa.bindparam(name, type_=sa.BigInteger),
            sa.func.utc_timestamp(6),
            type_=sa.DateTime(),
        )

    def after_value(self, seconds: float) -> Any:
        return round(seconds * 1_000_000)

    def elapsed(self, since: ColumnElement[Any], seconds: ColumnElement[Any]) -> ColumnElement[bool]:
        return since <= sa.func.timestampadd(
            sa.literal_column("MICROSECOND"), -sa.func.round(seconds * 1_000_000), sa.func.utc_timestamp(6)
        )

    def make_names_exact(
        self, conn: Connection, table: sa.Table, columns: Sequence[sa.Column[Any]] | None = None
    ) -> None:
        wanted = exact_collation(conn.dialect)
        collations = sa.text(
            "SELECT column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = :table"
        )
        found: dict[str, str | None] = dict(conn.execute(collations, {"table": table.name}).all())
        # A column the table does not have yet is left to the step that adds it; a recording reads no rows
        # and so changes every column it is given.
        stale = [
            column
            for column in (table.columns if columns is None else columns)
            if isinstance(column.type, Name)
            and found.get(column.name) != wanted
            and (not found or column.name in found)
        ]
        if not stale:
            return
        # One statement: the server rebuilds the table (and its indexes) once.
        changes = ", ".join(f"MODIFY {CreateColumn(column).compile(dialect=conn.dialect)}" for column in stale)
        conn.exec_driver_sql(f"ALTER TABLE {conn.dialect.identifier_preparer.format_table(table)} {changes}")

    def insert_new(self, table: sa.Table, unique: sa.Column[Any]) -> sa.Insert:
        # IGNORE turns the duplicate-key error into a warning and the row is left out. It would do the
        # same to other errors (a value too long, a NULL): dibs validates its values before it inserts.
        return sa.insert(table).prefix_with("IGNORE")
