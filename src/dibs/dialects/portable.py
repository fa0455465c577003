"""The portable claim, for any dialect SQLAlchemy speaks, and the fallback for servers too old for theirs.

It reads candidates, then tries each with a guarded ``UPDATE ... WHERE pk = :pk AND <criteria>``: a
rowcount of 1 means this caller won the row, 0 means somebody else changed it first. Every dialect
that is worth running a queue on re-checks the WHERE of an UPDATE against the latest committed row,
so two callers can never both see rowcount 1 for the same eligibility.

All the updates share one transaction so that ``then`` stays atomic with the claim. They lock rows in
primary-key order, whatever the claim order, so that two claimers never deadlock on each other.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Row
from sqlalchemy.sql import ColumnElement

from dibs.dialects.backend import BackendDefaults
from dibs.dialects.keys import PICKED, in_key_order, key_equals, key_of, key_parameters, key_values, keys_in
from dibs.dialects.request import ClaimRequest, ClaimStrategy, StatementCache, run_then
from dibs.dialects.transactions import explicit_transaction
from dibs.dialects.values import FromNow, app_now

if TYPE_CHECKING:
    from dibs.dialects.backend import Backend


class _Statements(NamedTuple):
    candidates: sa.Select[Any]
    eligible: sa.Select[Any]  # the rows whose keys are given that still match the criteria
    read: sa.Select[Any]  # the rows whose keys are given
    claim_one: sa.Update | sa.Delete  # the guarded write of one row


#: What the fallback warning says dibs does on a server without its native claim.
PORTABLE_INSTEAD = "falls back to the portable guarded-update claim"


class PortableClaim:
    """1 + N round trips: read candidates, then one guarded write per candidate."""

    name = "portable"
    single_statement = False

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.statements = StatementCache(self.build)

    def build(self, request: ClaimRequest) -> _Statements:
        table = request.table
        keys = request.key_columns
        guard = request.where if request.where is not None else sa.true()
        claim_one: sa.Update | sa.Delete = (
            sa.delete(table).where(key_equals(keys), guard)
            if request.delete
            else sa.update(table).where(key_equals(keys), guard).values(dict(request.values))
        )
        return _Statements(
            candidates=request.candidates(*keys),
            eligible=sa.select(*request.returned).where(keys_in(keys), guard),
            read=sa.select(*request.returned).where(keys_in(keys)),
            claim_one=claim_one,
        )

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]:
        keys = request.key_columns
        statements = self.statements(request)
        with self.backend.transaction(conn):
            parameters = request.execution()
            candidates = [tuple(row) for row in conn.execute(statements.candidates, parameters)]
            if not candidates:
                return []
            before: dict[tuple[Any, ...], Row[Any]] = {}
            if request.delete:
                # The rows come back as they were, so read them before they go. A row that changes
                # between this read and its delete, and still matches, comes back as first read.
                chosen = {**parameters, PICKED: key_values(keys, candidates)}
                before = {key_of(row, request.key_positions): row for row in conn.execute(statements.eligible, chosen)}
            won = {
                key
                for key in sorted(before if request.delete else candidates)
                if conn.execute(statements.claim_one, {**parameters, **key_parameters(key)}).rowcount == 1
            }
            won_in_order = [key for key in candidates if key in won]
            if request.delete:
                return run_then(conn, request, [before[key] for key in won_in_order])
            if not won:
                return []
            # This transaction holds the won rows' locks, so this read sees them exactly as stored.
            chosen = {**parameters, PICKED: key_values(keys, won_in_order)}
            rows = list(conn.execute(statements.read, chosen))
            return run_then(conn, request, in_key_order(rows, won_in_order, request.key_positions))


class AppClock:
    """Times from the application's clock, for databases whose clock dibs cannot do arithmetic with."""

    def now(self) -> ColumnElement[datetime]:
        return sa.bindparam("dibs_now", callable_=app_now, type_=sa.DateTime(), unique=True)

    def after(self, name: str) -> ColumnElement[datetime]:
        return sa.bindparam(name, type_=sa.DateTime())

    def after_value(self, seconds: float) -> Any:
        return FromNow(seconds)


class PortableBackend(AppClock, BackendDefaults):
    """A dialect dibs has no native strategy for: portable claim, application clock."""

    name = "generic"
    atomic_statements = False

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        return PortableClaim(self)

    def transaction(self, conn: Connection) -> AbstractContextManager[None]:
        return explicit_transaction(conn, ["BEGIN"])
