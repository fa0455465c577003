"""Primary keys in claim and lease statements: key lists, key tests, and the fenced (key, token) guard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.sql import ColumnElement

#: The parameter holding the keys a claim picked.
PICKED = "dibs_picked"


def positions_of(columns: Sequence[sa.Column[Any]], wanted: Sequence[sa.Column[Any]]) -> tuple[int, ...]:
    """Where each of ``wanted`` stands among ``columns``."""
    names = [column.name for column in columns]
    return tuple(names.index(column.name) for column in wanted)


def key_of(row: Row[Any], positions: Sequence[int]) -> tuple[Any, ...]:
    """The primary key of a whole row of the table, as a tuple, from the key's positions."""
    return tuple(row[position] for position in positions)


def keys_in(key_columns: Sequence[sa.Column[Any]], name: str = PICKED) -> ColumnElement[bool]:
    """``pk IN (:name)`` (``(a, b) IN (:name)`` for composite keys), the list given at execution."""
    target = key_columns[0] if len(key_columns) == 1 else sa.tuple_(*key_columns)
    return target.in_(sa.bindparam(name, expanding=True))


def key_values(key_columns: Sequence[sa.Column[Any]], keys: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The value of a :func:`keys_in` parameter: bare values for a single-column key, tuples otherwise."""
    return [key[0] for key in keys] if len(key_columns) == 1 else list(keys)


def key_equals(key_columns: Sequence[sa.Column[Any]]) -> ColumnElement[bool]:
    """``pk = :dibs_key_0 AND ...``, the key given at execution by :func:`key_parameters`."""
    return sa.and_(*(column == sa.bindparam(f"dibs_key_{index}") for index, column in enumerate(key_columns)))


def key_parameters(key: tuple[Any, ...]) -> dict[str, Any]:
    return {f"dibs_key_{index}": value for index, value in enumerate(key)}


def fenced_in_list(key_columns: Sequence[sa.Column[Any]], token: sa.Column[Any]) -> ColumnElement[bool]:
    """``pk IN (...) AND (pk, token) IN (...)``: the plain key test lets the planner use the primary key."""
    return sa.and_(
        keys_in(key_columns, "dibs_fenced_keys"),
        sa.tuple_(*key_columns, token).in_(sa.bindparam("dibs_fenced_pairs", expanding=True)),
    )


def fenced_in_list_values(key_columns: Sequence[sa.Column[Any]], pairs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    key_count = len(key_columns)
    keys = [pair[0] if key_count == 1 else pair[:key_count] for pair in pairs]
    return {"dibs_fenced_keys": keys, "dibs_fenced_pairs": list(pairs)}


def in_key_order(rows: Sequence[Row[Any]], keys: Sequence[tuple[Any, ...]], positions: Sequence[int]) -> list[Row[Any]]:
    """Whole rows sorted by where their key stands in ``keys`` (the order the database picked them in)."""
    order = {key: index for index, key in enumerate(keys)}
    if len(positions) == 1:
        (at,) = positions
        return sorted(rows, key=lambda row: order[(row[at],)])
    return sorted(rows, key=lambda row: order[key_of(row, positions)])
