"""Claim order: splitting an ORDER BY term, and sorting claimed rows in Python as the database would."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.sql import ColumnElement, operators

if TYPE_CHECKING:
    from dibs.dialects.request import ClaimRequest


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


class SortKey(NamedTuple):
    """One ORDER BY term, applied in Python to claimed rows: see :func:`python_order`."""

    position: int  # of the value in a returned row
    descending: bool
    nulls_first: bool


def python_order(
    request: ClaimRequest, sortable: tuple[type, ...], *, text: bool, nulls_first_ascending: bool
) -> tuple[SortKey, ...] | None:
    """How to sort the claimed rows in Python exactly as the request's ORDER BY sorted them, or None where
    Python cannot be sure to: an order by anything but columns the claim returns and does not change, of
    ``sortable`` types (whose Python values sort as the database sorts them), or of text where ``text``
    says the database compares it by code point. ``nulls_first_ascending``: where the database puts NULLs
    in an ascending order that does not say (they go the other way in a descending one)."""
    returned = [column.name for column in request.returned]
    order = []
    for clause in request.order_by:
        element: Any = clause
        descending, nulls_first = False, None
        while isinstance(element, sa.UnaryExpression) and element.modifier is not None:
            if element.modifier is operators.desc_op:
                descending = True
            elif element.modifier in (operators.nulls_first_op, operators.nulls_last_op):
                nulls_first = element.modifier is operators.nulls_first_op
            elif element.modifier is not operators.asc_op:
                return None
            element = element.element
        if not isinstance(element, sa.Column) or element.table is not request.table:
            return None
        kind = _stored_type(element.type)
        plain_text = text and isinstance(kind, sa.String) and getattr(kind, "collation", None) is None
        if not (plain_text or isinstance(kind, sortable)) or type(kind) is sa.Interval:
            return None
        if element.name in request.values or element.name not in returned:
            return None
        if nulls_first is None:
            nulls_first = nulls_first_ascending != descending
        order.append(SortKey(returned.index(element.name), descending, nulls_first))
    return tuple(order)


def _stored_type(kind: sa.types.TypeEngine[Any]) -> sa.types.TypeEngine[Any]:
    """The type a column's values are read back as: a TypeDecorator that changes only what is bound
    (``dibs.Timestamp``) reads as the type it decorates; one that changes what is read is its own."""
    while isinstance(kind, sa.types.TypeDecorator):
        if type(kind).process_result_value is not sa.types.TypeDecorator.process_result_value:
            return kind
        kind = kind.impl_instance
    return kind


def in_order(rows: list[Row[Any]], order: Sequence[SortKey]) -> list[Row[Any]]:
    """Rows sorted by ``order``: one stable sort per key, the last key first."""
    for position, descending, nulls_first in reversed(order):
        present = sorted(
            (row for row in rows if row[position] is not None), key=itemgetter(position), reverse=descending
        )
        absent = [row for row in rows if row[position] is None]
        rows = absent + present if nulls_first else present + absent
    return rows
