"""The portable claim, for any dialect SQLAlchemy speaks, and the fallback for servers too old for theirs.

It reads candidates, then tries each with a guarded ``UPDATE ... WHERE pk = :pk AND <criteria>``: a
rowcount of 1 means this caller won the row, 0 means somebody else changed it first. Every dialect
that is worth running a queue on re-checks the WHERE of an UPDATE against the latest committed row,
so two callers can never both see rowcount 1 for the same eligibility.

All the updates share one transaction so that ``then`` stays atomic with the claim. They lock rows in
primary-key order, whatever the claim order, so that two claimers never deadlock on each other.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement

from dibs.dialects.base import (
    ClaimRequest,
    ClaimStrategy,
    in_key_order,
    key_equals,
    key_filter,
    key_of,
    run_then,
)

if TYPE_CHECKING:
    from dibs.dialects.base import Backend


class PortableClaim:
    """1 + N round trips: read candidates, then one guarded write per candidate."""

    name = "portable"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        table = request.table
        keys = request.key_columns
        with conn.begin():
            self.backend.begin(conn)
            candidates = [tuple(row) for row in conn.execute(request.candidates(*keys))]
            if not candidates:
                return []
            guard = request.where if request.where is not None else sa.true()
            if request.delete:
                # The rows come back as they were, so read them before they go. A row that changes
                # between this read and its delete, and still matches, comes back as first read.
                before = {
                    key_of(row, keys): row
                    for row in conn.execute(sa.select(table).where(key_filter(keys, candidates), guard))
                }
                won = {
                    key
                    for key in sorted(before)
                    if conn.execute(sa.delete(table).where(key_equals(keys, key), guard)).rowcount == 1
                }
                return run_then(conn, request, [before[key] for key in candidates if key in won])
            won = {
                key
                for key in sorted(candidates)
                if conn.execute(
                    sa.update(table).where(key_equals(keys, key), guard).values(dict(request.values))
                ).rowcount
                == 1
            }
            if not won:
                return []
            # This transaction holds the won rows' locks, so this read sees them exactly as stored.
            won_in_order = [key for key in candidates if key in won]
            rows = list(conn.execute(sa.select(table).where(key_filter(keys, won_in_order))))
            return run_then(conn, request, in_key_order(rows, won_in_order, keys))


def app_now() -> datetime:
    """The application's clock in UTC without tzinfo: how SQLAlchemy stores DateTime where there is no
    database clock it can do arithmetic on."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Generic:
    """A dialect dibs has no native strategy for: portable claim, application clock."""

    name = "generic"

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        return PortableClaim(self)

    def begin(self, conn: Connection) -> None:
        return None

    def now(self) -> ColumnElement[datetime]:
        return sa.literal(app_now(), sa.DateTime())

    def after(self, seconds: float) -> ColumnElement[datetime]:
        return sa.literal(app_now() + timedelta(seconds=seconds), sa.DateTime())

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        return None

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def configure(self, engine: Engine) -> None:
        return None
