"""Values in dibs's statements: exact names, constants written into the SQL text, and times.

A time is taken from the database's clock where the backend can do arithmetic with it (see
:mod:`dibs.dialects.backend`); the values here stand for the application's clock (UTC, without tzinfo) where
it cannot.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal


class Name(sa.String):
    """A string column that compares byte for byte, trailing spaces included, as dibs's names and keys must.

    PostgreSQL and SQLite compare strings so by default. A backend whose default collation folds case or
    accents, or pads with spaces, gives the column a binary collation when it renders its DDL, and brings
    columns of earlier tables to it in :meth:`Backend.make_names_exact`.
    """


class Inline(ColumnElement[Any]):
    """A value written into the statement's text, as the dialect writes literals, instead of bound: see
    :func:`inline`."""

    __visit_name__ = "dibs_inline"
    inherit_cache = True
    _traverse_internals = [  # noqa: RUF012 (SQLAlchemy declares it so)
        ("value", InternalTraversal.dp_plain_obj),
        ("type", InternalTraversal.dp_type),
    ]

    def __init__(self, value: Any, type_: Any) -> None:
        self.value = value
        self.type = sa.types.to_instance(type_)


@compiles(Inline)
def _render_inline(element: Inline, compiler: Any, **kw: Any) -> str:
    return str(compiler.render_literal_value(element.value, element.type))


def inline(value: str | int) -> ColumnElement[Any]:
    """``value`` in the statement's text: for the states and steps a statement always uses. The planner
    sees them (PostgreSQL keeps one generic plan that can use a partial index on a state; SQLite uses such
    an index only for a query that repeats its literal), and the driver has fewer parameters to send."""
    return Inline(value, sa.String() if isinstance(value, str) else sa.Integer())


class FromNow(NamedTuple):
    """A parameter value: the application's clock ``seconds`` from when the statement runs."""

    seconds: float


def app_now() -> datetime:
    """The application's clock in UTC without tzinfo: how SQLAlchemy stores DateTime where there is no
    database clock it can do arithmetic on."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def resolve_times(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters with each :class:`FromNow` turned into a time from the application's clock, now."""
    for name, value in parameters.items():
        if isinstance(value, FromNow):
            parameters[name] = app_now() + timedelta(seconds=value.seconds)
    return parameters
