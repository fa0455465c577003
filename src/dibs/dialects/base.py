"""What every dialect module provides, and the pieces of claim SQL that are the same everywhere.

A *backend* knows one database family: how to open a claim transaction, what time it is on the
database, which native claim strategy it has for a given server version, and how to translate the
driver errors dibs understands. A *strategy* turns one :class:`ClaimRequest` into rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine, Row
from sqlalchemy.sql import ColumnElement, operators

Then = Callable[[Connection, list[Row[Any]]], object]


@dataclass(frozen=True, kw_only=True)
class ClaimRequest:
    """One validated claim: which rows, how many, and what to do to them."""

    table: sa.Table
    where: ColumnElement[bool] | None
    values: Mapping[str, Any]
    limit: int
    order_by: tuple[ColumnElement[Any], ...]
    delete: bool
    then: Then | None

    @property
    def key_columns(self) -> tuple[sa.Column[Any], ...]:
        return tuple(self.table.primary_key.columns)

    def candidates(self, *columns: ColumnElement[Any]) -> sa.Select[Any]:
        """SELECT the given columns of the eligible rows, in claim order, at most ``limit`` of them."""
        query = sa.select(*columns)
        if self.where is not None:
            query = query.where(self.where)
        return query.order_by(*self.order_by).limit(self.limit)


class ClaimStrategy(Protocol):
    """Claims the rows one request names, inside one transaction it opens and commits itself."""

    name: str

    def claim(self, conn: Connection, request: ClaimRequest) -> list[Row[Any]]: ...


class Backend(Protocol):
    """What dibs needs to know about one database family."""

    name: str

    def native_strategy(self, dialect: Dialect) -> ClaimStrategy:
        """The fastest correct strategy this server supports (warns when it has to fall back)."""
        ...

    def begin(self, conn: Connection) -> None:
        """Run whatever must precede the first statement of a claim transaction."""
        ...

    def now(self) -> ColumnElement[datetime]:
        """The current time, as the database sees it, as a SQL expression."""
        ...

    def after(self, seconds: float) -> ColumnElement[datetime]:
        """The database's current time plus ``seconds``, as a SQL expression."""
        ...

    def translate(self, exc: sa.exc.DBAPIError) -> Exception | None:
        """A dibs error for a driver error dibs understands, else None."""
        ...

    def engine_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options for an engine dibs creates, with this backend's defaults added."""
        ...

    def configure(self, engine: Engine) -> None:
        """Tune an engine dibs creates (never one the caller built) for many concurrent claimers."""
        ...


def key_of(row: Row[Any], key_columns: Sequence[sa.Column[Any]]) -> tuple[Any, ...]:
    """The primary key of a row as a tuple."""
    mapping = row._mapping
    return tuple(mapping[column.name] for column in key_columns)


def key_filter(key_columns: Sequence[sa.Column[Any]], keys: Sequence[tuple[Any, ...]]) -> ColumnElement[bool]:
    """``pk IN (...)`` for single-column keys, ``(a, b) IN (...)`` for composite ones."""
    if len(key_columns) == 1:
        return key_columns[0].in_([key[0] for key in keys])
    return sa.tuple_(*key_columns).in_(keys)


def key_equals(key_columns: Sequence[sa.Column[Any]], key: tuple[Any, ...]) -> ColumnElement[bool]:
    return sa.and_(*(column == value for column, value in zip(key_columns, key, strict=True)))


def in_key_order(
    rows: Sequence[Row[Any]], keys: Sequence[tuple[Any, ...]], key_columns: Sequence[sa.Column[Any]]
) -> list[Row[Any]]:
    """Rows sorted by where their key stands in ``keys`` (the order the database picked them in)."""
    position = {key: index for index, key in enumerate(keys)}
    return sorted(rows, key=lambda row: position[key_of(row, key_columns)])


_ORDER_MODIFIERS: dict[Any, Callable[[ColumnElement[Any]], ColumnElement[Any]]] = {
    operators.asc_op: sa.asc,
    operators.desc_op: sa.desc,
    operators.nulls_first_op: sa.nulls_first,
    operators.nulls_last_op: sa.nulls_last,
}


def split_order(
    clause: ColumnElement[Any],
) -> tuple[ColumnElement[Any], Callable[[ColumnElement[Any]], ColumnElement[Any]]]:
    """Split ``expr.desc().nulls_last()`` into ``expr`` and a function that puts the same ordering on another
    expression, so a statement can order its outer query by a value its inner query computed."""
    wrappers: list[Callable[[ColumnElement[Any]], ColumnElement[Any]]] = []
    while isinstance(clause, sa.UnaryExpression) and clause.modifier in _ORDER_MODIFIERS:
        wrappers.append(_ORDER_MODIFIERS[clause.modifier])
        clause = clause.element

    def reorder(expression: ColumnElement[Any]) -> ColumnElement[Any]:
        for wrap in reversed(wrappers):
            expression = wrap(expression)
        return expression

    return clause, reorder


def run_then(conn: Connection, request: ClaimRequest, rows: list[Row[Any]]) -> list[Row[Any]]:
    """Run the request's ``then`` callback, in the claim's transaction, when something was claimed."""
    if request.then is not None and rows:
        request.then(conn, rows)
    return rows
