"""INSERTs that give back what they inserted, in as few round trips as the driver allows.

Whether an INSERT can return its rows depends on the driver as well as the database (MariaDB returns
them, MySQL does not; a driver may return the rows of an executemany in order, or not), so the caller
builds the statement for the way the rows come back and the backend picks the way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

#: How an INSERT returns its rows: ``"rows"`` (RETURNING, for one row), ``"sorted rows"`` (RETURNING for many
#: rows at once, in the order they were given) or ``"none"`` (no RETURNING).
Returning = Literal["rows", "sorted rows", "none"]
#: Builds the INSERT for a way of returning its rows (the caller may keep each one it built).
Build = Callable[[Returning], sa.Insert]


class Inserted(NamedTuple):
    """What :func:`insert_rows` inserted: the rows the INSERT returned, or, where the driver could not return
    them, the ids it made, in the order of the rows given (one of the two lists is empty)."""

    rows: list[Row[Any]]
    ids: list[int]


def insert_rows(conn: Connection, build: Build, rows: Sequence[Mapping[str, Any]]) -> Inserted:
    """Insert ``rows`` on ``conn``, in its transaction: in one round trip where the driver returns the rows
    (for one row, or for many in order), else one INSERT per row, giving back the id each made."""
    dialect = conn.dialect
    if len(rows) == 1 and dialect.insert_returning:
        return Inserted([conn.execute(build("rows"), rows[0]).one()], [])
    if dialect.insert_returning and dialect.insert_executemany_returning_sort_by_parameter_order:
        return Inserted(list(conn.execute(build("sorted rows"), list(rows))), [])
    statement = build("none")
    return Inserted([], [_inserted_id(conn.execute(statement, values)) for values in rows])


def insert_one_new(conn: Connection, build: Build, values: Mapping[str, Any]) -> Row[Any] | int | None:
    """Run one INSERT that may leave its row out (see ``Backend.insert_new``): the row it returned, or the id
    it made where the driver returns no rows; None when the row was left out."""
    if conn.dialect.insert_returning:
        return conn.execute(build("rows"), values).first()
    result = conn.execute(build("none"), values)
    return int(result.lastrowid) if result.rowcount == 1 and result.lastrowid is not None else None


def _inserted_id(result: sa.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])
