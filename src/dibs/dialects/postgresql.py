"""PostgreSQL: one statement that locks, updates and returns, and the database clock.

The claim is::

    WITH dibs_picked AS MATERIALIZED (
        SELECT pk, <order expressions> FROM t WHERE <criteria> ORDER BY ... LIMIT n
        FOR UPDATE OF t SKIP LOCKED)
    UPDATE t SET ... FROM dibs_picked WHERE t.pk = dibs_picked.pk RETURNING t.*

The shorter ``UPDATE t ... WHERE pk IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`` is wrong: the
planner may rescan that sub-select (a semi-join), and each rescan skips the rows the previous one
locked, so a single call can claim more than n rows under contention. A MATERIALIZED CTE is evaluated
exactly once. Before PostgreSQL 12 every CTE was materialized and the keyword did not exist.

RETURNING comes back in no promised order, so when the caller asked for an order the statement
carries the pre-update order values through the CTE and sorts the returned rows by them in SQL, with
the database's own collation.
"""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement

from dibs._errors import FallbackWarning
from dibs.dialects.base import ClaimRequest, ClaimStrategy, run_then, split_order
from dibs.dialects.portable import PortableClaim

SKIP_LOCKED_SINCE = (9, 5)
MATERIALIZED_SINCE = (12,)


class PostgreSQLClaim:
    """One round trip: lock with SKIP LOCKED in a materialized CTE, update, return."""

    name = "postgresql"

    def __init__(self, *, materialized: bool = True) -> None:
        self.materialized = materialized

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        with conn.begin():
            rows = list(conn.execute(self.statement(request)).all())
            return run_then(conn, request, rows)

    def statement(self, request: ClaimRequest) -> sa.Executable:
        table = request.table
        keys = request.key_columns
        orderings = [split_order(clause) for clause in request.order_by]
        order_labels = [f"dibs_order_{index}" for index in range(len(orderings))]
        picked = (
            request.candidates(
                *keys,
                *(expression.label(label) for (expression, _), label in zip(orderings, order_labels, strict=True)),
            )
            .with_for_update(skip_locked=True, of=table)
            .cte("dibs_picked")
        )
        if self.materialized:
            picked = picked.prefix_with("MATERIALIZED")
        matched = sa.and_(*(key == picked.c[key.name] for key in keys))
        change: sa.Update | sa.Delete = (
            sa.delete(table).where(matched)
            if request.delete
            else sa.update(table).where(matched).values(dict(request.values))
        )
        if not orderings:
            return change.returning(*table.columns)
        claimed = change.returning(*table.columns, *(picked.c[label] for label in order_labels)).cte("dibs_claimed")
        claimed_columns = list(claimed.columns)
        return sa.select(*claimed_columns[: len(table.columns)]).order_by(
            *(reorder(claimed.c[label]) for (_, reorder), label in zip(orderings, order_labels, strict=True))
        )


class PostgreSQL:
    """PostgreSQL 9.5 and later natively; older servers fall back to the portable strategy."""

    name = "postgresql"

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        version = tuple(dialect.server_version_info or ())
        if version and version < SKIP_LOCKED_SINCE:
            warnings.warn(
                f"PostgreSQL {'.'.join(map(str, version))} has no SKIP LOCKED (9.5 and later do); "
                "dibs falls back to the portable guarded-update claim, which is correct but slower.",
                FallbackWarning,
                stacklevel=4,
            )
            return PortableClaim(self)
        return PostgreSQLClaim(materialized=not version or version >= MATERIALIZED_SINCE)

    def begin(self, conn: Connection) -> None:
        return None

    def now(self) -> ColumnElement[datetime]:
        return sa.func.now(type_=sa.DateTime(timezone=True))

    def after(self, seconds: float) -> ColumnElement[datetime]:
        return sa.func.now(type_=sa.DateTime(timezone=True)) + sa.func.make_interval(
            0, 0, 0, 0, 0, 0, sa.literal(float(seconds), sa.Float)
        )

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        return None

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def configure(self, engine: Engine) -> None:
        return None
